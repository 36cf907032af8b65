package worker

import (
	"encoding/json"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// presence returns the heartbeat value this worker writes under its id in
// messages.BucketWorkers: a messages.WorkerPresence announcing its pool, so clients
// can tell that a pool has no live worker, and its warm pools.
func (w *Worker) presence() []byte {
	b, _ := json.Marshal(messages.WorkerPresence{
		Worker: w.cfg.ID, Pool: w.cfg.Pool, Concurrency: w.cfg.Concurrency, Time: time.Now().UTC(), Warm: w.warm.Status(),
	})
	return b
}

// WarmStatus returns the worker's warm pools, one per profile that keeps
// warm containers, by profile name (nil when none does).
func (w *Worker) WarmStatus() []messages.WarmPool { return w.warm.Status() }
