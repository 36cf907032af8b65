package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// OpenQuestions lists the questions to the operator only, oldest first;
// AnswerQuestion refuses what is not an open question to the operator,
// an empty or oversize answer, and a second answer.
func TestQuestionsToTheOperator(t *testing.T) {
	t.Parallel()
	s, nc, _ := coordtest.Provisioned(t)
	d, err := dispatcher.New(coordtest.Connect(t, s))
	require.NoError(t, err)
	qs, err := d.OpenQuestions(t.Context())
	require.NoError(t, err)
	require.Empty(t, qs)

	// A question whose asker is gone (no presence: its worker died) is not
	// listed, nor answered, though its key lives until its TTL.
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), messages.BucketCoordQuestions)
	require.NoError(t, err)
	ghost := messages.CoordQuestion{ID: "qghostghostghostg", RunID: "ghost", Group: "g", To: "operator", Question: "anyone?",
		Time: time.Now(), Until: time.Now().Add(time.Hour), Session: "S"}
	raw, err := json.Marshal(ghost)
	require.NoError(t, err)
	_, err = kv.Create(t.Context(), messages.CoordQuestionKey(coordtest.Group("g"), "ghost", ghost.ID), raw)
	require.NoError(t, err)
	qs, err = d.OpenQuestions(t.Context())
	require.NoError(t, err)
	require.Empty(t, qs)
	_, err = d.AnswerQuestion(t.Context(), ghost.ID, "yes", "me")
	require.ErrorIs(t, err, dispatcher.ErrNoQuestion)

	h, err := coordination.NewHost(nc, coordination.Config{})
	require.NoError(t, err)
	dir := coordtest.SocketDir(t)
	bridges := map[string]*mcp.ClientSession{}
	for _, id := range []string{"ra", "rb"} {
		sess, err := h.Serve(t.Context(), coordination.RunInfo{RunID: id, Group: "g"}, coordtest.SocketPath(dir, id))
		require.NoError(t, err)
		bridges[id] = coordtest.Bridge(t, coordtest.SocketPath(dir, id))
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
	}
	ask := func(from string, args map[string]any) <-chan relay.AskResponse {
		out := make(chan relay.AskResponse, 1)
		go func() {
			res, err := bridges[from].CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: args})
			var got relay.AskResponse
			if err == nil {
				raw, _ := json.Marshal(res.StructuredContent)
				_ = json.Unmarshal(raw, &got)
			}
			out <- got
		}()
		return out
	}
	first := ask("ra", map[string]any{"to": "operator", "question": "first?", "timeout_seconds": 30})
	var open []messages.CoordQuestion
	require.Eventually(t, func() bool { open, _ = d.OpenQuestions(t.Context()); return len(open) == 1 }, 10*time.Second, 10*time.Millisecond)
	ask("ra", map[string]any{"to": "rb", "question": "to a peer?", "timeout_seconds": 30})
	second := ask("rb", map[string]any{"to": "operator", "question": "second?", "timeout_seconds": 30})
	var peerQ string
	require.Eventually(t, func() bool {
		open, _ = d.OpenQuestions(t.Context())
		return len(open) == 2
	}, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"first?", "second?"}, []string{open[0].Question, open[1].Question}, "oldest first, none to a peer")
	require.Eventually(t, func() bool {
		in := coordtest.Decode[relay.InboxResponse](t, bridges["rb"], "inbox", map[string]any{"wait_seconds": 1})
		for _, m := range in.Messages {
			peerQ = m.QuestionID
		}
		return peerQ != ""
	}, 10*time.Second, 10*time.Millisecond)

	_, err = d.AnswerQuestion(t.Context(), peerQ, "yes", "me")
	require.ErrorIs(t, err, dispatcher.ErrNotToOperator)
	_, err = d.AnswerQuestion(t.Context(), "qaaaaaaaaaaaaaaaa", "yes", "me")
	require.ErrorIs(t, err, dispatcher.ErrNoQuestion)
	_, err = d.AnswerQuestion(t.Context(), "q1", "yes", "me")
	require.ErrorContains(t, err, "is not a question id")
	_, err = d.AnswerQuestion(t.Context(), open[0].ID, "", "me")
	require.ErrorIs(t, err, dispatcher.ErrEmptyMessage)
	_, err = d.AnswerQuestion(t.Context(), open[0].ID, strings.Repeat("x", dispatcher.MaxAnswerBytes+1), "me")
	require.ErrorContains(t, err, "longest allowed is 4096")
	_, err = d.AnswerQuestion(t.Context(), open[0].ID, "yes", "")
	require.ErrorContains(t, err, "say who answers")

	q, err := d.AnswerQuestion(t.Context(), open[1].ID, "no", "me")
	require.NoError(t, err)
	require.Equal(t, "rb", q.RunID)
	_, err = d.AnswerQuestion(t.Context(), open[1].ID, "yes", "someone else")
	require.True(t, errors.Is(err, dispatcher.ErrAnswered) || errors.Is(err, dispatcher.ErrNoQuestion), "%v", err)
	require.Equal(t, "no", (<-second).Answer)
	_, err = d.AnswerQuestion(t.Context(), open[0].ID, "yes", "me")
	require.NoError(t, err)
	require.Equal(t, "yes", (<-first).Answer)
}
