package worker

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
		w := &Worker{cfg: Config{ID: "same-id", StateRoot: root}}
		require.NoError(t, w.prepareStateDir())
		dir := w.cfg.StateDir
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
		w := &Worker{cfg: Config{StateDir: tt.dir}}
		require.ErrorContains(t, w.prepareStateDir(), tt.want, tt.dir)
	}
	// Nothing was chmodded through the link.
	fi, err := os.Stat(secret)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	if os.Geteuid() == 0 {
		foreign := filepath.Join(base, "foreign")
		require.NoError(t, os.Mkdir(foreign, 0o700))
		require.NoError(t, os.Chown(foreign, 4242, 4242))
		w := &Worker{cfg: Config{StateDir: foreign}}
		require.ErrorContains(t, w.prepareStateDir(), "is owned by uid 4242, not by the worker's uid 0")
	} else {
		t.Log("not root: the foreign-owner case needs chown")
	}

	// A missing configured dir is created private; an existing private one
	// is accepted.
	fresh := filepath.Join(base, "fresh")
	w := &Worker{cfg: Config{StateDir: fresh}}
	require.NoError(t, w.prepareStateDir())
	require.NoError(t, w.prepareStateDir())
}

// TestStateDirLeavesNothing: a worker's default state directory holds its
// marker and is gone, whole, once the worker stopped; a configured one
// stays, emptied of what the worker staged.
func TestStateDirLeavesNothing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	w := &Worker{cfg: Config{StateRoot: root}}
	require.NoError(t, w.prepareStateDir())
	m, ok := readMarker(w.cfg.StateDir)
	require.True(t, ok, "a default state directory holds its marker")
	require.Equal(t, os.Getpid(), m.PID)
	require.NoError(t, os.MkdirAll(filepath.Join(w.cfg.StateDir, "snap"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(w.cfg.StateDir, "snap", "x.tar"), nil, 0o444))
	w.removeStateDir()
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, entries, "the default state directory is removed whole")

	fixed := filepath.Join(t.TempDir(), "fixed")
	w = &Worker{cfg: Config{StateDir: fixed}}
	require.NoError(t, w.prepareStateDir())
	require.NoError(t, os.MkdirAll(filepath.Join(fixed, "snap"), 0o700))
	w.removeStateDir()
	_, err = os.Stat(filepath.Join(fixed, "snap"))
	require.ErrorIs(t, err, os.ErrNotExist, "what the worker staged goes")
	_, err = os.Stat(fixed)
	require.NoError(t, err, "the operator's directory stays")
}

// TestReclaimStateDirs: on start, a worker removes the default state
// directories a dead worker of its user left, and only those: not one
// whose process lives, nor one without a marker, with another mode, a
// link, or another prefix.
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
	// A process that has exited: its pid names nothing (or another
	// process, whose start time differs).
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	deadPID := cmd.Process.Pid
	liveStart, err := processStart(os.Getpid())
	require.NoError(t, err)

	dead := mk("jetcrew-dead", 0o700, &marker{PID: deadPID, Start: 1})
	reused := mk("jetcrew-reused", 0o700, &marker{PID: os.Getpid(), Start: liveStart + 1})
	live := mk("jetcrew-live", 0o700, &marker{PID: os.Getpid(), Start: liveStart})
	unmarked := mk("jetcrew-unmarked", 0o700, nil)
	open := mk("jetcrew-open", 0o755, &marker{PID: deadPID, Start: 1})
	other := mk("other-dead", 0o700, &marker{PID: deadPID, Start: 1})
	require.NoError(t, os.Symlink(dead+"-target", filepath.Join(root, "jetcrew-link")))
	mk("jetcrew-dead-target", 0o700, &marker{PID: deadPID, Start: 1})

	reclaimStateDirs(root, "jetcrew-dead-target-never", zerolog.Nop()) // another prefix: nothing
	reclaimStateDirs(root, "jetcrew-", zerolog.Nop())
	for dir, kept := range map[string]bool{dead: false, reused: false, live: true, unmarked: true, open: true, other: true} {
		_, err := os.Lstat(dir)
		require.Equal(t, kept, err == nil, "%s: %v", filepath.Base(dir), err)
	}
	_, err = os.Lstat(filepath.Join(root, "jetcrew-link"))
	require.NoError(t, err, "a link is never followed nor removed")
}
