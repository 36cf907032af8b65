package dispatcher

import "errors"

// ErrNotProvisioned is wrapped by errors that say jetcrew's streams or
// bucket do not exist on the NATS server (or no stream answers for the
// subject). Workers create them when they start, so the fix is to start
// `jetcrew up` or a worker (`jetcrew worker`) against that server first.
var ErrNotProvisioned = errors.New("jetcrew's streams and bucket do not exist on this NATS server (start `jetcrew up` or `jetcrew worker` against it first)")

// ErrNoJetStream is wrapped by errors that say the NATS server, or the
// connection's account, has JetStream disabled. jetcrew needs JetStream
// (nats-server -js).
var ErrNoJetStream = errors.New("JetStream is not enabled on this NATS server or account (run nats-server with -js)")

// ErrRunNotFound is wrapped by the error Status returns for a run id the
// jetcrew-runs bucket holds no state for: the id is wrong, the run was
// published without a state and no worker has taken it yet, or its state
// was removed.
var ErrRunNotFound = errors.New("run not found")
