package stage

import "io"

// Dir is a run's directory on the worker's host, mounted read-only at
// /run/jetcrew (messages.ContainerRunDir) and staged by the
// run-directory stage; later stages put their sockets and files in it. A
// directory of a finished run that held only mcp.json (and a coordination
// socket) goes back to a pool for a later run.
type Dir interface {
	// Path returns the directory's host path.
	Path() string
	// Kept returns, once, what a pooled directory kept open for the run
	// (the coordination stage's socket, bound at messages.SocketName);
	// nil when it kept nothing. The caller owns it: it closes what it
	// cannot use.
	Kept() io.Closer
	// Keep hands back what is still open in the directory when the run
	// ended cleanly (the coordination stage's socket), for the pool to
	// keep with it; the directory closes it when it is not pooled.
	Keep(io.Closer)
	// Taint says the caller put something in the directory that must not
	// outlive the run (a socket, a CA file), or could not close what it
	// put there cleanly: the directory is then removed, never pooled.
	Taint()
}
