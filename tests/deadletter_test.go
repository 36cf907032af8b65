package tests

// Dead letters, replay and cancel, end to end: the built jetcrew binary, real
// Docker, and the stock NATS CLI running exactly the commands the README
// documents ("Failed runs, replay and cancel").

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// readmeNATSSection is the README heading whose sh block lists the nats-only
// commands.
const readmeNATSSection = "### With the nats CLI alone"

// readmeNATSCommands returns the command lines of the first sh block after
// readmeNATSSection in README.md (comments and blank lines left out).
func readmeNATSCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n"+readmeNATSSection+"\n")
	require.True(t, ok, "README.md has no %q section", readmeNATSSection)
	_, rest, ok = strings.Cut(rest, "```sh\n")
	require.True(t, ok, "no sh block in README section %q", readmeNATSSection)
	block, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmds = append(cmds, line)
	}
	return cmds
}

// readmeCommands are the README's nats-only commands, each found by its
// start; TestDeadLetterREADMECommandsAllTested checks that no line of the
// block goes untested.
var readmeCommands = map[string]string{
	"view":   "nats stream view ",
	"all":    "nats sub --stream JETCREW_FAILED --all ",
	"get":    "nats stream get ",
	"replay": "nats sub --stream JETCREW_FAILED --last-per-subject ",
	"state":  "nats kv get ",
	"cancel": "nats req jetcrew.cancel.",
}

// readmeCommand returns the README's command named by key, for run id.
func readmeCommand(t *testing.T, key, id string) string {
	t.Helper()
	prefix := readmeCommands[key]
	require.NotEmpty(t, prefix, key)
	var found []string
	for _, c := range readmeNATSCommands(t) {
		if strings.HasPrefix(c, prefix) {
			found = append(found, c)
		}
	}
	require.Len(t, found, 1, "README section %q: want one command starting %q", readmeNATSSection, prefix)
	return strings.ReplaceAll(found[0], "RUN_ID", id)
}

// shell runs a documented command line with bash, as an operator would,
// with NATS_URL set and the nats CLI on PATH.
func shell(t *testing.T, url, line string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -o pipefail; "+line)
	cmd.Env = append(os.Environ(), "NATS_URL="+url, "PATH="+filepath.Dir(natsBin)+":"+os.Getenv("PATH"))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err, line)
	}
	return result{o.String(), e.String(), code}
}

// inTerminal runs an interactive command line in a pseudo-terminal, with
// script(1), the way it runs at an operator's terminal.
func inTerminal(t *testing.T, url, line string) result {
	t.Helper()
	_, err := exec.LookPath("script")
	require.NoError(t, err, "script(1) (util-linux) runs the README's interactive commands in a terminal")
	quoted := "'" + strings.ReplaceAll(line, "'", `'\''`) + "'"
	return shell(t, url, "script -qec "+quoted+" /dev/null </dev/null")
}

// opsSuffix returns a short random suffix for run ids unique to one test.
func opsSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// subjectCount returns how many messages stream holds on subject.
func subjectCount(t *testing.T, js jetstream.JetStream, stream, subject string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	require.NoError(t, err)
	info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

// natsClient connects the test itself to url.
func natsClient(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

// waitState polls the run's state (jetcrew status --json) until ok accepts it.
func waitState(t *testing.T, url, id string, ok func(messages.RunState) bool) messages.RunState {
	t.Helper()
	var st messages.RunState
	require.Eventually(t, func() bool {
		r := run(t, url, jetcrewBin, "status", "--json", id)
		if r.code != 0 {
			return false
		}
		st = messages.RunState{}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
		return ok(st)
	}, time.Minute, 100*time.Millisecond, "run %s: last state %+v", id, st)
	return st
}

// waitDeadLetters waits until run id of the default pool has n dead letters:
// a worker stores one just after the run's finished event.
func waitDeadLetters(t *testing.T, js jetstream.JetStream, id string, n uint64) {
	t.Helper()
	require.Eventually(t, func() bool {
		return subjectCount(t, js, messages.StreamFailed, messages.SubjectFailed(messages.DefaultPool, id)) == n
	}, 10*time.Second, 50*time.Millisecond, "run %s: want %d dead letters", id, n)
}

// flakyPrompt fails (exit 3) before the Unix time deadline and succeeds
// after it: a transient failure that a later replay gets past.
func flakyPrompt(deadline int64) string {
	return fmt.Sprintf(`now=$(date +%%s); if [ "$now" -lt %d ]; then echo "too early: $now" >&2; exit 3; fi; echo "ran at $now"`, deadline)
}

// sleepUntil waits until the Unix time deadline has passed.
func sleepUntil(deadline int64) {
	time.Sleep(time.Until(time.Unix(deadline+1, 0)))
}

func TestDeadLetterREADMECommandsAllTested(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	for _, c := range readmeNATSCommands(t) {
		used := false
		for _, prefix := range readmeCommands {
			used = used || strings.HasPrefix(c, prefix)
		}
		require.True(t, used, "README command %q is run by no test: add it to readmeCommands", c)
	}
}

// A failed run is found, inspected and replayed with the nats CLI alone,
// with exactly the README's commands; a replay of a run that succeeded is
// refused visibly (a duplicate event, the state untouched).
func TestDeadLetterNATSCLIReplay(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	url := up(t)
	js := natsClient(t, url)
	id := "dl-nats-" + opsSuffix(t)
	deadline := time.Now().Add(6 * time.Second).Unix()

	r := run(t, url, jetcrewBin, "submit", "--id", id, "--wait", flakyPrompt(deadline))
	require.Equal(t, 3, r.code, "the first run must fail before the deadline (a very slow machine?): %s", r.stderr)
	require.Contains(t, r.stderr, "too early")
	waitDeadLetters(t, js, id, 1)

	// Find it.
	v := inTerminal(t, url, readmeCommand(t, "view", id))
	require.Equal(t, 0, v.code, v.stdout+v.stderr)
	require.Contains(t, v.stdout, messages.SubjectFailed("default", id))
	require.Contains(t, v.stdout, "Jetcrew-Error: exit code 3")

	a := shell(t, url, readmeCommand(t, "all", id))
	require.Equal(t, 0, a.code, a.stderr)
	require.Contains(t, a.stdout, "subject: "+messages.SubjectFailed("default", id))
	require.Contains(t, a.stdout, "Jetcrew-Error: exit code 3")

	g := shell(t, url, readmeCommand(t, "get", id))
	require.Equal(t, 0, g.code, g.stderr)
	for _, want := range []string{
		"Jetcrew-Error: exit code 3", "Jetcrew-State: failed", "Jetcrew-Attempts: 1",
		"Jetcrew-Exit-Code: 3", "Jetcrew-Run-Id: " + id, `"id":"` + id + `"`,
	} {
		require.Contains(t, g.stdout, want)
	}

	// Replay it once the transient cause is gone.
	sleepUntil(deadline)
	p := shell(t, url, readmeCommand(t, "replay", id))
	require.Equal(t, 0, p.code, p.stderr)
	st := waitState(t, url, id, func(st messages.RunState) bool { return st.Replays == 1 && st.State.Final() })
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, 1, st.Replays)
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 0, *st.ExitCode)

	k := shell(t, url, readmeCommand(t, "state", id))
	require.Equal(t, 0, k.code, k.stderr)
	var kst messages.RunState
	require.NoError(t, json.Unmarshal([]byte(k.stdout), &kst), k.stdout)
	require.Equal(t, messages.StateSucceeded, kst.State)
	require.Equal(t, 1, kst.Replays)

	// The replay ran: its output is among the run's events.
	w := run(t, url, jetcrewBin, "watch", id)
	require.Equal(t, 0, w.code, w.stderr)
	require.Contains(t, w.stdout, "ran at")

	// Replaying a run that succeeded is refused, visibly: acked unrun, with
	// a duplicate event, its state untouched.
	require.Zero(t, subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(id, messages.EventDuplicate)))
	p = shell(t, url, readmeCommand(t, "replay", id))
	require.Equal(t, 0, p.code, p.stderr)
	require.Eventually(t, func() bool {
		return subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(id, messages.EventDuplicate)) == 1
	}, 30*time.Second, 100*time.Millisecond)
	after := status(t, url, id)
	require.Equal(t, st.StreamSeq, after.StreamSeq)
	require.Equal(t, messages.StateSucceeded, after.State)
	require.Equal(t, 1, after.Replays)
	require.Equal(t, uint64(1), subjectCount(t, js, messages.StreamFailed, messages.SubjectFailed("default", id)), "one dead letter: the first run's")
}

// jetcrew failed lists dead letters; jetcrew replay --wait runs one again
// and follows it; a succeeded run is refused; replaying a dead letter twice
// runs it once.
func TestReplayCLI(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	url := up(t)
	js := natsClient(t, url)
	sfx := opsSuffix(t)
	flaky, always := "replay-flaky-"+sfx, "replay-always-"+sfx
	deadline := time.Now().Add(6 * time.Second).Unix()

	r := run(t, url, jetcrewBin, "submit", "--id", flaky, "--wait", flakyPrompt(deadline))
	require.Equal(t, 3, r.code, "the first run must fail before the deadline (a very slow machine?): %s", r.stderr)
	r = run(t, url, jetcrewBin, "submit", "--id", always, "--wait", `sleep 3; echo no luck >&2; exit 7`)
	require.Equal(t, 7, r.code, r.stderr)
	waitDeadLetters(t, js, flaky, 1)
	waitDeadLetters(t, js, always, 1)

	f := run(t, url, jetcrewBin, "failed", "--json")
	require.Equal(t, 0, f.code, f.stderr)
	var entries []struct {
		RunID    string          `json:"run_id"`
		State    messages.State  `json:"state"`
		ExitCode *int            `json:"exit_code"`
		Attempts int             `json:"attempts"`
		Reason   string          `json:"reason"`
		Request  json.RawMessage `json:"request"`
		Time     time.Time       `json:"time"`
	}
	require.NoError(t, json.Unmarshal([]byte(f.stdout), &entries), f.stdout)
	require.Len(t, entries, 2)
	require.Equal(t, flaky, entries[0].RunID)
	require.Equal(t, messages.StateFailed, entries[0].State)
	require.Equal(t, 3, *entries[0].ExitCode)
	require.Equal(t, 1, entries[0].Attempts)
	require.Contains(t, entries[0].Reason, "exit code 3")
	require.Contains(t, entries[0].Reason, "too early")
	require.False(t, entries[0].Time.IsZero())
	var req messages.RunRequest
	require.NoError(t, json.Unmarshal(entries[0].Request, &req))
	require.Equal(t, flaky, req.ID)
	require.Equal(t, 7, *entries[1].ExitCode)

	h := run(t, url, jetcrewBin, "failed")
	require.Equal(t, 0, h.code, h.stderr)
	require.Regexp(t, flaky+`\s+failed\s+3\s+1\s+failing\s+exit code 3`, h.stdout)

	sleepUntil(deadline)
	r = run(t, url, jetcrewBin, "replay", "--wait", flaky)
	require.Equal(t, 0, r.code, "stdout=%s stderr=%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "ran at")
	require.NotContains(t, r.stderr, "finished: failed", "only the replay's events are followed")
	require.Equal(t, 1, strings.Count(r.stderr, "--- started:"), "only the replay's events are followed")
	require.Contains(t, r.stderr, "--- replayed run "+flaky)
	require.Contains(t, r.stderr, "--- finished: succeeded")
	st := status(t, url, flaky)
	require.Equal(t, messages.StateSucceeded, st.State)
	require.Equal(t, 1, st.Replays)

	r = run(t, url, jetcrewBin, "replay", flaky)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "replay refused")
	require.Contains(t, r.stderr, "already succeeded")

	// Twice in a row: the second is deduplicated (same Nats-Msg-Id) or
	// refused (the first is queued or running); either way it runs once.
	r1 := run(t, url, jetcrewBin, "replay", always)
	require.Equal(t, 0, r1.code, r1.stderr)
	r2 := run(t, url, jetcrewBin, "replay", always)
	if r2.code == 0 {
		require.Contains(t, r2.stdout, "already replayed")
	} else {
		require.Contains(t, r2.stderr, "replay refused")
	}
	st = waitState(t, url, always, func(st messages.RunState) bool { return st.Replays >= 1 && st.State.Final() })
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, 7, *st.ExitCode)
	time.Sleep(time.Second) // a second run, were there one, would have started
	st = status(t, url, always)
	require.Equal(t, 1, st.Replays)
	waitDeadLetters(t, js, always, 2) // the first run's and the replay's
}

// Cancel with the README's `nats req` on a running run, and with jetcrew on
// a queued one.
func TestCancelNATSCLI(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	url := up(t, "--concurrency", "1")
	js := natsClient(t, url)
	sfx := opsSuffix(t)
	running, queued := "cancel-running-"+sfx, "cancel-queued-"+sfx

	r := run(t, url, jetcrewBin, "submit", "--id", running, "sleep 60")
	require.Equal(t, 0, r.code, r.stderr)
	waitState(t, url, running, func(st messages.RunState) bool { return st.State == messages.StateRunning })
	// The worker's one slot is taken: this run stays queued.
	r = run(t, url, jetcrewBin, "submit", "--id", queued, "echo must never run")
	require.Equal(t, 0, r.code, r.stderr)

	c := run(t, url, jetcrewBin, "cancel", queued)
	require.Equal(t, 0, c.code, c.stderr)
	require.Contains(t, c.stdout, "run "+queued+" cancelled:")
	require.Equal(t, messages.StateCancelled, status(t, url, queued).State)

	start := time.Now()
	q := shell(t, url, readmeCommand(t, "cancel", running))
	require.Equal(t, 0, q.code, q.stderr)
	var reply messages.CancelReply
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(q.stdout)), &reply), q.stdout)
	require.Equal(t, messages.CancelStopping, reply.Result)
	require.Equal(t, running, reply.RunID)

	st := waitFinal(t, url, running)
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, 143, *st.ExitCode, "SIGTERM: 128+15")
	require.Equal(t, "cancelled by request", st.Reason)
	require.Less(t, time.Since(start), 30*time.Second)

	// The queued run's request is delivered now and skipped: it never ran.
	require.Eventually(t, func() bool {
		s, err := js.Stream(t.Context(), messages.StreamRuns)
		require.NoError(t, err)
		info, err := s.Info(t.Context())
		require.NoError(t, err)
		return info.State.Msgs == 0
	}, 30*time.Second, 100*time.Millisecond)
	st = status(t, url, queued)
	require.Equal(t, messages.StateCancelled, st.State)
	require.Nil(t, st.ExitCode)
	require.Zero(t, subjectCount(t, js, messages.StreamEvents, messages.SubjectEvents(queued, messages.EventStarted)))

	// Cancelled runs leave no dead letter; cancelling again changes nothing.
	require.Zero(t, subjectCount(t, js, messages.StreamFailed, messages.SubjectFailed("default", running)))
	c = run(t, url, jetcrewBin, "cancel", running)
	require.Equal(t, 0, c.code, c.stderr)
	require.Contains(t, c.stdout, "already_final")
	require.Eventually(t, func() bool {
		out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=io.jetcrew.run-id="+running).Output()
		return err == nil && strings.TrimSpace(string(out)) == ""
	}, 30*time.Second, 100*time.Millisecond)
}
