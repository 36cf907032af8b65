package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStateDirPrivate: the default state dir is a
// new private directory with an unpredictable name, and a configured one
// that someone else could have prepared (wrong mode, another owner, a
// symlink, a symlinked r/) is refused, never chmodded or followed.
func TestStateDirPrivate(t *testing.T) {
	t.Parallel()

	// Default: created 0700 under os.TempDir(), a new name every time.
	var dirs []string
	for range 2 {
		w := &Worker{cfg: Config{ID: "same-id"}}
		require.NoError(t, w.prepareStateDir())
		dir := w.cfg.StateDir
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		require.True(t, strings.HasPrefix(dir, filepath.Join(os.TempDir(), "jetcrew-")), dir)
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
