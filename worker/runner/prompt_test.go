package runner

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// replaceMasker masks one secret, as the secrets stage's masker does.
type replaceMasker struct{ secret string }

func (m replaceMasker) String(s string) string           { return strings.ReplaceAll(s, m.secret, "***") }
func (m replaceMasker) Stream(_ string, p []byte) []byte { return []byte(m.String(string(p))) }
func (m replaceMasker) Flush(string) []byte              { return nil }

// The started event's prompt is masked before it is cut, cut at a whole
// UTF-8 character within messages.MaxEventPrompt, and says its whole size
// only when cut.
func TestEventPrompt(t *testing.T) {
	t.Parallel()
	p, n := eventPrompt("use hunter2 here", replaceMasker{"hunter2"})
	require.Equal(t, "use *** here", p)
	require.Zero(t, n)
	p, n = eventPrompt("no secrets", nil)
	require.Equal(t, "no secrets", p)
	require.Zero(t, n)

	// A secret across the cut is masked whole, never left half shown.
	long := strings.Repeat("a", messages.MaxEventPrompt-3) + "hunter2" + strings.Repeat("é", 10)
	p, n = eventPrompt(long, replaceMasker{"hunter2"})
	require.NotContains(t, p, "hun")
	require.Equal(t, len(long)-len("hunter2")+len("***"), n)
	require.LessOrEqual(t, len(p), messages.MaxEventPrompt)

	// Cut at a whole character.
	wide := strings.Repeat("é", messages.MaxEventPrompt) // 2 bytes each
	p, n = eventPrompt(wide, nil)
	require.True(t, utf8.ValidString(p))
	require.Equal(t, messages.MaxEventPrompt, len(p))
	require.Equal(t, len(wide), n)
	odd := "x" + wide
	p, _ = eventPrompt(odd, nil)
	require.True(t, utf8.ValidString(p))
	require.Equal(t, messages.MaxEventPrompt-1, len(p))
}
