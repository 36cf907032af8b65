package profile_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/profile"
)

// TestSet: every holder of one Set reads what the last Store stored; a nil
// Set holds nothing.
func TestSet(t *testing.T) {
	t.Parallel()
	a := profile.Profiles{"a": profile.ShellProfile()}
	s := profile.NewSet(a)
	reader := s // another part, handed the same set
	require.Equal(t, a, reader.Load())
	b := profile.Profiles{"b": profile.ShellProfile()}
	s.Store(b)
	require.Equal(t, b, reader.Load(), "one store, seen by every part")
	var none *profile.Set
	require.Nil(t, none.Load())
	require.Nil(t, (&profile.Set{}).Load())
}
