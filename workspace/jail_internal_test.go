package workspace

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitHeld: exec's wait for the held file ends when the file appears,
// on a stop while it has not (nothing is unpacked then), or at its bound;
// a stop that comes once the file is there is kept for after the unpack.
func TestWaitHeld(t *testing.T) {
	t.Parallel()
	held := filepath.Join(t.TempDir(), "held")
	stop := make(chan os.Signal, 1)

	require.Equal(t, heldTimedOut, waitHeld(fileExists(held), 20*time.Millisecond, stop))

	stop <- syscall.SIGTERM
	require.Equal(t, heldStopped, waitHeld(fileExists(held), time.Minute, stop), "stopped before the tree was held")

	require.NoError(t, os.WriteFile(held, nil, 0o444))
	require.Equal(t, heldSeen, waitHeld(fileExists(held), time.Minute, stop))
	require.Empty(t, stop)

	// The file appears while a stop waits to be read (absent at the first
	// look, there at the look the stop makes): held wins, the stop is
	// handed back.
	stop <- syscall.SIGTERM
	looks := 0
	appears := func() bool { looks++; return looks > 1 }
	require.Equal(t, heldSeen, waitHeld(appears, time.Minute, stop))
	require.Equal(t, 2, looks)
	require.Len(t, stop, 1, "the stop is left for after the unpack")
}
