package messages

import "time"

// WorkerTTL is how long a worker's key in BucketWorkers lives without a
// heartbeat (a worker refreshes it every WorkerTTL/3), and so how long
// after a worker dies its containers count as orphans: 15 seconds.
const WorkerTTL = 15 * time.Second

// StreamAdvisories is the stream capturing the MaxDeliver advisories of
// JETCREW_RUNS' consumers
// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.JETCREW_RUNS.>), so that a
// request whose last delivery died with its worker is moved to the
// dead-letter stream even when no worker was up when the server announced
// it. Only workers read it.
const StreamAdvisories = "JETCREW_ADVISORIES"

// ConsumerAdvisories is the durable consumer every worker shares on
// StreamAdvisories.
const ConsumerAdvisories = "dead-letterer"

// SubjectStopPrefix prefixes the internal request a worker sends to the
// worker holding a run to stop it, jetcrew.ctl.stop.<run_id>; only workers
// publish and subscribe to it (package roles grants it), and only the worker
// holding the run replies, with a CancelReply.
const SubjectStopPrefix = "jetcrew.ctl.stop"

// SubjectHoldPrefix prefixes the internal request a worker sends, on a
// redelivery of a running run's request, to ask whether any worker holds
// the run live, jetcrew.ctl.hold.<run_id>: the worker holding it (its
// starter, or a successor that adopted it) answers with an empty body, the
// others stay silent. Only workers publish and subscribe to it.
const SubjectHoldPrefix = "jetcrew.ctl.hold"

// BucketWorkers is the key-value bucket of live workers: one key per worker
// (its id), refreshed every few seconds and expiring a few heartbeats after
// the worker stops refreshing it. Its value is a WorkerPresence. Clients read
// it to tell whether any live worker serves a pool.
const BucketWorkers = "jetcrew-workers"

// WorkerPresence is the JSON value of a worker's key in BucketWorkers: the
// worker announcing itself and the pool it takes runs from.
type WorkerPresence struct {
	// Worker is the worker's id (the key).
	Worker string `json:"worker"`
	// Pool is the pool whose runs the worker takes.
	Pool string `json:"pool"`
	// Concurrency is the worker's number of run slots.
	Concurrency int `json:"concurrency"`
	// Time is when the worker last refreshed the key.
	Time time.Time `json:"time"`
	// Warm are the worker's warm pools, one per profile that keeps warm
	// containers (the profile's warm), by profile name; absent when none
	// does.
	Warm []WarmPool `json:"warm,omitempty"`
}

// WarmPool is one profile's warm pool on a worker: how many warm
// containers it keeps and how many are ready now.
type WarmPool struct {
	// Profile is the profile's name.
	Profile string `json:"profile"`
	// Workspace is set for the pool of containers made for runs with a
	// workspace (the profile's warm_workspace), each with its empty
	// workspace volume; unset for runs without one (warm).
	Workspace bool `json:"workspace,omitempty"`
	// Target is how many warm containers the worker keeps for it (the
	// profile's warm or warm_workspace, within the worker's --warm-max);
	// Ready how many
	// wait for a run now.
	Target int `json:"target"`
	Ready  int `json:"ready"`
	// Error is the engine's last refusal to create one while the pool
	// backs off; empty when the last creation succeeded.
	Error string `json:"error,omitempty"`
}
