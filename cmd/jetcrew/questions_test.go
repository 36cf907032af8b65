package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// TestQuestionsAndAnswer: a run asks the operator through its bridge;
// jetcrew questions lists the question, id first; jetcrew answer answers
// it, and the run's ask returns the answer.
func TestQuestionsAndAnswer(t *testing.T) {
	t.Parallel()
	s := workertest.StartServer(t)
	url := s.ClientURL()
	nc := coordtest.Connect(t, s)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, coordination.Provision(t.Context(), js, 1))

	code, stdout, stderr := cli(t, url, "questions")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "no question waits for an operator")

	h, err := coordination.NewHost(nc, coordination.Config{})
	require.NoError(t, err)
	path := coordtest.SocketPath(coordtest.SocketDir(t), "asker")
	sess, err := h.Serve(t.Context(), coordination.RunInfo{RunID: "asker", Group: "crew"}, path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	cs := coordtest.Bridge(t, path)

	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask",
			Arguments: map[string]any{"to": "operator", "question": "Ship it?\n\x1b[2Jnow", "choices": []string{"yes", "no"}, "timeout_seconds": 60}})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
		}
		done <- res
	}()

	var line string
	require.Eventually(t, func() bool {
		code, stdout, stderr = cli(t, url, "questions")
		line = strings.TrimSpace(stdout)
		return code == 0 && line != ""
	}, 10*time.Second, 50*time.Millisecond, stderr)
	require.NotContains(t, line, "\n", "one question, one line")
	require.NotContains(t, line, "\x1b", "the agent's text is shown inert")
	require.Contains(t, line, `Ship it?\n\x1b[2Jnow [choices: yes | no]`)
	fields := strings.Fields(line)
	id := fields[0]
	require.Equal(t, []string{"asker", "crew"}, fields[1:3])

	code, _, stderr = cli(t, url, "answer", "qnotaquestion", "yes")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "is not a question id")
	code, _, stderr = cli(t, url, "answer", id)
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "missing argument TEXT")

	code, stdout, stderr = cli(t, url, "answer", "--by", "alice", id, "yes, ship it")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, id+": answered run asker\n", stdout)

	var res *mcp.CallToolResult
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ask did not return after the answer")
	}
	require.False(t, res.IsError, coordtest.Text(res))
	var got relay.AskResponse
	b, _ := json.Marshal(res.StructuredContent)
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, "yes, ship it", got.Answer)
	require.Equal(t, "operator", got.From)

	// Answered, it is gone: from the list, and from answer.
	code, stdout, _ = cli(t, url, "questions")
	require.Equal(t, 0, code)
	require.Empty(t, stdout)
	code, _, stderr = cli(t, url, "answer", id, "again")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "no question waits under this id")
}
