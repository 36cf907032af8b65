package console

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A memo reads once per memoMaxAge however often it is asked, again
// once forgotten or old, keeps a failed read's error with its value, and
// bounds each read by memoReadTimeout.
func TestMemo(t *testing.T) {
	t.Parallel()
	var m memo[int]
	reads := 0
	fail := errors.New("nats away")
	var readErr error
	read := func(ctx context.Context) (int, error) {
		reads++
		dl, ok := ctx.Deadline()
		require.True(t, ok, "a read has a deadline")
		require.LessOrEqual(t, time.Until(dl), memoReadTimeout)
		return reads * 10, readErr
	}
	for range 3 {
		v, err := m.get(t.Context(), read)
		require.NoError(t, err)
		require.Equal(t, 10, v)
	}
	require.Equal(t, 1, reads, "one read serves every get within memoMaxAge")

	m.forget()
	readErr = fail
	v, err := m.get(t.Context(), read)
	require.Equal(t, 2, reads, "a forgotten read is read again")
	require.ErrorIs(t, err, fail)
	require.Equal(t, 20, v, "a failed read's value is what the read returned")
	_, err = m.get(t.Context(), read)
	require.ErrorIs(t, err, fail, "the failure is kept as long as the read")
	require.Equal(t, 2, reads)

	readErr = nil
	m.mu.Lock()
	m.at = m.at.Add(-memoMaxAge) // as if memoMaxAge passed
	m.mu.Unlock()
	v, err = m.get(t.Context(), read)
	require.NoError(t, err)
	require.Equal(t, 30, v, "an old read is read again")
}
