package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// putState stores st in the jetcrew-runs bucket, as a worker would.
func putState(t *testing.T, js jetstream.JetStream, st messages.RunState) {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), messages.BucketRuns)
	require.NoError(t, err)
	st.Version = messages.StateVersion
	data, err := json.Marshal(st)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), st.ID, data)
	require.NoError(t, err)
}

// What submit and submit --attempts say, and how they exit, at each step
// of the sequence they share (check --from, upload --workspace, publish):
// the same words from either, and nothing published after a failed step.
func TestSubmitSequenceErrors(t *testing.T) {
	t.Parallel()
	s, js := provisionedServer(t)
	url := s.ClientURL()
	putState(t, js, messages.RunState{ID: "plain", State: messages.StateSucceeded, Pool: messages.DefaultPool})
	putState(t, js, messages.RunState{ID: "grp-2", State: messages.StateFailed, Pool: messages.DefaultPool, RequestDigest: "sha256:another"})
	missing := filepath.Join(t.TempDir(), "missing")
	usage := "Run 'jetcrew submit --help' for usage.\n"
	secret := filepath.Join(t.TempDir(), "group.secret")
	_, err := dispatcher.CreateGroupSecret(secret)
	require.NoError(t, err)

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"from a run not found", []string{"submit", "--from", "nope", "true"}, exitFailure, "",
			"jetcrew: --from nope: run nope: run not found (a run just submitted has no state until a worker takes it)\n"},
		{"attempts from a run not found", []string{"submit", "--group-secret", secret, "--attempts", "2", "--id", "a1", "--from", "nope", "true"}, exitFailure, "",
			"jetcrew: --from nope: run nope: run not found (a run just submitted has no state until a worker takes it)\n"},
		{"from a run without a result", []string{"submit", "--from", "plain", "true"}, exitUsage, "",
			"jetcrew: --from plain: the run is succeeded and has no workspace result to start from\n" + usage},
		{"attempts from a run without a result", []string{"submit", "--group-secret", secret, "--attempts", "2", "--id", "a2", "--from", "plain", "true"}, exitUsage, "",
			"jetcrew: --from plain: the run is succeeded and has no workspace result to start from\n" + usage},
		{"workspace missing", []string{"submit", "--id", "w1", "--workspace", missing, "true"}, exitFailure, "",
			"jetcrew: workspace " + missing + ": "},
		{"attempts, workspace missing", []string{"submit", "--group-secret", secret, "--attempts", "2", "--id", "w2", "--workspace", missing, "true"}, exitFailure, "",
			"jetcrew: workspace " + missing + ": "},
		{"id in use", []string{"submit", "--id", "grp-2", "true"}, exitFailure, "",
			"jetcrew: submit run grp-2: run id already used by a different request (it is failed): nothing was published; choose a new id, or `jetcrew replay grp-2` to run the recorded request again\n"},
		{"attempts, the second id in use", []string{"submit", "--group-secret", secret, "--attempts", "2", "--id", "grp", "--group", "grp", "-q", "true"}, exitFailure, "grp-1\n",
			"jetcrew: submit run grp-2: run id already used by a different request (it is failed): nothing was published; choose a new id, or `jetcrew replay grp-2` to run the recorded request again (runs grp-1 of group grp were submitted)\n"},
	}
	for _, tt := range tests {
		code, stdout, stderr := cli(t, url, tt.args...)
		require.Equal(t, tt.code, code, "%s: %s", tt.name, stderr)
		require.Equal(t, tt.stdout, stdout, tt.name)
		if strings.HasSuffix(tt.stderr, "\n") {
			require.Equal(t, tt.stderr, stderr, tt.name)
		} else {
			require.True(t, strings.HasPrefix(stderr, tt.stderr), "%s: %s", tt.name, stderr)
		}
	}
	runs, err := js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	info, err := runs.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(1), info.State.Msgs, "only grp-1 was published")
}
