package secrets

import (
	"strings"
	"testing"

	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/stretchr/testify/require"
)

func testMasker(env map[string]string, names ...string) *masker {
	return newMasker(&profile.Profile{EnvFromHost: names}, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

// TestMaskerStreams: secrets are masked in a stream however it is cut into
// chunks, nothing else is changed, and short values are left alone.
func TestMaskerStreams(t *testing.T) {
	t.Parallel()
	env := map[string]string{"KEY": "sk-live-12345", "TOK": "abcdef", "SHORT": "1", "UNSET_IS_SKIPPED": ""}
	require.Nil(t, testMasker(env, "SHORT"), "a value under 4 bytes is not masked")
	require.Nil(t, testMasker(env, "NOPE"))
	text := "401 sk-live-12345 then abcdef, sk-live- alone, abcde and 1 and sk-live-12345abcdef\n"
	want := "401 *** then ***, sk-live- alone, abcde and 1 and ******\n"
	for cut := 1; cut <= len(text); cut++ {
		m := testMasker(env, "KEY", "TOK", "SHORT")
		var got strings.Builder
		for i := 0; i < len(text); i += cut {
			got.Write(m.Stream("stdout", []byte(text[i:min(i+cut, len(text))])))
		}
		got.Write(m.Flush("stdout"))
		require.Equal(t, want, got.String(), "chunks of %d bytes", cut)
	}
	m := testMasker(env, "KEY")
	require.Equal(t, "exit code 1: 401 ***", m.String("exit code 1: 401 sk-live-12345"))
	// A held-back prefix that never completes comes out at the end.
	require.Equal(t, "x", string(m.Stream("stderr", []byte("xsk-li"))))
	require.Equal(t, "sk-li", string(m.Flush("stderr")))
	var nilMasker *masker
	require.Equal(t, "as is", nilMasker.String("as is"))
}
