package messages_test

import (
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
