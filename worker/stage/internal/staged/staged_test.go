package staged

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestBridgeStaging: the bridge is copied to bin/<sha256>, mode 0555,
// whatever the source's mode; a rebuild stages a new copy and leaves the
// old one to the runs that use it until gc; gc keeps the current copy and
// those named, and removes the rest and leftover temporary files.
func TestBridgeStaging(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "jetcrew")
	v1 := []byte("#!/bin/true\nv1\n")
	require.NoError(t, os.WriteFile(src, v1, 0o755)) // a plain build's mode
	s := &Stager{dir: filepath.Join(t.TempDir(), "bin")}

	p1, d1, err := s.Stage(src)
	require.NoError(t, err)
	require.Equal(t, sha(v1), d1)
	require.Equal(t, filepath.Join(s.dir, d1), p1)
	fi, err := os.Stat(p1)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o555), fi.Mode().Perm())
	got, err := os.ReadFile(p1)
	require.NoError(t, err)
	require.Equal(t, v1, got)
	again, _, err := s.Stage(src)
	require.NoError(t, err)
	require.Equal(t, p1, again)

	v2 := []byte("#!/bin/true\nv2, rebuilt while v1 runs\n")
	require.NoError(t, os.WriteFile(src+".new", v2, 0o755))
	require.NoError(t, os.Rename(src+".new", src))
	p2, d2, err := s.Stage(src)
	require.NoError(t, err)
	require.Equal(t, sha(v2), d2)
	require.FileExists(t, p1, "a live run's copy is untouched by a rebuild")

	require.NoError(t, os.WriteFile(filepath.Join(s.dir, ".tmp-123"), nil, 0o600))
	require.NoError(t, s.GC(map[string]bool{d1: true}))
	require.FileExists(t, p1)
	require.FileExists(t, p2)
	require.NoFileExists(t, filepath.Join(s.dir, ".tmp-123"))
	require.NoError(t, s.GC(nil))
	require.NoFileExists(t, p1, "no run refers to it")
	require.FileExists(t, p2, "the current copy stays")

	require.NoError(t, os.Remove(p2))
	p3, _, err := s.Stage(src)
	require.NoError(t, err, "a removed copy is staged again")
	require.FileExists(t, p3)
}

func TestBridgeStagingRefuses(t *testing.T) {
	t.Parallel()
	s := &Stager{dir: filepath.Join(t.TempDir(), "bin")}
	_, _, err := s.Stage("/nonexistent/jetcrew")
	require.ErrorContains(t, err, "coordination bridge cannot be staged: stat /nonexistent/jetcrew: no such file or directory")
	_, _, err = s.Stage(t.TempDir())
	require.ErrorContains(t, err, "is not a regular file")
	// A dynamically linked executable could not run in a scratch image.
	for _, dyn := range []string{"/bin/ls", "/usr/bin/ls"} {
		if _, err := os.Stat(dyn); err == nil {
			_, _, err = s.Stage(dyn)
			require.ErrorContains(t, err, "is dynamically linked")
			return
		}
	}
	t.Fatal("no dynamically linked executable found to test with")
}
