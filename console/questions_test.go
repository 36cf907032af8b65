package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/roles"
)

// askOperator serves run id of group g on a coordination host of its own
// (on nc, a worker's connection) and asks the operator through a bridge
// in the background; the returned channel has the ask's result. It
// returns once the question is open, with its id.
func askOperator(t *testing.T, b *bundle, nc *nats.Conn, id, g string, args map[string]any) (string, <-chan relay.AskResponse) {
	t.Helper()
	h, err := coordination.NewHost(nc, coordination.Config{})
	require.NoError(t, err)
	path := coordtest.SocketPath(coordtest.SocketDir(t), "q")
	s, err := h.Serve(t.Context(), coordination.RunInfo{RunID: id, Group: g}, path)
	require.NoError(t, err)
	cs := coordtest.Bridge(t, path)
	// Registered after the bridge, so it runs first: the run's end ends a
	// waiting ask, which the bridge's cleanup waits for.
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	out := make(chan relay.AskResponse, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: args})
		var got relay.AskResponse
		if err == nil && !res.IsError {
			raw, _ := json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(raw, &got)
		}
		out <- got
	}()
	var qid string
	require.Eventually(t, func() bool {
		qs, err := b.d.OpenQuestions(t.Context())
		for _, q := range qs {
			if q.RunID == id {
				qid = q.ID
			}
		}
		return err == nil && qid != ""
	}, 10*time.Second, 20*time.Millisecond)
	return qid, out
}

// A run's question to the operator shows on the overview (an alert), on
// /questions, on its run's page and its group's, its text inert; answered
// from the console, the run's ask returns the answer.
func TestConsoleAnswersAQuestion(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Operator)
	g, id := "crew-ask", "ask-run"
	// The run's state, written as its worker would (no worker serves it:
	// the question's session below is its only one).
	wjs, err := jetstream.New(b.worker)
	require.NoError(t, err)
	(&bundle{js: wjs, c: b.c}).putStates(t, messages.RunState{ID: id, Group: g, State: messages.StateRunning, Pool: "default",
		Profile: "shell", Attempts: 1, QueuedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()})
	qid, answer := askOperator(t, b.bundle, b.worker, id, g, map[string]any{"to": "operator",
		"question": "<script>alert(1)</script> deploy\x1b[31m?", "choices": []string{"yes <b>now</b>", "no"}, "timeout_seconds": 60})

	_, page := b.get(t, "/")
	require.Contains(t, page, `<li id="questions-alert"><a href="/questions">1 question of a run waits for an operator&#39;s answer</a></li>`)
	for _, path := range []string{"/questions", "/runs/" + id, "/groups/default/" + g} {
		code, page := b.get(t, path)
		require.Equal(t, http.StatusOK, code, path)
		require.Contains(t, page, `id="question-`+qid+`"`, path)
		require.Contains(t, page, `&lt;script&gt;alert(1)&lt;/script&gt; deploy`, path)
		require.NotContains(t, page, "<script>alert(1)", path)
		require.NotContains(t, page, "\x1b", path)
		require.Contains(t, page, `<button type="submit" name="choice" value="yes &lt;b&gt;now&lt;/b&gt;" class="choice">yes &lt;b&gt;now&lt;/b&gt;</button>`, path)
		require.Contains(t, page, `<input type="hidden" name="back" value="`+path+`">`, path)
	}

	// Bad forms lose nothing.
	resp, body := b.post(t, "/questions/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {"nope"}, "text": {"x"}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	resp, body = b.post(t, "/questions/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {qid}, "text": {"  "}, "back": {"/groups/default/" + g}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	require.Contains(t, body, "empty message")
	resp, _ = b.post(t, "/questions/answer", url.Values{"id": {qid}, "choice": {"no"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "no CSRF token, no answer")

	resp, body = b.post(t, "/questions/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {qid}, "choice": {"yes <b>now</b>"}, "back": {"/groups/default/" + g}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	require.Equal(t, "/groups/default/"+g+"?answered="+qid, resp.Header.Get("Location"))
	select {
	case got := <-answer:
		require.Equal(t, relay.AskAnswered, got.Status)
		require.Equal(t, "yes <b>now</b>", got.Answer)
		require.Equal(t, "operator", got.From)
	case <-time.After(30 * time.Second):
		t.Fatal("the ask did not return after the console's answer")
	}
	require.Eventually(t, func() bool {
		_, page := b.get(t, "/questions")
		return !strings.Contains(page, qid)
	}, 5*time.Second, 20*time.Millisecond)
	resp, body = b.post(t, "/questions/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {qid}, "text": {"again"}})
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	require.Empty(t, b.refused())
}

// An observer's console shows the question, and its answer is refused by
// the server at once, naming the role it needs.
func TestObserverCannotAnswer(t *testing.T) {
	t.Parallel()
	b := setupRole(t, roles.Observer)
	qid, answer := askOperator(t, b.bundle, b.worker, "asker", "crew-obs-q", map[string]any{"to": "operator", "question": "ok?", "timeout_seconds": 30})
	_, page := b.get(t, "/questions")
	require.Contains(t, page, `id="question-`+qid+`"`)
	start := time.Now()
	resp, body := b.post(t, "/questions/answer", url.Values{"csrf": {b.c.core.csrf}, "id": {qid}, "text": {"yes"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, body)
	require.Contains(t, body, "needs the operator role")
	require.Less(t, time.Since(start), 2*time.Second)
	select {
	case got := <-answer:
		t.Fatalf("the ask returned %+v", got)
	default:
	}
}

// The run and group pages' timelines say what happened to a question.
func TestQuestionEventText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ev   messages.CoordEvent
		want string
	}{
		{messages.CoordEvent{Kind: messages.CoordAsked, QuestionID: "qa", To: "operator", Bytes: 9}, "asked question qa, 9 bytes"},
		{messages.CoordEvent{Kind: messages.CoordReplied, QuestionID: "qa", To: "r1", Bytes: 3}, "replied to question qa, 3 bytes"},
		{messages.CoordEvent{Kind: messages.CoordAnswered, QuestionID: "qa", From: "operator", Bytes: 2}, "question qa answered by operator, 2 bytes"},
		{messages.CoordEvent{Kind: messages.CoordUnanswered, QuestionID: "qa", Reason: "timeout (1s)\x1b"}, "question qa: no answer (timeout (1s)␛)"},
		{messages.CoordEvent{Kind: "future"}, "future"},
	} {
		require.Equal(t, c.want, questionEventText(c.ev))
	}
}
