package workspace

// SetMaxLooseObjects sets how many loose objects a snapshot's .git holds
// at most (maxLooseObjects) to n, and returns the function that restores
// it. A test using it must not run in parallel.
func SetMaxLooseObjects(n int) (restore func()) {
	old := maxLooseObjects
	maxLooseObjects = n
	return func() { maxLooseObjects = old }
}
