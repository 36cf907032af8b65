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
var ErrRunNotFound = errors.New("run not found (a run just submitted has no state until a worker takes it)")

// ErrNoWorker is wrapped by the error Cancel returns when no worker is
// subscribed to cancel requests: no worker of any pool is running.
var ErrNoWorker = errors.New("no worker answered (is `jetcrew up` or a `jetcrew worker` running?)")

// ErrCancelFailed is wrapped by the error Cancel returns when the worker
// answered that it could not carry out the cancel; the reply's Message says
// why.
var ErrCancelFailed = errors.New("cancel failed")

// ErrNoDeadLetter is wrapped by the error LastDeadLetter and Replay return
// for a run id with no dead letter on JETCREW_FAILED: the run did not fail,
// its dead letter expired with the stream's max age, or the id is wrong.
var ErrNoDeadLetter = errors.New("no dead letter")

// ErrReplayRefused is wrapped by the error Replay returns when it will not
// publish the run again: the run already succeeded (a worker would refuse
// the request as a duplicate), or it is still queued or running. It is also
// wrapped by WatchReplay's error when a worker refused the replay.
var ErrReplayRefused = errors.New("replay refused")

// ErrDuplicateSubmit is wrapped by the error Submit returns, beside the run
// id, when the stream dropped the publish as a duplicate: the same run id
// was submitted within the duplicate window (2 minutes), and nothing new was
// queued. To run a failed run again use Replay; to run something else, a new
// id.
var ErrDuplicateSubmit = errors.New("duplicate submit: this run id was already submitted within the duplicate window; nothing new was published")

// ErrIDInUse is wrapped by the error Submit returns for a run id whose
// recorded state belongs to a request with another body: a used id names
// that request for good, and a different one is refused, not merged.
var ErrIDInUse = errors.New("run id already used by a different request")

// ErrQueueFull is wrapped by the error Submit and Replay return when
// JETCREW_RUNS refused to store the request for one of its limits: the
// pool's subject holds the most requests a pool may (the workers'
// --runs-max-per-pool, default 512), or the stream holds its most bytes
// (--runs-max-mib). Nothing was queued, and nothing queued was dropped:
// submit again once workers have taken some, or raise the limit.
var ErrQueueFull = errors.New("JETCREW_RUNS is full for this pool (its most requests per pool, or the stream's byte cap): nothing was queued; submit again once workers have taken some")
