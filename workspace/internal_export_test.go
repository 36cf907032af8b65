package workspace

import "time"

// SetMaxLooseObjects sets how many loose objects a snapshot's .git holds
// at most (maxLooseObjects) to n, and returns the function that restores
// it. A test using it must not run in parallel.
func SetMaxLooseObjects(n int) (restore func()) {
	old := maxLooseObjects
	maxLooseObjects = n
	return func() { maxLooseObjects = old }
}

// SetCaptureMemBytes sets how many bytes of object content a capture holds
// in memory (captureMemBytes) to n, and returns the function that restores
// it. A test using it must not run in parallel.
func SetCaptureMemBytes(n int64) (restore func()) {
	old := captureMemBytes
	captureMemBytes = n
	return func() { captureMemBytes = old }
}

// SetCaptureClock makes the commit of a run's uncommitted changes carry
// the time now returns, and returns the function that restores the clock.
// A test using it must not run in parallel.
func SetCaptureClock(now func() time.Time) (restore func()) {
	old := sinceEpoch
	sinceEpoch = now
	return func() { sinceEpoch = old }
}
