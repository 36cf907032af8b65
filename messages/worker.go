package messages

import "time"

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
}
