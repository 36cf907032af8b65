package worker

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// TestStateDirPrivate: the default state dir is a
// new private directory with an unpredictable name, and a configured one
// that someone else could have prepared (wrong mode, another owner, a
// symlink, a symlinked r/) is refused, never chmodded or followed.
func TestStateDirPrivate(t *testing.T) {
	t.Parallel()

	// Default: created 0700 under the state root, a new name every time.
	var dirs []string
	root := t.TempDir()
	for range 2 {
		d := &stateDir{id: "same-id", root: root}
		require.NoError(t, d.prepare())
		dir := d.path
		require.True(t, strings.HasPrefix(dir, filepath.Join(root, "jetcrew-")), dir)
		for _, d := range []string{dir, filepath.Join(dir, "r")} {
			fi, err := os.Lstat(d)
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), d)
		}
		dirs = append(dirs, dir)
	}
	require.NotEqual(t, dirs[0], dirs[1], "two workers with one id share no state dir")

	base := t.TempDir()
	secret := filepath.Join(base, "root-only")
	require.NoError(t, os.Mkdir(secret, 0o700))
	open := filepath.Join(base, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(secret, link))
	linkedR := filepath.Join(base, "linked-r")
	require.NoError(t, os.Mkdir(linkedR, 0o700))
	require.NoError(t, os.Symlink(secret, filepath.Join(linkedR, "r")))

	for _, tt := range []struct{ dir, want string }{
		{open, "has mode 0755; the worker's state dir must have mode 0700"},
		{link, "is a symbolic link; refusing it"},
		{linkedR, "r is a symbolic link; refusing it"},
	} {
		d := &stateDir{configured: tt.dir}
		require.ErrorContains(t, d.prepare(), tt.want, tt.dir)
	}
	// Nothing was chmodded through the link.
	fi, err := os.Stat(secret)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	if os.Geteuid() == 0 {
		foreign := filepath.Join(base, "foreign")
		require.NoError(t, os.Mkdir(foreign, 0o700))
		require.NoError(t, os.Chown(foreign, 4242, 4242))
		d := &stateDir{configured: foreign}
		require.ErrorContains(t, d.prepare(), "is owned by uid 4242, not by the worker's uid 0")
	} else {
		t.Log("not root: the foreign-owner case needs chown")
	}

	// A missing configured dir is created private; an existing private one
	// is accepted.
	fresh := filepath.Join(base, "fresh")
	d := &stateDir{configured: fresh}
	require.NoError(t, d.prepare())
	require.NoError(t, d.prepare())
}

// TestStateDirLeavesNothing: a worker's default state directory holds its
// marker and is gone, whole, once the worker stopped; a configured one
// stays, emptied of what the worker staged.
func TestStateDirLeavesNothing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	d := &stateDir{id: "w-1", root: root}
	require.NoError(t, d.prepare())
	f, locked := openMarker(d.path)
	require.NotNil(t, f, "a default state directory holds its marker")
	defer f.Close()
	require.False(t, locked, "locked by its worker")
	m, ok := readMarker(f)
	require.True(t, ok)
	require.Equal(t, marker{Lock: true, Worker: "w-1", Created: m.Created}, m, "a lock, no process id")
	require.NoError(t, os.MkdirAll(filepath.Join(d.path, "snap"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(d.path, "snap", "x.tar"), nil, 0o444))
	d.remove()
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "the default state directory is removed whole")

	fixed := filepath.Join(t.TempDir(), "fixed")
	d = &stateDir{configured: fixed}
	require.NoError(t, d.prepare())
	require.NoError(t, os.MkdirAll(filepath.Join(fixed, "snap"), 0o700))
	d.remove()
	_, err = os.Stat(filepath.Join(fixed, "snap"))
	require.ErrorIs(t, err, os.ErrNotExist, "what the worker staged goes")
	_, err = os.Stat(fixed)
	require.NoError(t, err, "the operator's directory stays")
}

// TestReclaimStateDirs: on start, a worker removes the default state
// directories a dead worker of its user left, and only those: a marker
// whose lock is free, or an earlier version's marker (a process id, no
// lock) made well before the host booted. Not one whose lock is held (its
// worker lives, in whatever PID namespace), an earlier version's marker
// made since boot (whether its worker lives cannot be told), one without a
// marker or with an unreadable one, with another mode, a link, or another
// prefix.
func TestReclaimStateDirs(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mk := func(name string, mode os.FileMode, m *marker) string {
		dir := filepath.Join(root, name)
		require.NoError(t, os.Mkdir(dir, mode))
		require.NoError(t, os.Chmod(dir, mode))
		if m != nil {
			b, _ := json.Marshal(m)
			require.NoError(t, os.WriteFile(filepath.Join(dir, stateMarker), b, 0o600))
		}
		return dir
	}
	boot := hostBootTime()
	require.False(t, boot.IsZero(), "btime in /proc/stat")
	now := time.Now().UTC()

	dead := mk("jetcrew-dead", 0o700, &marker{Lock: true, Worker: "gone", Created: now})
	// A live worker's: made as a worker makes it, its lock held here.
	live := filepath.Join(root, "jetcrew-live")
	require.NoError(t, os.Mkdir(live, 0o700))
	lock, err := lockMarker(live, "alive")
	require.NoError(t, err)
	defer lock.Close()
	// An earlier version's: a process id that, in another PID namespace,
	// names another process or none.
	oldLive := mk("jetcrew-old", 0o700, &marker{PID: 1, Start: 1, Created: now})
	oldBoot := mk("jetcrew-old-boot", 0o700, &marker{PID: 1, Start: 1, Created: boot.Add(-2 * oldMarkerMargin)})
	unmarked := mk("jetcrew-unmarked", 0o700, nil)
	garbled := mk("jetcrew-garbled", 0o700, nil)
	require.NoError(t, os.WriteFile(filepath.Join(garbled, stateMarker), []byte("{"), 0o600))
	open := mk("jetcrew-open", 0o755, &marker{Lock: true, Created: now})
	other := mk("other-dead", 0o700, &marker{Lock: true, Created: now})
	require.NoError(t, os.Symlink(dead+"-target", filepath.Join(root, "jetcrew-link")))
	mk("jetcrew-dead-target", 0o700, &marker{Lock: true, Created: now})
	linked := mk("jetcrew-linked-marker", 0o700, nil)
	require.NoError(t, os.Symlink(filepath.Join(dead, stateMarker), filepath.Join(linked, stateMarker)))

	var logs bytes.Buffer
	log := zerolog.New(&logs)
	reclaimStateDirs(root, "jetcrew-dead-target-never", nil, log) // another prefix: nothing
	reclaimStateDirs(root, "jetcrew-", nil, log)
	for dir, kept := range map[string]bool{dead: false, live: true, oldLive: true, oldBoot: false, unmarked: true, garbled: true,
		open: true, other: true, linked: true} {
		_, err := os.Lstat(dir)
		require.Equal(t, kept, err == nil, "%s: %v", filepath.Base(dir), err)
	}
	_, err = os.Lstat(filepath.Join(root, "jetcrew-link"))
	require.NoError(t, err, "a link is never followed nor removed")
	require.Contains(t, logs.String(), "leaving a state directory an earlier version of the worker made")
	require.Contains(t, logs.String(), `"why":"its lock is free"`)

	// The lock goes with its holder: the live directory is reclaimed once
	// the file is closed.
	require.NoError(t, lock.Close())
	reclaimStateDirs(root, "jetcrew-live", nil, zerolog.Nop())
	require.NoDirExists(t, live)
}

// TestStateDirLockedForLife: a worker's state directory is not reclaimed
// by another worker starting under the same root while it lives, and is
// once its lock goes (the process ended; here, its file closed).
func TestStateDirLockedForLife(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	first := &stateDir{id: "first", root: root}
	require.NoError(t, first.prepare())
	second := &stateDir{id: "second", root: root}
	require.NoError(t, second.prepare())
	require.DirExists(t, first.path, "a live worker's directory stays")

	require.NoError(t, first.lock.Close()) // as the kernel does when its process ends
	third := &stateDir{id: "third", root: root}
	require.NoError(t, third.prepare())
	require.NoDirExists(t, first.path, "a dead worker's directory is reclaimed")
	require.DirExists(t, second.path)
	second.remove()
	third.remove()
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries)
}
