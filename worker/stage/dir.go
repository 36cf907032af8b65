package stage

import "github.com/jetcrew/jetcrew/coordination"

// Dir is a run's directory on the worker's host, mounted read-only at
// /run/jetcrew (coordination.ContainerRunDir) and staged by the
// run-directory stage; later stages put their sockets and files in it. A
// directory of a finished run that held only mcp.json (and a coordination
// socket) goes back to a pool for a later run.
type Dir interface {
	// Path returns the directory's host path.
	Path() string
	// TakeSocket returns, once, the coordination socket a pooled directory
	// kept bound at coordination.SocketName; nil when it has none.
	TakeSocket() *coordination.Socket
	// KeepSocket hands back the socket still bound in the directory when
	// the coordination session closed cleanly, for the pool.
	KeepSocket(*coordination.Socket)
	// Taint says the caller put something in the directory that must not
	// outlive the run (a socket, a CA file), or could not close what it
	// put there cleanly: the directory is then removed, never pooled.
	Taint()
}
