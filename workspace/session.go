package workspace

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/jetcrew/jetcrew/messages"
)

// The agent CLI's session (docs/workspaces.md, "Follow-ups"): `jetcrew
// workspace exec --session DIR` runs the agent as its child instead of
// replacing itself with it, and once the agent has exited copies the
// regular files under DIR (the CLI's session directory in HOME, a tmpfs
// gone with the container) into the workspace's messages.SessionDir, where
// the capture keeps them as the messages.ResultSession object; with
// --session-in TAR it first restores an earlier run's session object into
// DIR. Both sides are capped at messages.MaxSessionBytes.

// sessionOverMarker is the one file exec leaves in SessionDir when the
// CLI's session files were over messages.MaxSessionBytes: it holds their
// size, and the capture records SessionError instead of an object.
const sessionOverMarker = ".jetcrew-session-over-cap"

// underSession reports whether p is messages.SessionDir or inside it.
func underSession(p string) bool {
	return p == messages.SessionDir || strings.HasPrefix(p, messages.SessionDir+"/")
}

// sessionTar returns the tar of the session files under SessionDir of root
// (nil when none), or why they are not kept: over MaxSessionBytes (exec's
// marker, or a directory the agent filled itself), or unreadable.
func sessionTar(root *os.Root, refused refusedPaths) ([]byte, string) {
	if b, err := root.ReadFile(messages.SessionDir + "/" + sessionOverMarker); err == nil && len(b) < 64 {
		return nil, fmt.Sprintf("the session files were %s bytes, over the cap of %d: not kept", strings.TrimSpace(string(b)), messages.MaxSessionBytes)
	}
	// The tar's headers on top of the files' bytes: 1 KiB a file at most
	// with PAX records, bounded by maxArtifactFiles.
	data, list, err := dirTar(root, messages.SessionDir, messages.MaxSessionBytes+1<<20, refused)
	var total int64
	for _, o := range list {
		total += o.Size
	}
	switch {
	case errors.Is(err, ErrTooLarge), err == nil && total > messages.MaxSessionBytes:
		return nil, fmt.Sprintf("the session files are over the cap of %d bytes: not kept", messages.MaxSessionBytes)
	case err != nil:
		return nil, "the session files could not be read: " + oneLine(err.Error())
	}
	return data, ""
}

// runKeepingSession runs a.Argv as a child (exec's --session): the
// signals a stop sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT) go on to it;
// once it has exited, the session files under a.Session are copied into
// the workspace (saveSession) and exec ends as the child did: with its
// exit code, or killed by the same signal.
func runKeepingSession(a JailArgs, stderr io.Writer) int {
	cmd := exec.Command(a.Argv[0], a.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "%sexec %s: %s\n", JailErrPrefix, a.Argv[0], oneLine(err.Error()))
		return 127
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	if err := saveSession(a.Session, a.Dir, a.SessionNames); err != nil {
		fmt.Fprintf(stderr, "%ssession not kept: %s\n", JailErrPrefix, oneLine(err.Error()))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			raiseSignal(ws.Signal())
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return 127
	}
	return 0
}

// raiseSignal ends the process with signal sig, as its child ended: the
// container's init then reports what a process killed so reports. A
// variable for tests; when the signal does not end the process, exec
// returns 128+sig, as a shell does.
var raiseSignal = func(sig syscall.Signal) {
	signal.Reset(sig)
	_ = syscall.Kill(os.Getpid(), sig)
}

// saveSession copies the regular files under src (the CLI's session
// directory, absolute) that names keeps into messages.SessionDir of the
// workspace at dir, replacing whatever is there; symlinks and other special
// files are left out. SessionDir is cleared first, whatever src is: a src
// that is missing (moved away by the agent), not a directory or unreadable
// keeps nothing, never what the agent wrote into SessionDir itself. Over
// messages.MaxSessionBytes in all, it copies none and leaves
// sessionOverMarker instead.
func saveSession(src, dir string, names SessionNames) error {
	ws, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer ws.Close()
	if err := ws.RemoveAll(messages.SessionDir); err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", src)
	}
	in, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := ws.MkdirAll(messages.SessionDir, 0o700); err != nil {
		return err
	}
	out, err := ws.OpenRoot(messages.SessionDir)
	if err != nil {
		return err
	}
	defer out.Close()
	entries, err := walk(in, src, walkOptions{maxFiles: maxArtifactFiles, skip: func(p string, _ bool) bool {
		return !strings.Contains(p, "/") && !names.Kept(p)
	}})
	if err != nil {
		return err
	}
	var total int64
	for _, e := range entries {
		if e.info.Mode().IsRegular() {
			total += e.info.Size()
		}
	}
	if total > messages.MaxSessionBytes {
		return errors.Join(out.WriteFile(sessionOverMarker, fmt.Appendf(nil, "%d\n", total), 0o600),
			fmt.Errorf("%d bytes, over the cap of %d", total, messages.MaxSessionBytes))
	}
	for _, e := range entries {
		switch {
		case e.info.IsDir():
			err = out.MkdirAll(e.path, 0o700)
		case e.info.Mode().IsRegular():
			err = copyRootFile(in, out, e.path)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyRootFile copies the regular file name of src to the same name in dst
// (mode 0600), never following a symlink on either side.
func copyRootFile(src, dst *os.Root, name string) error {
	r, err := src.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := dst.MkdirAll(path.Dir(name), 0o700); err != nil {
		return err
	}
	w, err := dst.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.LimitReader(r, messages.MaxSessionBytes+1))
	return errors.Join(err, w.Close())
}

// restoreSession unpacks the session object at tarPath (an earlier run's
// messages.ResultSession, mounted read-only) into dir, the CLI's session
// directory: directories and regular files only, names relative and
// clean, at most messages.MaxSessionBytes in all and maxArtifactFiles
// entries; an entry names does not keep (credentials, binaries) is passed
// over. It runs before the agent starts, as the run's user.
func restoreSession(tarPath, dir string, names SessionNames) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadArchive, err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		total += hdr.Size
		switch {
		case n >= maxArtifactFiles, total > messages.MaxSessionBytes:
			return fmt.Errorf("%w: the session is over %d bytes or %d entries", ErrTooLarge, messages.MaxSessionBytes, maxArtifactFiles)
		case !filepath.IsLocal(name) || path.Clean(name) != name:
			return fmt.Errorf("%w: entry %q is not a clean relative name", ErrBadArchive, hdr.Name)
		case !names.Kept(name):
			continue // its content, if any, is skipped by the next Next
		case hdr.Typeflag == tar.TypeDir:
			err = root.MkdirAll(name, 0o700)
		case hdr.Typeflag == tar.TypeReg:
			err = writeRootFile(root, name, tr, hdr.Size)
		default:
			return fmt.Errorf("%w: entry %q is not a file or directory", ErrBadArchive, hdr.Name)
		}
		if err != nil {
			return err
		}
	}
}

// writeRootFile writes size bytes of r as the file name of root (mode
// 0600), its directories made as needed.
func writeRootFile(root *os.Root, name string, r io.Reader, size int64) error {
	if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
		return err
	}
	w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = io.CopyN(w, r, size)
	return errors.Join(err, w.Close())
}
