//go:build bench

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// steerSamples is how many steers TestSteerDelivery times, after
// coordWarmup.
const steerSamples = 300

// TestSteerDelivery measures a steer from the operator's request to the
// agent CLI's standard input: a request on jetcrew.steer.<run_id> → the
// run's session on the worker's Host (the inbox copy stored in
// JETCREW_COORD, PubAck awaited) → the launcher's long poll over the run's
// unix socket (the real bin/jetcrew-bridge, `launch --steer
// claude-stream-json`) → a pipe write to the CLI's stdin. The CLI is a
// shell loop echoing each stdin line; a sample ends when its echo of the
// steer comes back out of the launcher (agent_has_it), and the sender's
// reply, "delivered" once the launcher acknowledged the write, is timed
// too (delivered). The baseline is a bare core NATS request/reply on the
// same embedded server, in the same run.
func TestSteerDelivery(t *testing.T) {
	s, nc, _ := coordtest.Provisioned(t)
	h, err := coordination.NewHost(nc, coordination.Config{SteerRate: -1})
	require.NoError(t, err)
	dir := coordtest.SocketDir(t)
	ctx := context.Background()
	sock := coordtest.SocketPath(dir, "r")
	sess, err := h.Serve(ctx, coordination.RunInfo{RunID: "r", Group: "bench"}, sock)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	require.NoError(t, sess.SetState(ctx, messages.StateRunning))
	sess.SetSteerInput(true)

	prompt := filepath.Join(t.TempDir(), "prompt")
	require.NoError(t, os.WriteFile(prompt, []byte("bench"), 0o600))
	cmd := exec.Command(binary(t, "jetcrew-bridge"), "launch", "--stdin", prompt, "--steer", messages.SteerInputClaude,
		"--", "/bin/sh", "-c", `while read -r l; do printf '%s\n' "$l"; done`)
	cmd.Env = append(os.Environ(), relay.EnvSocket+"="+sock)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	type echo struct {
		line string
		at   time.Time
	}
	echoes := make(chan echo, 16)
	go func() { // ends when the launcher's stdout closes (Kill above)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			echoes <- echo{sc.Text(), time.Now()}
		}
		close(echoes)
	}()
	require.Contains(t, (<-echoes).line, `"text":"bench"`, "the prompt is the first turn")

	sender := coordtest.Connect(t, s)
	var hasIt, delivered []float64
	for i := range coordWarmup + steerSamples {
		text := fmt.Sprintf("steer %d", i)
		m := nats.NewMsg(messages.SubjectSteer("r"))
		m.Header.Set(messages.HeaderSteerID, fmt.Sprintf("b%d", i))
		m.Data = []byte(text)
		t0 := time.Now()
		resp, err := sender.RequestMsg(m, 10*time.Second)
		d1 := time.Since(t0)
		require.NoError(t, err)
		var r messages.SteerReply
		require.NoError(t, json.Unmarshal(resp.Data, &r))
		require.Equal(t, messages.SteerDelivered, r.Outcome, r.Reason)
		// The agent's echo, timestamped as it came out of the launcher:
		// the steer was on its stdin and read by then.
		e := <-echoes
		require.True(t, strings.Contains(e.line, `"text":"`+text+`"`), e.line)
		if i >= coordWarmup {
			delivered = append(delivered, ms(d1))
			hasIt = append(hasIt, ms(e.at.Sub(t0)))
		}
	}
	raw := rawRequestReply(t, coordtest.Connect(t, s), coordtest.Connect(t, s))
	const rawWhat = "bare core NATS request → reply between two connections to the same embedded server (4-byte payload)"
	record(t, "steer_raw_nats_rtt_p50_ms", Figure{Value: round(median(raw), 3), Unit: "ms", Samples: len(raw), What: rawWhat})
	record(t, "steer_raw_nats_rtt_p99_ms", Figure{Value: round(percentile(raw, 0.99), 3), Unit: "ms", Samples: len(raw), What: rawWhat})
	const stdinWhat = "operator request on jetcrew.steer.<run> → worker session (inbox copy stored, PubAck) → launcher long poll over the run's socket (bin/jetcrew-bridge launch --steer) → CLI stdin; ends when the CLI (a shell loop) has read it and its echo came out of the launcher's stdout (an upper bound of the agent's stdin having it)"
	record(t, "steer_stdin_p50_ms", Figure{Value: round(median(hasIt), 3), Unit: "ms", Baseline: "steer_raw_nats_rtt_p50_ms", Samples: len(hasIt), What: stdinWhat})
	record(t, "steer_stdin_p99_ms", Figure{Value: round(percentile(hasIt, 0.99), 3), Unit: "ms", Baseline: "steer_raw_nats_rtt_p99_ms", Samples: len(hasIt), What: stdinWhat})
	const what = "operator request on jetcrew.steer.<run> → worker session (inbox copy stored, PubAck) → launcher long poll over the run's socket (bin/jetcrew-bridge launch --steer) → CLI stdin; ends when the sender's reply says delivered (the launcher acknowledged the pipe write)"
	record(t, "steer_delivered_p50_ms", Figure{Value: round(median(delivered), 3), Unit: "ms", Baseline: "steer_raw_nats_rtt_p50_ms", Samples: len(delivered), What: what})
	record(t, "steer_delivered_p99_ms", Figure{Value: round(percentile(delivered, 0.99), 3), Unit: "ms", Baseline: "steer_raw_nats_rtt_p99_ms", Samples: len(delivered), What: what})
}
