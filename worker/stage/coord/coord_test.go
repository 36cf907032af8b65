package coord

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// TestExitedHoldsRunToBridge covers the coordination stage's rule for a
// run that ends now: a process that exited on its own before its bridge
// connected fails the run, whatever its exit code, when the profile
// requires the bridge and the worker served its socket; a stopped run, a
// workspace that never unpacked, a retry, a proved or connected bridge, an
// opt-out and an unserved socket keep the outcome.
func TestExitedHoldsRunToBridge(t *testing.T) {
	t.Parallel()
	type st struct {
		required bool
		status   string
		proved   bool
	}
	held := st{required: true, status: Available}
	exit := func(state messages.State, reason string) stage.ExitedRequest {
		return stage.ExitedRequest{Final: true, State: state, Reason: reason}
	}
	cases := []struct {
		name  string
		stage st
		req   stage.ExitedRequest
		want  stage.ExitedResponse
	}{
		{"exit 0", held, exit(messages.StateSucceeded, ""),
			stage.ExitedResponse{Fail: true, Reason: ExitedBeforeBridge("exit code 0")}},
		{"exit 3", held, exit(messages.StateFailed, "exit code 3: boom"),
			stage.ExitedResponse{Fail: true, Reason: ExitedBeforeBridge("exit code 3: boom")}},
		{"oom", held, exit(messages.StateFailed, "oom"),
			stage.ExitedResponse{Fail: true, Reason: ExitedBeforeBridge("oom")}},
		{"the MCP server reported connected", st{required: true, status: Available, proved: true}, exit(messages.StateSucceeded, ""), stage.ExitedResponse{}},
		{"require_bridge = false", st{status: Available}, exit(messages.StateSucceeded, ""), stage.ExitedResponse{}},
		{"socket not served", st{required: true, status: Unavailable}, exit(messages.StateSucceeded, ""), stage.ExitedResponse{}},
		{"stopped", held, stage.ExitedRequest{Final: true, State: messages.StateTimedOut, Reason: "timed out after 1s", Stopped: true}, stage.ExitedResponse{}},
		{"retried", held, stage.ExitedRequest{Final: false, Reason: "exit code 3 (attempt 1; the profile allows 1 retries)"}, stage.ExitedResponse{}},
		{"workspace never unpacked", held, stage.ExitedRequest{Final: true, State: messages.StateFailed, Reason: "workspace: x", NotRun: true}, stage.ExitedResponse{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &Stage{required: tc.stage.required, status: tc.stage.status}
			s.proved.Store(tc.stage.proved)
			var resp stage.ExitedResponse
			s.Exited(context.Background(), &tc.req, &resp)
			require.Equal(t, tc.want, resp)
			require.True(t, s.exited.Load())
		})
	}
}
