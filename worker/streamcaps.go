package worker

import "time"

// Default byte caps of the worker's streams (ProvisionConfig). Together with
// coordination.MaxStreamBytes (twice: JETCREW_COORD and its mirror
// JETCREW_COORD_VIEW) they fit well within `jetcrew up`'s default store
// limit (--store-max-mib 4096).
const (
	// DefaultRunsMaxBytes caps JETCREW_RUNS: 256 MiB of queued requests
	// (at most 256 KiB each).
	DefaultRunsMaxBytes = 256 << 20
	// DefaultEventsMaxBytes caps JETCREW_EVENTS: 1 GiB of events and
	// output, the oldest discarded first.
	DefaultEventsMaxBytes = 1 << 30
	// DefaultFailedMaxBytes caps JETCREW_FAILED: 256 MiB of dead letters,
	// the oldest discarded first.
	DefaultFailedMaxBytes = 256 << 20
)

// streamCap returns a stream's MaxBytes from a configured cap: 0 takes def,
// a negative value means no cap (-1 for the server).
func streamCap(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return -1
	}
	return v
}

// Defaults of JETCREW_RUNS' other limits (ProvisionConfig).
const (
	// DefaultRunsMaxAge is how long a request stays in JETCREW_RUNS,
	// taken or not: 7 days, room for a day's wait in the queue and five
	// attempts (max deliver) of the longest run a request may ask for
	// (messages.MaxTimeout, 24 hours).
	DefaultRunsMaxAge = 7 * 24 * time.Hour
	// DefaultRunsMaxPerPool is the most requests one pool holds in
	// JETCREW_RUNS: 512. At the largest request (messages.MaxRequestMsgBytes,
	// 260 KiB) that is 130 MiB, about half of the default DefaultRunsMaxBytes,
	// so one pool cannot fill the stream for the others.
	DefaultRunsMaxPerPool = 512
)
