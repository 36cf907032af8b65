package tests

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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

// Steering races in real containers (issue 36): claude-backend runs whose
// agent takes a first steer mid-turn and works on for two seconds, while a
// second steer lands within that turn. The fixture CLI starts no turn, once
// its input has ended, for a message it read but had not begun, so a
// launcher that closed the input after the first steer's turn would lose
// the second. Each steer is delivered as a turn of its own (or reported
// queued), and every run succeeds with the second steer's turn as its
// answer.
func TestSteerTwoWithinATurnInContainers(t *testing.T) {
	needsDocker(t)
	requireAgentsImage(t)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(steerProfiles), 0o644))
	url := up(t, "--profiles", profiles)
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	const trials = 3
	var ids []string
	for i := range trials {
		id := fmt.Sprintf("steer-two-%d-%s", i, hex.EncodeToString(suffix))
		ids = append(ids, id)
		submitStdin(t, url, "claude", id, "Wait for the operator.\nfixture: await-steer 90s\nfixture: linger 2s\n")
	}
	send := func(id, steerID, text string) messages.SteerReply {
		m := nats.NewMsg(messages.SubjectSteer(id))
		m.Header.Set(messages.HeaderSteerID, steerID)
		m.Data = []byte(text)
		resp, err := nc.RequestMsg(m, 15*time.Second)
		require.NoError(t, err)
		var r messages.SteerReply
		require.NoError(t, json.Unmarshal(resp.Data, &r))
		return r
	}
	replies := map[string][2]messages.SteerReply{}
	for _, id := range ids {
		waitRunning(t, url, id)
		var r [2]messages.SteerReply
		r[0] = send(id, "s1", "first steer of "+id)
		require.Equal(t, messages.SteerDelivered, r[0].Outcome, r[0].Reason)
		r[1] = send(id, "s2", "second steer of "+id)
		replies[id] = r
	}
	for _, id := range ids {
		st := waitFinal(t, url, id)
		require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", id, st.Reason)
		w := run(t, url, jetcrewBin, "watch", id)
		first, second := replies[id][0], replies[id][1]
		require.Contains(t, w.stdout+w.stderr, `"result":"fixture claude turn: first steer of `+id+`"`)
		switch second.Outcome {
		case messages.SteerDelivered:
			require.Contains(t, w.stdout+w.stderr, `"result":"fixture claude turn: second steer of `+id+`"`,
				"%s: the second steer was delivered but the agent never took it as a turn", id)
			require.Equal(t, "fixture claude turn: second steer of "+id, st.Result)
		case messages.SteerQueued:
			require.NotEmpty(t, second.MessageID)
		default:
			t.Fatalf("%s: second steer %+v", id, second)
		}
		require.Equal(t, messages.SteerDelivered, first.Outcome)
	}
}
