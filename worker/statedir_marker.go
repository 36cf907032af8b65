package worker

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stateMarker is the file a worker writes in a state directory it made and
// holds an exclusive lock on (flock(2)) for its life: a later worker of
// the same user reclaims a directory whose marker it can lock at once
// (reclaimStateDirs).
const stateMarker = ".jetcrew-worker"

// markerMaxBytes bounds a marker file, in bytes.
const markerMaxBytes = 4096

// oldMarkerMargin is how long before the host booted a marker of an
// earlier version (no lock) must have been made to be reclaimed: a wall
// clock set right only after boot cannot make a live worker's look older.
const oldMarkerMargin = time.Hour

// marker is the content of stateMarker.
type marker struct {
	// Lock is set in a marker whose worker holds an exclusive flock(2) on
	// it for its life. The lock is the kernel's, on the file itself, so it
	// holds across PID and mount namespaces (workers in containers sharing
	// one host directory) where a process id does not; it goes with the
	// process however it ends.
	Lock bool `json:"lock,omitempty"`
	// Worker is the id of the worker that made the directory (for logs).
	Worker string `json:"worker,omitempty"`
	// PID and Start are what a marker of an earlier version holds instead
	// of Lock: the process that made it and its start time (field 22 of
	// /proc/<pid>/stat), which name another process, or none, in another
	// PID namespace. A locked marker has neither, so an earlier version,
	// which needs a PID, leaves its directory alone.
	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// Created is when the directory was made.
	Created time.Time `json:"created"`
}

// lockMarker writes a locked marker for worker id into dir and returns the
// file holding the lock, to keep open for the worker's life. The marker is
// written under another name, locked, then renamed into place (the lock
// goes with the file), so nobody can find it unlocked.
func lockMarker(dir, id string) (*os.File, error) {
	tmp := filepath.Join(dir, stateMarker+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(marker{Lock: true, Worker: id, Created: time.Now().UTC()})
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		_, err = f.Write(b)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, stateMarker))
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the marker: %w", err)
	}
	return f, nil
}

// openMarker opens dir's marker, a regular file of the effective user (not
// a link), and takes its lock if it is free at once. It returns the open
// file (nil when there is no such marker) and whether the lock was taken;
// the caller closes the file, which lets the lock go.
func openMarker(dir string) (f *os.File, locked bool) {
	f, err := os.OpenFile(filepath.Join(dir, stateMarker), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() > markerMaxBytes {
		f.Close()
		return nil, false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, false
	}
	return f, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
}

// readMarker reads the marker in f, open at its start.
func readMarker(f *os.File) (marker, bool) {
	b, err := io.ReadAll(io.LimitReader(f, markerMaxBytes))
	if err != nil {
		return marker{}, false
	}
	var m marker
	if json.Unmarshal(b, &m) != nil || !m.Lock && m.PID <= 0 {
		return marker{}, false
	}
	return m, true
}

// markerDead reports whether the worker of marker m, whose lock the caller
// holds, is gone, and why. A locked marker's is: its lock was free. A
// marker of an earlier version (a PID, no lock) is only when it was made
// more than oldMarkerMargin before the host booted (bootTime): its process
// id cannot say, across PID namespaces, whether its worker lives.
func markerDead(m marker, bootTime time.Time) (bool, string) {
	if m.Lock {
		return true, "its lock is free"
	}
	if !bootTime.IsZero() && m.Created.Before(bootTime.Add(-oldMarkerMargin)) {
		return true, "an earlier version's, made before the host booted"
	}
	return false, ""
}

// hostBootTime returns when the host booted: btime in /proc/stat, which
// PID namespaces do not change; zero when it cannot be read.
func hostBootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}
