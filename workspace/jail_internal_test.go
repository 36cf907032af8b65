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

	require.Equal(t, heldTimedOut, waitHeld(held, 20*time.Millisecond, stop))

	stop <- syscall.SIGTERM
	require.Equal(t, heldStopped, waitHeld(held, time.Minute, stop), "stopped before the tree was held")

	require.NoError(t, os.WriteFile(held, nil, 0o444))
	require.Equal(t, heldSeen, waitHeld(held, time.Minute, stop))
	require.Empty(t, stop)

	// The file appears while a stop waits to be read: held wins, the stop
	// is handed back.
	require.NoError(t, os.Remove(held))
	stop <- syscall.SIGTERM
	go func() { _ = os.WriteFile(held, nil, 0o444) }()
	for {
		if _, err := os.Stat(held); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, heldSeen, waitHeld(held, time.Minute, stop))
	require.Len(t, stop, 1, "the stop is left for after the unpack")
}
