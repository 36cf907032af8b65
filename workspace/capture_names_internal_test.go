package workspace

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The names a result refuses: control characters anywhere, and the
// components go-git will not check out, whatever the case or spelling
// HFS+ and NTFS give ".git"; ordinary odd names pass.
func TestTreeRefuses(t *testing.T) {
	t.Parallel()
	for p, refused := range map[string]bool{
		"a": false, "a/b.txt": false, "CON": false, "a b": false, "ünïcode": false, "a\\b": false, ".gitignore": false, "git": false,
		"a\x1bb": true, "a\nb": true, "a\tb": true, "d\x7f": true, "d/\x01": true,
		".git": true, ".GIT": true, "a/.Git/x": true, "git~1": true, ".git.": true, ".git\u200c": true,
		"..": true, "a/../b": true, ".": true, "": true,
	} {
		require.Equal(t, refused, treeRefuses(p), "%q", p)
	}
	require.Equal(t, "d\x01", refusedPrefix("d\x01/x/y"))
	require.Equal(t, "a/.GIT", refusedPrefix("a/.GIT/hooks/x"))
	require.Empty(t, refusedPrefix("a/b"))
}
