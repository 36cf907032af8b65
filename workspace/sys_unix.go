package workspace

import "syscall"

// Open flags for files of untrusted trees: never follow a final symlink,
// never block on a FIFO.
const (
	syscallNoFollow = syscall.O_NOFOLLOW
	syscallNonBlock = syscall.O_NONBLOCK
)
