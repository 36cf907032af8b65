package coordination

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
)

// SocketMode is the permission of a run's socket file: any user may connect,
// so the run's non-root process can, whatever uid it runs as and whatever uid
// mapping the container runtime applies. What keeps everyone else out is the
// directory: the worker creates the socket in a per-run directory that only
// that run's container mounts, under a parent only the worker can enter
// (0700). See StageRunDir.
const SocketMode os.FileMode = 0o666

// maxSocketPath is the longest unix socket path Linux accepts, in bytes
// (sun_path is 108 bytes including the terminating NUL).
const maxSocketPath = 107

// listenUnix listens on path, replacing a stale socket, and opens the
// socket's mode to SocketMode. It returns the socket file's info, so that
// the session removes only the socket it created. The usual case, a path
// in a freshly staged directory, costs the bind alone: a path that exists
// or a directory that does not is looked at only when the bind fails.
func listenUnix(path string) (*net.UnixListener, os.FileInfo, error) {
	if len(path) > maxSocketPath {
		return nil, nil, fmt.Errorf("socket path %q is %d bytes; unix sockets allow at most %d", path, len(path), maxSocketPath)
	}
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	ln, err := net.ListenUnix("unix", addr)
	if err != nil {
		if perr := prepareSocketPath(path, err); perr != nil {
			return nil, nil, perr
		}
		if ln, err = net.ListenUnix("unix", addr); err != nil {
			return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
		}
	}
	// Detach removes the file itself, and only when it is still ours: a
	// later session for the same run may have replaced it.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		_ = ln.Close()
		_ = os.Remove(path)
		return nil, nil, err
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		return fail(fmt.Errorf("chmod socket: %w", err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("socket path: %w", err))
	}
	return ln, fi, nil
}

// prepareSocketPath makes path ready for a second bind after the first
// failed with bindErr: it removes a stale socket there (a dead worker's),
// refuses anything else there, and creates a missing directory.
func prepareSocketPath(path string, bindErr error) error {
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("socket path %s exists and is not a socket (%s)", path, fi.Mode().Type())
	case err == nil:
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove stale socket: %w", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("socket path: %w", err)
	case !errors.Is(bindErr, syscall.ENOENT):
		return fmt.Errorf("listen on %s: %w", path, bindErr)
	default:
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
	}
	return nil
}
