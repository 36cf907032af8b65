package messages_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestWorkspaceRefValidate(t *testing.T) {
	t.Parallel()
	const d = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for _, tc := range []struct {
		name string
		req  string
		ok   bool
	}{
		{"none", `{"profile":"shell"}`, true},
		{"by digest", `{"profile":"shell","workspace":{"name":"sha256-x.tar","digest":"` + d + `"}}`, true},
		{"bucket", `{"profile":"shell","workspace":{"bucket":"b1","name":"a/b.tar","digest":"` + d + `"}}`, true},
		{"no digest", `{"profile":"shell","workspace":{"name":"x"}}`, false},
		{"upper digest", `{"profile":"shell","workspace":{"name":"x","digest":"sha256:9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"}}`, false},
		{"md5", `{"profile":"shell","workspace":{"name":"x","digest":"md5:00"}}`, false},
		{"no name", `{"profile":"shell","workspace":{"digest":"` + d + `"}}`, false},
		{"space in name", `{"profile":"shell","workspace":{"name":"a b","digest":"` + d + `"}}`, false},
		{"bad bucket", `{"profile":"shell","workspace":{"bucket":"a.b","name":"x","digest":"` + d + `"}}`, false},
		{"unknown field", `{"profile":"shell","workspace":{"name":"x","digest":"` + d + `","path":"/etc"}}`, false},
		{"git", `{"profile":"shell","workspace":{"git":{"url":"https://git.example.com/org/repo.git","ref":"main"}}}`, true},
		{"git no ref", `{"profile":"shell","workspace":{"git":{"url":"http://127.0.0.1:8080/r"}}}`, true},
		{"git full ref", `{"profile":"shell","workspace":{"git":{"url":"https://h/r","ref":"refs/tags/v1.2"}}}`, true},
		{"git and digest", `{"profile":"shell","workspace":{"name":"x","digest":"` + d + `","git":{"url":"https://h/r"}}}`, false},
		{"git and bucket", `{"profile":"shell","workspace":{"bucket":"b","git":{"url":"https://h/r"}}}`, false},
		{"git ssh", `{"profile":"shell","workspace":{"git":{"url":"ssh://git@h/r"}}}`, false},
		{"git scp", `{"profile":"shell","workspace":{"git":{"url":"git@h:r.git"}}}`, false},
		{"git file", `{"profile":"shell","workspace":{"git":{"url":"file:///etc"}}}`, false},
		{"git path", `{"profile":"shell","workspace":{"git":{"url":"/srv/repo"}}}`, false},
		{"git ext", `{"profile":"shell","workspace":{"git":{"url":"ext::sh -c touch% /tmp/pwned"}}}`, false},
		{"git credentials", `{"profile":"shell","workspace":{"git":{"url":"https://u:p@h/r"}}}`, false},
		{"git query", `{"profile":"shell","workspace":{"git":{"url":"https://h/r?x=1"}}}`, false},
		{"git no host", `{"profile":"shell","workspace":{"git":{"url":"https:///r"}}}`, false},
		{"git ref dots", `{"profile":"shell","workspace":{"git":{"url":"https://h/r","ref":"a..b"}}}`, false},
		{"git ref option", `{"profile":"shell","workspace":{"git":{"url":"https://h/r","ref":"--upload-pack=x"}}}`, false},
		{"git commit set", `{"profile":"shell","workspace":{"git":{"url":"https://h/r","commit":"` + strings.Repeat("a", 40) + `"}}}`, false},
		{"git unknown key", `{"profile":"shell","workspace":{"git":{"url":"https://h/r","depth":1}}}`, false},
		{"git key case", `{"profile":"shell","workspace":{"git":{"URL":"https://h/r"}}}`, false},
		{"from", `{"profile":"shell","workspace":{"from":"01JABCDEF"}}`, true},
		{"from and digest", `{"profile":"shell","workspace":{"from":"r1","name":"x","digest":"` + d + `"}}`, false},
		{"from and git", `{"profile":"shell","workspace":{"from":"r1","git":{"url":"https://h/r"}}}`, false},
		{"from and bucket", `{"profile":"shell","workspace":{"from":"r1","bucket":"b"}}`, false},
		{"from not a token", `{"profile":"shell","workspace":{"from":"a.b"}}`, false},
		{"from reserved", `{"profile":"shell","workspace":{"from":"all"}}`, false},
		{"from not a string", `{"profile":"shell","workspace":{"from":{"run":"r1"}}}`, false},
		{"from empty", `{"profile":"shell","workspace":{"from":""}}`, false},
	} {
		_, err := messages.DecodeRunRequest([]byte(tc.req))
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorIs(t, err, messages.ErrInvalidRequest, tc.name)
		}
	}
	require.Equal(t, "sha256-ab.tar", messages.WorkspaceObjectName("sha256:ab"))
	require.Equal(t, "r1/7-2/patch", messages.ResultObjectName("r1", 7, 2, messages.ResultPatch))
}

// TestWorkspaceFromRefusedByOlderDecoder shows what a worker older than
// WorkspaceRef.From does with a request naming an earlier run: its strict
// decoding (DecodeStrictJSON, the same function) refuses the unknown key,
// so the run fails as an invalid request, never on another workspace.
func TestWorkspaceFromRefusedByOlderDecoder(t *testing.T) {
	t.Parallel()
	type oldWorkspace struct {
		Bucket string              `json:"bucket,omitempty"`
		Name   string              `json:"name,omitempty"`
		Digest string              `json:"digest,omitempty"`
		Git    *messages.GitSource `json:"git,omitempty"`
	}
	var old struct {
		Profile   string        `json:"profile"`
		Workspace *oldWorkspace `json:"workspace,omitempty"`
	}
	err := messages.DecodeStrictJSON([]byte(`{"profile":"shell","workspace":{"from":"r1"}}`), &old)
	require.ErrorContains(t, err, "from")
}
