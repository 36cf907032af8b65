package bridgecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// lineWriter stands for the launcher's standard output: it calls onLine
// with each whole line, and holds each turn's end for hold before it
// returns (a slow reader of the agent's output delays the launcher's
// turn accounting).
type lineWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	all    bytes.Buffer
	hold   time.Duration
	onLine func(line string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.all.Write(p)
	w.buf.Write(p)
	var lines []string
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		lines = append(lines, string(w.buf.Next(i+1)))
	}
	w.mu.Unlock()
	for _, l := range lines {
		if w.onLine != nil {
			w.onLine(l)
		}
		if w.hold > 0 && strings.Contains(l, `"type":"result"`) {
			time.Sleep(w.hold)
		}
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// sendSteer sends one steer as an operator does and decodes the reply.
func sendSteer(nc *nats.Conn, runID, id, text string) (messages.SteerReply, time.Duration, error) {
	m := nats.NewMsg(messages.SubjectSteer(runID))
	m.Header.Set(messages.HeaderSteerID, id)
	m.Data = []byte(text)
	start := time.Now()
	resp, err := nc.RequestMsg(m, 15*time.Second)
	if err != nil {
		return messages.SteerReply{}, time.Since(start), err
	}
	var r messages.SteerReply
	err = json.Unmarshal(resp.Data, &r)
	return r, time.Since(start), err
}

// steerTrial is one launcher run against a real coordination session: the
// strict CLI as the agent, steers sent while it runs.
type steerTrial struct {
	runID string
	// firstTurn is how long the prompt's turn takes.
	firstTurn time.Duration
	// after > 0: one steer, sent after-1 ms after the prompt's turn ended
	// (the CLI printed its result); 0: two steers at once, within the
	// prompt's turn.
	after int
	// hold delays the launcher's reading of each turn's end.
	hold time.Duration
}

type steerSent struct {
	text  string
	reply messages.SteerReply
	took  time.Duration
	err   error
}

// run runs the trial and checks what every steer became: delivered means
// the CLI answered it with a turn of its own; queued means it is in the
// inbox; refused is allowed only as finishing (the input had closed).
// Nothing is lost, nothing waits the whole ack timeout, and no write hits
// a closed input.
func (tr steerTrial) run(t *testing.T, h *coordination.Host, nc *nats.Conn, dir string, tally func(after bool, o messages.SteerOutcome)) {
	s, err := h.Serve(context.Background(), coordination.RunInfo{RunID: tr.runID, Group: "g", Profile: "claude"}, coordtest.SocketPath(dir, tr.runID))
	require.NoError(t, err)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	}()
	require.NoError(t, s.SetState(context.Background(), messages.StateRunning))
	s.SetSteerInput(true)

	var (
		mu   sync.Mutex
		sent []*steerSent
		wg   sync.WaitGroup
	)
	fire := func(delay time.Duration, texts ...string) {
		wg.Go(func() {
			if delay > 0 {
				time.Sleep(delay)
			}
			for i, text := range texts {
				st := &steerSent{text: text}
				st.reply, st.took, st.err = sendSteer(nc, tr.runID, fmt.Sprintf("%s-%d", tr.runID, i), text)
				mu.Lock()
				sent = append(sent, st)
				mu.Unlock()
			}
		})
	}
	out := &lineWriter{hold: tr.hold}
	var once sync.Once
	if tr.after > 0 {
		out.onLine = func(l string) {
			if strings.Contains(l, `"type":"result"`) {
				once.Do(func() { fire(time.Duration(tr.after-1)*time.Millisecond, "after the turn "+tr.runID) })
			}
		}
	} else {
		fire(0, "first of two "+tr.runID, "second of two "+tr.runID)
	}

	exe, err := os.Executable()
	require.NoError(t, err)
	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("the task "+tr.runID), 0o600))
	env := append(os.Environ(), envStrictCLI+"=1", envStrictCLIFirstTurn+"="+tr.firstTurn.String())
	var errb bytes.Buffer
	start := time.Now()
	code := launchSteered(exe, []string{exe}, env, prompt, steerFormats[messages.SteerInputClaude], socketClient(t, s.SocketPath(), relay.ReconnectWindow), out, &errb)
	took := time.Since(start)
	wg.Wait()

	require.Equal(t, 0, code, "%s: %s", tr.runID, errb.String())
	require.Less(t, took, 10*time.Second, "%s: the launcher waited for a turn that never came", tr.runID)
	require.NotContains(t, errb.String(), "write to the agent's input", tr.runID)
	got := out.String()
	require.Contains(t, got, `"result":"turn: the task `+tr.runID+`"`)
	require.NotEmpty(t, sent, tr.runID)
	for _, st := range sent {
		require.NoError(t, st.err, tr.runID)
		r := st.reply
		require.NotContains(t, r.Reason, "pipe", "%s: a steer was written to a closed input", tr.runID)
		require.Less(t, st.took, coordination.SteerAckTimeout, "%s: steer %q waited out the ack timeout: %s", tr.runID, st.text, r.Reason)
		tally(tr.after > 0, r.Outcome)
		turn := `"result":"turn: ` + st.text + `"`
		switch r.Outcome {
		case messages.SteerDelivered:
			require.Contains(t, got, turn, "%s: steer %q was delivered but the agent never took it as a turn\n%s", tr.runID, st.text, got)
			require.NotEmpty(t, r.MessageID)
		case messages.SteerQueued:
			require.NotEmpty(t, r.MessageID, "%s: queued, so in the inbox", tr.runID)
		case messages.SteerRefused:
			require.Equal(t, messages.SteerFinishing, r.Code, "%s: %s", tr.runID, r.Reason)
			require.NotContains(t, got, turn, tr.runID)
		default:
			t.Fatalf("%s: outcome %q", tr.runID, r.Outcome)
		}
	}
}

// TestSteerRacesWithTurnEnds runs 200 steered launches against a real
// session: in half, a steer lands 0 to 5 ms after the prompt's turn ended
// (the launcher reading that end early or up to 2 ms late); in the other
// half, two steers land within the prompt's turn. Each steer is delivered
// as a turn of its own, or reported queued or finishing: never delivered
// and then lost, never written to a closed input.
func TestSteerRacesWithTurnEnds(t *testing.T) {
	t.Parallel()
	_, nc, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(nc, coordination.Config{})
	require.NoError(t, err)
	dir := coordtest.SocketDir(t)
	const trials = 200
	var mu sync.Mutex
	counts := map[string]int{}
	tally := func(after bool, o messages.SteerOutcome) {
		mu.Lock()
		defer mu.Unlock()
		counts[fmt.Sprintf("after=%v %s", after, o)]++
	}
	// The group waits for its parallel trials (-parallel of them at once).
	t.Run("trials", func(t *testing.T) {
		for i := range trials {
			tr := steerTrial{runID: fmt.Sprintf("race-%03d", i)}
			if i%2 == 0 {
				tr.after = 1 + (i/2)%6
				tr.hold = time.Duration((i/12)%3) * time.Millisecond
			} else {
				tr.firstTurn = 150 * time.Millisecond
			}
			t.Run(tr.runID, func(t *testing.T) {
				t.Parallel()
				tr.run(t, h, nc, dir, tally)
			})
		}
	})
	t.Logf("outcomes: %v", counts)
	// Both sides of the race were run: steers that landed before the
	// launcher read the turn's end, and steers that landed after.
	require.Positive(t, counts["after=true delivered"], "no steer landed before the turn's end was read: %v", counts)
	require.Positive(t, counts["after=true refused"]+counts["after=true queued"], "no steer landed after the input closed: %v", counts)
}
