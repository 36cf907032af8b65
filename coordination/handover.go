package coordination

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// Socket is a run's socket left bound when its session closed
// (Session.CloseKeepSocket), for a later session of another run to serve
// in the same directory once the worker has moved it to that run's path
// (Host.ServeSocket). Binding a new socket, setting its mode and unlinking
// it when the run ends were the largest single cost of a coordination-on
// run in the noop benchmark (bench/); a directory the worker pools keeps
// its socket bound instead.
//
// A Socket is only ever served again after every connection waiting in its
// backlog has been closed unread (ServeSocket): such a connection may come
// from the run that used the socket before.
type Socket struct {
	ln   *net.UnixListener
	info os.FileInfo // the socket file as bound
}

// Close closes the socket. Its file stays where it is: it lives in the run
// directory and goes with it.
func (k *Socket) Close() error { return k.ln.Close() }

// keptListener is a session's listener that Close can leave bound: while
// keep is set, Close wakes a blocked Accept (by a deadline in the past)
// instead of closing the socket, and marks the listener parked; Accept then
// reports net.ErrClosed, as for a closed listener.
type keptListener struct {
	*net.UnixListener
	keep   atomic.Bool // set by CloseKeepSocket before the server shuts down
	parked atomic.Bool // Close ran while keep was set: the socket is still bound
}

// Accept returns the next connection until the listener is closed or
// parked.
func (l *keptListener) Accept() (net.Conn, error) {
	c, err := l.UnixListener.Accept()
	if l.parked.Load() {
		if c != nil {
			_ = c.Close()
		}
		return nil, net.ErrClosed
	}
	return c, err
}

// Close closes the socket, or only parks it when keep is set.
func (l *keptListener) Close() error {
	if !l.keep.Load() {
		return l.UnixListener.Close()
	}
	if l.parked.Swap(true) {
		return nil
	}
	return l.UnixListener.SetDeadline(time.Unix(1, 0))
}

// CloseKeepSocket is Close, except that the session's socket stays bound
// and its file in place: it returns the socket for a later session in the
// same directory (Host.ServeSocket), or nil when the session had been
// detached before (the socket was closed and removed then). A session that
// did not end cleanly keeps nothing: its socket is closed and removed as
// Close does, and the error returned.
func (s *Session) CloseKeepSocket(ctx context.Context) (*Socket, error) {
	s.ln.keep.Store(true)
	err := s.Close(ctx)
	if !s.ln.parked.Load() {
		return nil, err
	}
	k := &Socket{ln: s.ln.UnixListener, info: s.sockInfo}
	if err != nil {
		_ = k.Close()
		if fi, lerr := os.Lstat(s.path); lerr == nil && os.SameFile(fi, s.sockInfo) {
			_ = os.Remove(s.path)
		}
		return nil, err
	}
	return k, nil
}

// ServeSocket is Serve on a socket an earlier session kept bound
// (Session.CloseKeepSocket), whose directory the caller has since moved so
// that the socket's file is now at socketPath. Before serving, it closes
// every connection waiting in the socket's backlog, unread: such a
// connection was made for the run that used the socket before. It fails
// when the file at socketPath is not that socket; the socket is closed on
// any failure.
func (h *Host) ServeSocket(ctx context.Context, run RunInfo, socketPath string, k *Socket) (*Session, error) {
	return h.serveOn(ctx, run, socketPath, func() (*net.UnixListener, os.FileInfo, error) {
		ln, fi, err := k.reuse(socketPath)
		if err != nil {
			_ = k.Close()
		}
		return ln, fi, err
	})
}

// reuse checks that the file at path is k's socket, closes what waits in
// its backlog and clears the deadline that parked it.
func (k *Socket) reuse(path string) (*net.UnixListener, os.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("kept socket: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket || !os.SameFile(fi, k.info) {
		return nil, nil, fmt.Errorf("kept socket: %s is not the socket kept bound", path)
	}
	if err := drainBacklog(k.ln); err != nil {
		return nil, nil, fmt.Errorf("kept socket: close waiting connections: %w", err)
	}
	if err := k.ln.SetDeadline(time.Time{}); err != nil {
		return nil, nil, fmt.Errorf("kept socket: %w", err)
	}
	return k.ln, fi, nil
}

// drainBacklog accepts every connection waiting in ln's backlog and closes
// it unread. The listener's descriptor is non-blocking (as every Go network
// listener's is), so accept reports EAGAIN once the backlog is empty.
func drainBacklog(ln *net.UnixListener) error {
	rc, err := ln.SyscallConn()
	if err != nil {
		return err
	}
	var aerr error
	err = rc.Control(func(fd uintptr) {
		for {
			// Under ForkLock, as the net package accepts without
			// accept4: no child process may inherit the descriptor.
			syscall.ForkLock.RLock()
			nfd, _, err := syscall.Accept(int(fd))
			if err == nil {
				_ = syscall.Close(nfd)
			}
			syscall.ForkLock.RUnlock()
			switch {
			case err == nil, errors.Is(err, syscall.EINTR), errors.Is(err, syscall.ECONNABORTED):
			case errors.Is(err, syscall.EAGAIN):
				return
			default:
				aerr = err
				return
			}
		}
	})
	return errors.Join(err, aerr)
}
