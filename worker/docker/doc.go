// Package docker implements worker.Runtime on a Docker Engine.
//
// Every container it creates is hardened the same way, whatever the spec
// says: a non-root numeric user, a read-only root filesystem, no
// capabilities, no-new-privileges, an init process (tini), memory without
// swap, a pids limit, typed bind mounts whose sources must exist, and no
// network unless the spec names one. The translation from a
// worker.ContainerSpec to the Engine API's configuration is one pure,
// table-tested function (containerConfig) that runs before any call to the
// daemon.
//
// A spec may name any OCI runtime the engine offers (runc, runsc for
// gVisor, crun, ...; Runtime.OCIRuntimes lists them for the worker's start
// check). Start refuses one the engine does not have, with worker.ErrPermanent, rather than let the
// run go ahead under a weaker runtime; the engine's list of runtimes comes
// from its Info and is cached for Config.OCIRuntimesTTL.
//
// Start follows the order that makes output and exit status impossible to
// lose: create, attach (stdout and stderr, no logs), register a "next-exit"
// wait, then start. Container.Wait returns only after the wait has fired and
// the attach stream has reached EOF, so the last bytes a process writes
// before exiting are always delivered.
//
// Adopt takes over a container another process started (a worker that
// died or stopped leaving its runs running): it reads the output the
// engine kept (a container's log, which ContainerSpec.OutputLogBytes
// bounds; log driver "none" without it) from the start, follows it and
// waits for the exit, with the same Container as Start's.
//
// The client negotiates the API version with the daemon (tested against
// Engine 20.10, API 1.41).
package docker
