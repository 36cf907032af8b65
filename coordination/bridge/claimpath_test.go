package bridge

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResolveClaims(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src"), 0o755))
	for link, target := range map[string]string{"loop1": "loop2", "loop2": "loop1", "lnk": "src", "self": "."} {
		require.NoError(t, os.Symlink(target, filepath.Join(ws, link)))
	}
	got, err := resolveClaims(ws, []string{"lnk/a.go", "src/a.go", "self", "new/x.go", "src/*.go"}, true)
	require.NoError(t, err)
	require.Equal(t, []string{"src/a.go", "**", "new/x.go", "src/*.go"}, got, "resolved, repeats dropped")
	_, err = resolveClaims(ws, []string{"loop1/x"}, true)
	require.ErrorContains(t, err, `claim refused: "loop1/x" goes through a symlink that cannot be followed: more than 40 symlinks`)
	// A glob matching the loop names nothing that resolves: it passes.
	got, err = resolveClaims(ws, []string{"loop*"}, true)
	require.NoError(t, err)
	require.Equal(t, []string{"loop*"}, got)
	// No workspace: taken as given.
	got, err = resolveClaims("", []string{"lnk/a.go"}, true)
	require.NoError(t, err)
	require.Equal(t, []string{"lnk/a.go"}, got)
}

// The check lists at most its budget of directory entries: past it, it
// stops looking and the claim goes on.
func TestResolveClaimsWalkBudget(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ws, "src"), 0o755))
	deep := filepath.Join(ws, "tree", "a", "b")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	for i := range 40 {
		require.NoError(t, os.WriteFile(filepath.Join(ws, "tree", fmt.Sprintf("f%02d", i)), nil, 0o644))
	}
	require.NoError(t, os.Symlink("../../../src", filepath.Join(deep, "z")))
	_, err := resolveClaimsWithin(ws, []string{"tree"}, true, maxClaimWalk)
	require.ErrorContains(t, err, `through the symlink "tree/a/b/z" (to "src")`)
	got, err := resolveClaimsWithin(ws, []string{"tree"}, true, 2) // z is the third entry at best
	require.NoError(t, err, "the walk stopped within its budget")
	require.Equal(t, []string{"tree"}, got)
}
