package worker

// Per-attempt resources: each delivery of a request (an attempt) has its own
// run directory, socket, container name and entry in the active set, and
// never cleans up another attempt's. A redelivery to the same worker while
// the earlier attempt still winds down (a NATS restart, an ack wait
// missed) supersedes it: the earlier one was fenced by the state's
// compare-and-set when the later one claimed the run.

// dir returns this attempt's run directory (Worker.runDir).
func (r *run) dir() string {
	return r.w.runDir(r.req.ID, r.meta.Sequence.Stream, int(r.meta.NumDelivered))
}

// newerThan reports whether r is a later delivery of the same request
// than o, or a later request for the same run id.
func (r *run) newerThan(o *run) bool {
	rs, os := r.meta.Sequence.Stream, o.meta.Sequence.Stream
	return rs > os || rs == os && r.meta.NumDelivered > o.meta.NumDelivered
}

// track records r, with its container c (nil while being created), as the
// run's active attempt on this worker, unless a newer attempt of the run is
// already tracked: cancels and stops go to the newest.
func (w *Worker) track(r *run, c Container) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.active[r.req.ID]; a != nil && a.run != r && a.run.newerThan(r) {
		return
	}
	w.active[r.req.ID] = &activeRun{run: r, container: c}
}

// untrack removes r from the active set, only if it is r that is tracked:
// an attempt winding down never untracks the one that superseded it.
func (w *Worker) untrack(r *run) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := w.active[r.req.ID]; a != nil && a.run == r {
		delete(w.active, r.req.ID)
	}
}
