package runner

import (
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
)

// TestClassify covers every branch of the outcome classification: cancel,
// each watchdog, shutdown hand-back, a failed wait, timeout, OOM, exit codes
// (with and without the agent's own error, with each stderr diagnosis), and
// the profile's retries left or not. The workspace tool's exit line is the
// workspace stage's to read (TestWorkspaceExit).
func TestClassify(t *testing.T) {
	t.Parallel()
	spec := jail.ContainerSpec{PidsLimit: 64, Tmpfs: jail.TmpfsMounts{{Target: "/tmp", SizeBytes: 64 << 20, Mode: 0o1777}}}
	pol := outcomePolicy{Attempt: 1, Retries: 0, WorkerID: "w1", Spec: spec}
	withRetries := pol
	withRetries.Retries = 1
	lastTry := withRetries
	lastTry.Attempt = 2
	exit := func(code int) jail.ExitStatus { return jail.ExitStatus{Code: code} }
	agentErr := &messages.AgentSummary{IsError: true}
	final := func(st messages.State, reason string) outcome {
		return outcome{Action: actionFinal, State: st, Reason: reason}
	}
	cases := []struct {
		name string
		f    exitFacts
		p    outcomePolicy
		want outcome
	}{
		{"exit 0", exitFacts{Status: exit(0)}, pol, final(messages.StateSucceeded, "")},
		{"exit 3", exitFacts{Status: exit(3)}, pol, final(messages.StateFailed, "exit code 3")},
		{"exit 3 with stderr", exitFacts{Status: exit(3), LastErr: "boom"}, pol, final(messages.StateFailed, "exit code 3: boom")},
		{"exit with runtime error", exitFacts{Status: jail.ExitStatus{Code: 1, Error: "oci"}}, pol, final(messages.StateFailed, "exit code 1: oci")},
		{"tmpfs full", exitFacts{Status: exit(1), LastErr: "write: No space left on device"}, pol,
			final(messages.StateFailed, "exit code 1 (no space left on device: a tmpfs is full; /tmp is size=64m,mode=1777): write: No space left on device")},
		{"pids limit", exitFacts{Status: exit(2), LastErr: "sh: can't fork"}, pol,
			final(messages.StateFailed, "exit code 2 (pids limit of 64 reached: process creation failed): sh: can't fork")},
		{"agent reported error", exitFacts{Status: exit(1), Summary: agentErr, Result: "bad\nthing", LastErr: "x"}, pol,
			final(messages.StateFailed, "exit code 1: the agent reported: bad thing")},
		{"agent error without result", exitFacts{Status: exit(1), Summary: agentErr}, pol, final(messages.StateFailed, "exit code 1")},
		{"agent error but exit 0", exitFacts{Status: exit(0), Summary: agentErr, Result: "r"}, pol, final(messages.StateSucceeded, "")},
		{"oom", exitFacts{Status: jail.ExitStatus{Code: 137, OOMKilled: true}}, withRetries, final(messages.StateFailed, "oom")},
		{"timeout", exitFacts{Status: exit(143), TimedOut: true, Timeout: 2 * time.Second}, withRetries,
			final(messages.StateTimedOut, "timed out after 2s")},
		{"stalled", exitFacts{Status: exit(143), Stop: &stage.Stop{State: messages.StateStalled, Reason: "no progress"}}, withRetries,
			final(messages.StateStalled, "no progress")},
		{"bridge not reached", exitFacts{Status: exit(143), Stop: &stage.Stop{State: messages.StateFailed, Reason: "no bridge"}}, withRetries,
			final(messages.StateFailed, "no bridge")},
		{"cancel wins over a watchdog", exitFacts{Status: exit(143), Cancelled: true, Stop: &stage.Stop{State: messages.StateStalled}}, pol,
			final(messages.StateCancelled, "cancelled by request")},
		{"cancel wins over shutdown", exitFacts{Status: exit(143), Cancelled: true, Shutdown: true}, pol,
			final(messages.StateCancelled, "cancelled by request")},
		{"shutdown hands back", exitFacts{Status: exit(143), Shutdown: true}, pol,
			outcome{Action: actionHandBack, Reason: "handed back: worker w1 shut down"}},
		{"wait failed: retry", exitFacts{WaitErr: errors.New("engine gone")}, pol,
			outcome{Action: actionRetry, Reason: "wait for container: engine gone"}},
		{"retries left", exitFacts{Status: exit(3)}, withRetries,
			outcome{Action: actionRetry, Reason: "exit code 3 (attempt 1; the profile allows 1 retries)"}},
		{"no retries left", exitFacts{Status: exit(3)}, lastTry, final(messages.StateFailed, "exit code 3")},
		{"exit 121 without the line is the agent's", exitFacts{Status: exit(121), LastErr: "mine"}, pol, final(messages.StateFailed, "exit code 121: mine")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, classify(tc.f, tc.p))
		})
	}
}

// TestAmend covers how a stage's Exited response changes a classified
// outcome: a reason replaces the outcome's; Fail ends a final outcome
// failed with the response's reason, but not a cancel, a retry or a
// hand-back, nor without a reason; NotRun ends a retry failed too, and
// Retry hands a final outcome back, neither over a cancel or a hand-back.
func TestAmend(t *testing.T) {
	t.Parallel()
	final := func(st messages.State, reason string) outcome {
		return outcome{Action: actionFinal, State: st, Reason: reason}
	}
	retry := outcome{Action: actionRetry, Reason: "exit code 3 (attempt 1; the profile allows 1 retries)"}
	handBack := outcome{Action: actionHandBack, Reason: "handed back: worker w1 shut down"}
	blind := stage.ExitedResponse{Fail: true, Reason: "no bridge: exit code 0"}
	notRun := stage.ExitedResponse{NotRun: true, Reason: "workspace: x"}
	again := stage.ExitedResponse{NotRun: true, Retry: true, Reason: "workspace: not held"}
	cases := []struct {
		name string
		o    outcome
		resp stage.ExitedResponse
		want outcome
	}{
		{"nothing", final(messages.StateSucceeded, ""), stage.ExitedResponse{}, final(messages.StateSucceeded, "")},
		{"reason", final(messages.StateFailed, "exit code 1"), stage.ExitedResponse{Reason: "exit code 1 (full)"}, final(messages.StateFailed, "exit code 1 (full)")},
		{"fail a success", final(messages.StateSucceeded, ""), blind, final(messages.StateFailed, "no bridge: exit code 0")},
		{"fail a failure", final(messages.StateFailed, "exit code 3"), blind, final(messages.StateFailed, "no bridge: exit code 0")},
		{"fail an oom", final(messages.StateFailed, "oom"), blind, final(messages.StateFailed, "no bridge: exit code 0")},
		{"fail a timeout", final(messages.StateTimedOut, "timed out after 2s"), blind, final(messages.StateFailed, "no bridge: exit code 0")},
		{"a cancel wins", final(messages.StateCancelled, "cancelled by request"), blind, final(messages.StateCancelled, "cancelled by request")},
		{"a retry stays", retry, blind, retry},
		{"a hand-back stays", handBack, blind, handBack},
		{"fail without a reason", final(messages.StateSucceeded, ""), stage.ExitedResponse{Fail: true}, final(messages.StateSucceeded, "")},
		{"not run kept", outcome{Action: actionFinal, State: messages.StateFailed, Reason: "workspace: x", NotRun: true}, blind,
			outcome{Action: actionFinal, State: messages.StateFailed, Reason: "no bridge: exit code 0", NotRun: true}},
		{"not run fails a success", final(messages.StateSucceeded, ""), notRun, outcome{Action: actionFinal, State: messages.StateFailed, Reason: "workspace: x", NotRun: true}},
		{"not run fails a retry", retry, notRun, outcome{Action: actionFinal, State: messages.StateFailed, Reason: "workspace: x", NotRun: true}},
		{"not run: a cancel wins", final(messages.StateCancelled, "cancelled by request"), notRun,
			outcome{Action: actionFinal, State: messages.StateCancelled, Reason: "cancelled by request", NotRun: true}},
		{"not run without a reason", final(messages.StateSucceeded, ""), stage.ExitedResponse{NotRun: true}, outcome{Action: actionFinal, State: messages.StateSucceeded, NotRun: true}},
		{"retry a failure", final(messages.StateFailed, "exit code 121"), again, outcome{Action: actionRetry, Reason: "workspace: not held", NotRun: true}},
		{"retry: a hand-back stays", handBack, again, outcome{Action: actionHandBack, Reason: "handed back: worker w1 shut down", NotRun: true}},
		{"retry: a cancel wins", final(messages.StateCancelled, "cancelled by request"), again,
			outcome{Action: actionFinal, State: messages.StateCancelled, Reason: "cancelled by request", NotRun: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.o.amend(tc.resp))
		})
	}
}

// TestWorkspaceExit covers the exits only the workspace stage can read:
// the engine classifies the plain facts, the workspace stage's Exited reads
// the in-jail tool's exit line (exit code 121, its line last on stderr)
// and amends the outcome. A snapshot that did not unpack fails the run,
// never retried, the profile's retries notwithstanding; one the worker
// failed to hold or fetch is retried; the line after a stop, or without
// the tool's exit code, is the agent's.
func TestWorkspaceExit(t *testing.T) {
	t.Parallel()
	pol := outcomePolicy{Attempt: 1, Retries: 0, WorkerID: "w1"}
	withRetries := pol
	withRetries.Retries = 1
	exit := func(code int) jail.ExitStatus { return jail.ExitStatus{Code: code} }
	cases := []struct {
		name string
		f    exitFacts
		p    outcomePolicy
		mib  int64
		want outcome
	}{
		{"unpack: no space, never retried", exitFacts{Status: exit(121), LastErr: "jetcrew workspace: unpack failed (no-space): write a: no space left on device"}, withRetries, 2,
			outcome{Action: actionFinal, State: messages.StateFailed, NotRun: true,
				Reason: "workspace: too large: the snapshot does not fit the profile's workspace_mib (2 MiB)"}},
		{"unpack: bad archive", exitFacts{Status: exit(121), LastErr: "jetcrew workspace: unpack failed (bad-archive): not a valid workspace snapshot: x"}, withRetries, 2,
			outcome{Action: actionFinal, State: messages.StateFailed, NotRun: true, Reason: "workspace: not a valid workspace snapshot: x"}},
		{"unpack: other", exitFacts{Status: exit(121), LastErr: "jetcrew workspace: unpack failed (error): open: EIO"}, pol, 2,
			outcome{Action: actionFinal, State: messages.StateFailed, NotRun: true, Reason: "workspace: unpack failed: open: EIO"}},
		{"unpack: not held in time, retried", exitFacts{Status: exit(121), LastErr: "jetcrew workspace: unpack failed (not-held): the workspace was not held by a capture container within 10m0s"}, pol, 2,
			outcome{Action: actionRetry, NotRun: true, Reason: "workspace: the workspace was not held by a capture container within 10m0s"}},
		{"unpack: snapshot not fetched, retried", exitFacts{Status: exit(121), LastErr: "jetcrew workspace: unpack failed (fetch): the worker could not fetch the snapshot"}, pol, 2,
			outcome{Action: actionRetry, NotRun: true, Reason: "workspace: the worker could not fetch the snapshot"}},
		{"oom while unpacking", exitFacts{Status: jail.ExitStatus{Code: 121, OOMKilled: true}, LastErr: "jetcrew workspace: unpack failed (error): open: EIO"}, pol, 2,
			outcome{Action: actionFinal, State: messages.StateFailed, NotRun: true, Reason: "workspace: unpack failed: open: EIO"}},
		{"exit 121 without the line is the agent's", exitFacts{Status: exit(121), LastErr: "mine"}, pol, 2, outcome{Action: actionFinal, State: messages.StateFailed, Reason: "exit code 121: mine"}},
		{"the line with another code is the agent's", exitFacts{Status: exit(1), LastErr: "jetcrew workspace: unpack failed (error): x"}, pol, 2,
			outcome{Action: actionFinal, State: messages.StateFailed, Reason: "exit code 1: jetcrew workspace: unpack failed (error): x"}},
		{"a timeout wins", exitFacts{Status: exit(121), TimedOut: true, Timeout: time.Second, LastErr: "jetcrew workspace: unpack failed (error): x"}, pol, 2,
			outcome{Action: actionFinal, State: messages.StateTimedOut, Reason: "timed out after 1s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &profile.Profile{WorkspaceConfig: profile.WorkspaceConfig{WorkspaceMiB: tc.mib}}
			sr := &stage.Run{Request: messages.RunRequest{ID: "r1", Workspace: &messages.WorkspaceRef{Name: "w"}}, Profile: p, Log: zerolog.Nop()}
			r := &run{sr: sr, stages: []stage.Stage{tree.New(tree.Deps{}).For(sr)}}
			require.Equal(t, tc.want, r.exited(t.Context(), classify(tc.f, tc.p), tc.f))
		})
	}
}
