package runner

import (
	"fmt"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// exitFacts is what supervise saw of a run's end, before any decision: the
// process's exit status, and why the wait ended when the process did not end
// on its own.
type exitFacts struct {
	// Status is the exit status (after the stop, when the run was stopped).
	Status jail.ExitStatus
	// WaitErr is an infrastructure failure waiting for the container (not
	// the run's timeout, not a shutdown); nil otherwise.
	WaitErr error
	// Shutdown: the worker is shutting down hard and stopped the container.
	Shutdown bool
	// Left: the worker is stopping and leaves the run, its container
	// running, to a successor that adopts it (Shutdown is set too).
	Left bool
	// TimedOut: the run's Timeout ran out and the container was stopped.
	TimedOut bool
	Timeout  time.Duration
	// Cancelled: a cancel request stopped the container.
	Cancelled bool
	// Stop is the stop a stage asked for (nil when none did).
	Stop *stage.Stop
	// Result and Summary are the agent CLI's final result and its summary
	// (nil when its output is not parsed).
	Result  string
	Summary *messages.AgentSummary
	// LastErr is the last line of stderr.
	LastErr string
	// OutputBytes is the output published; OutputErr the first publish
	// failure.
	OutputBytes int64
	OutputErr   error
}

// stopped reports whether the process did not exit on its own: a cancel,
// a stage's stop or the timeout stopped it.
func (f exitFacts) stopped() bool { return f.Cancelled || f.Stop != nil || f.TimedOut }

// outcomePolicy is what classify needs besides the facts.
type outcomePolicy struct {
	// Attempt is this delivery's number, from 1.
	Attempt int
	// Retries is how many times the profile retries a failed agent.
	Retries int
	// WorkerID names the worker in a hand-back reason.
	WorkerID string
	// Spec is the container's spec, for diagnosing a jail limit.
	Spec jail.ContainerSpec
}

// action is what becomes of a run once its exit is classified.
type action int

const (
	actionFinal    action = iota // record a final state
	actionRetry                  // hand back for a retry (with backoff; may give up)
	actionHandBack               // hand back at once: the worker shuts down
)

// outcome is a classified exit: what to do, the final state (for
// actionFinal) and the reason (the retry's cause for actionRetry).
type outcome struct {
	Action action
	State  messages.State
	Reason string
	// NotRun is set once a stage's Exited said the agent never ran
	// (stage.ExitedResponse.NotRun); later stages see it.
	NotRun bool
}

// classify turns exit facts into an outcome. It does no I/O. The first rule
// that matches wins:
//   - a cancel request: cancelled; a stop a stage asked for: the state it
//     names (stalled for the stall watchdog, failed for a bridge never
//     reached);
//   - a worker shutdown: hand back; a failed wait: retry;
//   - the timeout: timed_out;
//   - an OOM kill with a non-zero exit: failed
//     "oom" (a child killed while the main process exits 0 succeeds; the
//     state's oom_killed says it happened);
//   - a non-zero exit: failed, with the agent's own error when it reported
//     one, else the exit code and a diagnosis from stderr; retried instead
//     while the profile's retries last;
//   - else succeeded.
//
// It knows no stage: what only a stage can read in the facts (the
// workspace tool's exit line) that stage says in its Exited response
// (amend).
func classify(f exitFacts, p outcomePolicy) outcome {
	switch {
	case f.Cancelled:
		return outcome{Action: actionFinal, State: messages.StateCancelled, Reason: "cancelled by request"}
	case f.Stop != nil:
		return outcome{Action: actionFinal, State: f.Stop.State, Reason: f.Stop.Reason}
	case f.Shutdown:
		return outcome{Action: actionHandBack, Reason: "handed back: worker " + p.WorkerID + " shut down"}
	case f.WaitErr != nil:
		return outcome{Action: actionRetry, Reason: fmt.Sprintf("wait for container: %v", f.WaitErr)}
	case f.TimedOut:
		return outcome{Action: actionFinal, State: messages.StateTimedOut, Reason: fmt.Sprintf("timed out after %s", f.Timeout)}
	case f.Status.OOMKilled && f.Status.Code != 0: // a child's OOM kill alone does not fail the run
		return outcome{Action: actionFinal, State: messages.StateFailed, Reason: "oom"}
	case f.Status.Code == 0:
		return outcome{Action: actionFinal, State: messages.StateSucceeded}
	}
	reason := exitReason(f.Status, f.LastErr, p.Spec)
	if f.Summary != nil && f.Summary.IsError && f.Result != "" {
		reason = fmt.Sprintf("exit code %d: the agent reported: %s", f.Status.Code, runstate.OneLine(f.Result))
	}
	if p.Attempt <= p.Retries {
		// The profile asks for retries of a failed agent: hand the request
		// back (with backoff) instead of ending the run.
		return outcome{Action: actionRetry, Reason: fmt.Sprintf("%s (attempt %d; the profile allows %d retries)", reason, p.Attempt, p.Retries)}
	}
	return outcome{Action: actionFinal, State: messages.StateFailed, Reason: reason}
}

// amend returns o as a stage's Exited response changes it, in this
// order: Retry hands the run back for a retry with the response's reason;
// NotRun ends it failed with that reason, a retry included; Fail ends a
// final outcome failed with it (a retry stays one); a reason alone
// replaces the outcome's. A cancel still wins and a hand-back stays one;
// Retry, NotRun and Fail without a reason change nothing. It does no I/O.
func (o outcome) amend(resp stage.ExitedResponse) outcome {
	decided := o.State == messages.StateCancelled || o.Action == actionHandBack || resp.Reason == ""
	o.NotRun = o.NotRun || resp.NotRun
	switch {
	case resp.Retry:
		if !decided {
			o.Action, o.State, o.Reason = actionRetry, "", resp.Reason
		}
	case resp.NotRun:
		if !decided {
			o.Action, o.State, o.Reason = actionFinal, messages.StateFailed, resp.Reason
		}
	case resp.Fail:
		if o.Action == actionFinal && !decided {
			o.State, o.Reason = messages.StateFailed, resp.Reason
		}
	case resp.Reason != "":
		o.Reason = resp.Reason
	}
	return o
}

// maxResult bounds the result text kept in a run's state, in bytes.
const maxResult = 64 << 10

func clipResult(s string) string {
	if len(s) > maxResult {
		return s[:maxResult]
	}
	return s
}

// exitReason explains a non-zero exit: the code, a diagnosis when stderr
// shows a jail limit was hit, and the last line of stderr.
func exitReason(status jail.ExitStatus, lastErr string, spec jail.ContainerSpec) string {
	reason := fmt.Sprintf("exit code %d", status.Code)
	switch {
	case strings.Contains(lastErr, "No space left on device"):
		reason += fmt.Sprintf(" (no space left on device: a tmpfs is full; /tmp is %s)", tmpfsOptions(spec, "/tmp"))
	case strings.Contains(lastErr, "can't fork"), strings.Contains(lastErr, "Resource temporarily unavailable"),
		strings.Contains(lastErr, "fork: retry"):
		reason += fmt.Sprintf(" (pids limit of %d reached: process creation failed)", spec.PidsLimit)
	}
	if status.Error != "" {
		reason += ": " + status.Error
	}
	if lastErr != "" {
		reason += ": " + lastErr
	}
	return reason
}

// tmpfsOptions returns the options of spec's tmpfs at target, "" when it
// has none.
func tmpfsOptions(spec jail.ContainerSpec, target string) string {
	if t, ok := spec.Tmpfs.Get(target); ok {
		return t.Options()
	}
	return ""
}
