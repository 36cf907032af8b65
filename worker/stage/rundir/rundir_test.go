package rundir

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/stage"
)

// TestSweepSparesHeld: a sweep removes the run directories older than the
// grace that no live run holds, and keeps a held one however old, and a
// young one.
func TestSweepSparesHeld(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "r")
	require.NoError(t, os.Mkdir(root, 0o700))
	holds := &stage.Holds{}
	d := New(root, "", 0, holds, zerolog.Nop())
	old := time.Now().Add(-time.Hour)
	for _, name := range []string{"held", "stale", "young"} {
		require.NoError(t, os.Mkdir(d.Path(name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d.Path(name), "f"), nil, 0o444))
		if name != "young" {
			require.NoError(t, os.Chtimes(d.Path(name), old, old))
		}
	}
	release := holds.Hold(holdPrefix + d.Path("held"))
	d.Sweep(time.Minute)
	for name, kept := range map[string]bool{"held": true, "stale": false, "young": true} {
		_, err := os.Stat(d.Path(name))
		require.Equal(t, kept, err == nil, "%s: %v", name, err)
	}
	release()
	d.Sweep(time.Minute)
	_, err := os.Stat(d.Path("held"))
	require.ErrorIs(t, err, os.ErrNotExist, "released, it is swept")
}
