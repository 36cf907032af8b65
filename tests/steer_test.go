package tests

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// steerProfiles: the claude backend (the fixture, taking stream-json on
// standard input through the launcher) and a command backend (the generic
// fixture agent, which takes no input while it runs).
var steerProfiles = `[profiles.claude]
backend = "claude"
image = "` + agentsImage + `"
timeout = "3m"
stall_timeout = "90s"
bridge_deadline = "60s"

[profiles.agent]
image   = "` + agentsImage + `"
command = ["/usr/local/bin/mcp-agent", "{prompt}"]
timeout = "3m"
`

// Steering end to end, real Docker and NATS: `jetcrew send` reaches a
// running claude-backend agent on its standard input mid-run (delivered,
// exit 0) and the agent answers it as a turn of its own; a command-backend
// agent gets the steer in its inbox (queued, exit 3), told so in its tool
// results; a steer to a run that has ended is refused with that reason
// (exit 4).
func TestSteer(t *testing.T) {
	needsDocker(t)
	requireAgentsImage(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(steerProfiles), 0o644))
	url := up(t, "--profiles", profiles)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	cl, cmd := "steer-claude-"+hex.EncodeToString(suffix), "steer-cmd-"+hex.EncodeToString(suffix)

	submitStdin(t, url, "claude", cl, "Wait for the operator, then do what they say.\nfixture: await-steer 90s\n")
	r := run(t, url, jetcrewBin, "submit", "--profile", "agent", "--id", cmd, "expect-note 90s; expect-from operator 10s")
	require.Equal(t, 0, r.code, r.stderr)
	waitRunning(t, url, cl)
	waitRunning(t, url, cmd)

	const text = "change of plan: write the tests first"
	r = run(t, url, jetcrewBin, "send", "--id", "st-1", cl, text)
	require.Equal(t, 0, r.code, "send: %s%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "steer st-1 delivered")

	r = run(t, url, jetcrewBin, "send", cmd, "read this from your inbox")
	require.Equal(t, 3, r.code, "send: %s%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "queued")

	// The claude fixture acted on the steer: a turn of its own answered it,
	// and the run succeeded.
	st := waitFinal(t, url, cl)
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, "fixture claude turn: "+text, st.Result, "the worker read the steer's turn as the run's last answer")
	w := run(t, url, jetcrewBin, "watch", cl)
	require.Contains(t, w.stdout+w.stderr, `"result":"fixture claude turn: `+text+`"`, "the agent's output answers the steer:\n%s", w.stderr)
	_, coord := runEvents(allStreamMessages(t, url), cl)
	var steered []coordination.Event
	for _, ev := range coord {
		if ev.Kind == messages.CoordSteered {
			steered = append(steered, ev)
		}
	}
	require.Len(t, steered, 1)
	require.Equal(t, messages.SteerDelivered, steered[0].Outcome)
	require.Equal(t, "st-1", steered[0].SteerID)

	// The command agent was told in a tool result, then read it.
	rep, _ := finishedAgent(t, url, cmd, cmd)
	require.Equal(t, []string{"read this from your inbox"}, rep.from(messages.RecipientOperator))
	w = run(t, url, jetcrewBin, "watch", cmd)
	var notes struct {
		Notes []string `json:"notes"`
	}
	require.NoError(t, json.Unmarshal([]byte(w.stdout), &notes))
	require.NotEmpty(t, notes.Notes)

	// Ended: refused, with the reason.
	r = run(t, url, jetcrewBin, "send", cl, "too late")
	require.Equal(t, 4, r.code, "send: %s%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "refused (ended): run "+cl+" has ended (succeeded)")
}
