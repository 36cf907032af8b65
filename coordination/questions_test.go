package coordination_test

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
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// asking is an ask call in flight.
type asking struct {
	done chan struct{}
	res  *mcp.CallToolResult
}

// askAsync calls ask with args on cs in the background.
func askAsync(t *testing.T, cs *mcp.ClientSession, args map[string]any) *asking {
	t.Helper()
	a := &asking{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: args})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "protocol error: " + err.Error()}}}
		}
		a.res = res
	}()
	return a
}

// wait returns the ask's decoded result, failing on a tool error.
func (a *asking) wait(t *testing.T) relay.AskResponse {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("ask did not return")
	}
	require.False(t, a.res.IsError, coordtest.Text(a.res))
	var out relay.AskResponse
	b, err := json.Marshal(a.res.StructuredContent)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func (b *bundle) questionKV(t *testing.T) jetstream.KeyValue {
	t.Helper()
	kv, err := b.js.KeyValue(t.Context(), coordination.BucketQuestions)
	require.NoError(t, err)
	return kv
}

// openQuestions returns the open questions of the bucket, by id.
func (b *bundle) openQuestions(t *testing.T) map[string]messages.CoordQuestion {
	t.Helper()
	kv := b.questionKV(t)
	out := map[string]messages.CoordQuestion{}
	l, err := kv.ListKeysFiltered(t.Context(), "ask.>")
	require.NoError(t, err)
	for k := range l.Keys() {
		e, err := kv.Get(t.Context(), k)
		if err != nil {
			continue
		}
		var q messages.CoordQuestion
		require.NoError(t, json.Unmarshal(e.Value(), &q))
		require.Equal(t, messages.CoordQuestionKey(q.GroupRef(), q.RunID, q.ID), k)
		out[q.ID] = q
	}
	return out
}

// waitQuestion waits until run's question is open and returns it.
func (b *bundle) waitQuestion(t *testing.T, run string) messages.CoordQuestion {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, q := range b.openQuestions(t) {
			if q.RunID == run {
				return q
			}
		}
	}
	t.Fatalf("no open question of run %s", run)
	return messages.CoordQuestion{}
}

// waitEvent waits until run's session has recorded an event of kind.
func (b *bundle) waitEvent(t *testing.T, run string, kind coordination.EventKind) {
	t.Helper()
	require.Eventually(t, func() bool { return len(b.eventsOf(run, kind)) > 0 }, 10*time.Second, 5*time.Millisecond,
		"run %s recorded no %s event", run, kind)
}

// operatorAnswer writes an operator's answer, as jetcrew answer does.
func (b *bundle) operatorAnswer(t *testing.T, id, text string) {
	t.Helper()
	data, err := json.Marshal(messages.CoordAnswer{Answer: text, By: "alice@host", Time: time.Now()})
	require.NoError(t, err)
	_, err = b.questionKV(t).Create(t.Context(), messages.CoordAnswerKey(id), data)
	require.NoError(t, err)
}

func TestAskOperatorWaitsForTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")

	call := askAsync(t, a, map[string]any{"to": "operator", "question": "Drop the legacy table?", "choices": []string{"yes", "no", "yes"}, "timeout_seconds": 60})
	q := b.waitQuestion(t, "run-a")
	require.True(t, messages.ValidCoordQuestionID(q.ID), q.ID)
	require.Equal(t, "operator", q.To)
	require.Equal(t, "g1", q.Group)
	require.Equal(t, "Drop the legacy table?", q.Question)
	require.Equal(t, []string{"yes", "no"}, q.Choices)
	require.WithinDuration(t, q.Time.Add(60*time.Second), q.Until, time.Second)

	// The question is on the group's conversation too, with its id.
	m := b.lastCoordMessage(t, coordination.Subject(coordtest.Group("g1"), "operator"))
	require.Equal(t, "Drop the legacy table?", string(m.Data))
	require.Equal(t, q.ID, m.Header.Get(messages.HeaderQuestion))
	require.Equal(t, "run-a", m.Header.Get(coordination.HeaderFrom))

	b.operatorAnswer(t, q.ID, "no, keep it")
	got := call.wait(t)
	require.Equal(t, relay.AskResponse{QuestionID: q.ID, Status: relay.AskAnswered, Answer: "no, keep it", From: "operator", WaitedSeconds: got.WaitedSeconds}, got)
	require.Empty(t, b.openQuestions(t), "an answered question leaves the open list")

	asked := b.eventsOf("run-a", coordination.EventAsked)
	require.Len(t, asked, 1)
	require.Equal(t, q.ID, asked[0].QuestionID)
	require.Equal(t, "operator", asked[0].To)
	answered := b.eventsOf("run-a", coordination.EventAnswered)
	require.Len(t, answered, 1)
	require.Equal(t, "operator", answered[0].From)
	require.Equal(t, len("no, keep it"), answered[0].Bytes)
}

// lastCoordMessage returns the last message of JETCREW_COORD on subject.
func (b *bundle) lastCoordMessage(t *testing.T, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	st, err := b.js.Stream(t.Context(), coordination.StreamName)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(t.Context(), subject)
	require.NoError(t, err)
	return m
}

func TestAskWithoutAnswerReturnsNoAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")

	start := time.Now()
	got := coordtest.Decode[relay.AskResponse](t, a, "ask", map[string]any{"to": "operator", "question": "anyone?", "timeout_seconds": 1})
	require.GreaterOrEqual(t, time.Since(start), time.Second)
	require.Equal(t, relay.AskNoAnswer, got.Status)
	require.Contains(t, got.Note, "no answer: timeout (1s)")
	require.Empty(t, got.Answer)
	require.Empty(t, b.openQuestions(t), "a timed-out question leaves the open list")
	un := b.eventsOf("run-a", coordination.EventUnanswered)
	require.Len(t, un, 1)
	require.Equal(t, got.QuestionID, un[0].QuestionID)

	// An answer too late finds nothing to answer: the asker is gone.
	require.NotContains(t, b.openQuestions(t), got.QuestionID)
}

func TestAskIsCutToTheRunsRemainingTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")
	s.SetDeadline(time.Now().Add(13 * time.Second)) // 3 s to wait, less what the call takes to arrive

	got := coordtest.Decode[relay.AskResponse](t, a, "ask", map[string]any{"to": "operator", "question": "q?", "timeout_seconds": 600})
	require.Equal(t, relay.AskNoAnswer, got.Status)
	require.Regexp(t, `^timeout cut to [1-3] seconds: your run's remaining time; no answer: timeout \([1-3]s\)$`, got.Note)
	require.LessOrEqual(t, got.WaitedSeconds, int64(3))

	s.SetDeadline(time.Now().Add(5 * time.Second))
	got = coordtest.Decode[relay.AskResponse](t, a, "ask", map[string]any{"to": "operator", "question": "q?"})
	require.Equal(t, relay.AskNoAnswer, got.Status)
	require.Contains(t, got.Note, "no time left")
	require.Empty(t, got.QuestionID, "nothing was asked")
}

func TestAskPeerAndReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "run-a", "g1")
	_, peer := b.serve(t, h, "run-b", "g1")
	_, bystander := b.serve(t, b.host(t, coordination.Config{}), "run-c", "g1")
	_, stranger := b.serve(t, h, "run-x", "g2")

	call := askAsync(t, a, map[string]any{"to": "run-b", "question": "Which port?", "choices": []string{"8080", "9090"}})
	q := b.waitQuestion(t, "run-a")

	// The peer reads the question in its inbox, with its id and choices.
	msgs := inbox(t, peer, 5)
	require.Len(t, msgs, 1)
	require.Equal(t, "run-a", msgs[0].From)
	require.Equal(t, "Which port?", msgs[0].Body)
	require.Equal(t, q.ID, msgs[0].QuestionID)
	require.Equal(t, []string{"8080", "9090"}, msgs[0].Choices)

	// Nobody else answers it.
	require.Contains(t, toolError(t, bystander, "reply", map[string]any{"question_id": q.ID, "answer": "80"}), "is to run run-b, not to you")
	require.Contains(t, toolError(t, stranger, "reply", map[string]any{"question_id": q.ID, "answer": "80"}), "no open question "+q.ID+" in your group")
	require.Contains(t, toolError(t, a, "reply", map[string]any{"question_id": q.ID, "answer": "80"}), "is your own")
	require.Contains(t, toolError(t, peer, "reply", map[string]any{"question_id": "qnope", "answer": "80"}), "is not a question id")

	r := coordtest.Decode[relay.ReplyResponse](t, peer, "reply", map[string]any{"question_id": q.ID, "answer": "9090"})
	require.Equal(t, relay.ReplyResponse{QuestionID: q.ID, To: "run-a"}, r)
	got := call.wait(t)
	require.Equal(t, relay.AskAnswered, got.Status)
	require.Equal(t, "9090", got.Answer)
	require.Equal(t, "run-b", got.From)
	require.Empty(t, b.openQuestions(t))
	require.Contains(t, toolError(t, peer, "reply", map[string]any{"question_id": q.ID, "answer": "9090"}), "no open question")

	replied := b.eventsOf("run-b", coordination.EventReplied)
	require.Len(t, replied, 1)
	require.Equal(t, "run-a", replied[0].To)
	require.Equal(t, q.ID, replied[0].QuestionID)
	require.Equal(t, "run-b", b.eventsOf("run-a", coordination.EventAnswered)[0].From)
	refused := b.eventsOf("run-c", coordination.EventRefused)
	require.Len(t, refused, 1)
	require.Equal(t, q.ID, refused[0].QuestionID)
}

func TestAskAllTakesTheFirstReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "run-a", "g1")
	_, p1 := b.serve(t, h, "run-b", "g1")
	_, p2 := b.serve(t, b.host(t, coordination.Config{}), "run-c", "g1")

	call := askAsync(t, a, map[string]any{"to": "all", "question": "Who owns the schema?", "timeout_seconds": 30})
	q := b.waitQuestion(t, "run-a")
	require.Equal(t, q.ID, inbox(t, p2, 5)[0].QuestionID)

	// The operator's answer key is not where peers answer: the asker
	// waits on both, and p1's reply is the first.
	coordtest.Decode[relay.ReplyResponse](t, p1, "reply", map[string]any{"question_id": q.ID, "answer": "run-b does"})
	// The same reply again is harmless, while the question is open.
	res := coordtest.Call(t, p1, "reply", map[string]any{"question_id": q.ID, "answer": "run-b does"})
	if !res.IsError {
		require.Contains(t, coordtest.Text(res), `"duplicate":true`)
	} else {
		require.Contains(t, coordtest.Text(res), "no open question")
	}
	// Another answer is refused, naming the first (or, once the asker
	// has read it, finds the question gone).
	msg := toolError(t, p2, "reply", map[string]any{"question_id": q.ID, "answer": "I do"})
	require.True(t, strings.Contains(msg, "run run-b answered question "+q.ID+" first") || strings.Contains(msg, "no open question"), msg)
	got := call.wait(t)
	require.Equal(t, "run-b does", got.Answer)
	require.Equal(t, "run-b", got.From)
}

func TestAskCapsOpenQuestions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := coordination.Config{Questions: coordination.QuestionConfig{MaxOpenPerRun: 1, MaxOpenPerGroup: 2, Rate: -1}}
	_, a := b.serve(t, b.host(t, cfg), "run-a", "g1")
	_, c := b.serve(t, b.host(t, cfg), "run-c", "g1")
	_, d := b.serve(t, b.host(t, cfg), "run-d", "g1")
	_, other := b.serve(t, b.host(t, cfg), "run-x", "g2")

	first := askAsync(t, a, map[string]any{"to": "operator", "question": "one", "timeout_seconds": 30})
	q := b.waitQuestion(t, "run-a")
	msg := toolError(t, a, "ask", map[string]any{"to": "operator", "question": "two"})
	require.Contains(t, msg, "a run may have at most 1 questions waiting at once and you have 1")
	require.Contains(t, msg, "nothing was asked")

	second := askAsync(t, c, map[string]any{"to": "operator", "question": "three", "timeout_seconds": 30})
	b.waitQuestion(t, "run-c")
	msg = toolError(t, d, "ask", map[string]any{"to": "operator", "question": "four"})
	require.Contains(t, msg, "a group may have at most 2 questions waiting at once and yours has 2")
	require.Len(t, b.openQuestions(t), 2, "a refused ask stores nothing")
	// Another group has its own count.
	got := coordtest.Decode[relay.AskResponse](t, other, "ask", map[string]any{"to": "operator", "question": "five", "timeout_seconds": 1})
	require.Equal(t, relay.AskNoAnswer, got.Status)

	// Answered, the question frees its place.
	b.operatorAnswer(t, q.ID, "ok")
	require.Equal(t, "ok", first.wait(t).Answer)
	for _, q := range b.openQuestions(t) {
		b.operatorAnswer(t, q.ID, "ok too")
	}
	require.Equal(t, "ok too", second.wait(t).Answer)
	got = coordtest.Decode[relay.AskResponse](t, d, "ask", map[string]any{"to": "operator", "question": "four", "timeout_seconds": 1})
	require.Equal(t, relay.AskNoAnswer, got.Status)
}

func TestAskAndReplyLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, a := b.serve(t, b.host(t, coordination.Config{Questions: coordination.QuestionConfig{Rate: 0.001, Burst: 2}}), "run-a", "g1")

	// Sizes, checked by the bridge (and again by the worker).
	msg := toolError(t, a, "ask", map[string]any{"to": "operator", "question": strings.Repeat("x", relay.MaxQuestionBytes+1)})
	require.Contains(t, msg, "question is 4097 bytes, longest allowed is 4096 bytes")
	msg = toolError(t, a, "ask", map[string]any{"to": "operator", "question": "q", "choices": []string{strings.Repeat("c", relay.MaxChoiceBytes+1)}})
	require.Contains(t, msg, "a choice is 257 bytes")
	msg = toolError(t, a, "ask", map[string]any{"to": "operator", "question": "q", "choices": make([]string, relay.MaxChoices+1)})
	require.Contains(t, msg, "choices names 11 answers, at most 10")
	msg = toolError(t, a, "reply", map[string]any{"question_id": "qaaaaaaaaaaaaaaaa", "answer": strings.Repeat("x", relay.MaxAnswerBytes+1)})
	require.Contains(t, msg, "answer is 4097 bytes")
	msg = toolError(t, a, "ask", map[string]any{"to": "run-a", "question": "me?"})
	require.Contains(t, msg, "your own run id")

	// The rate: two calls, then refused. (The size refusals above never
	// reached the worker.)
	toolError(t, a, "ask", map[string]any{"to": "run-a", "question": "me?"}) // the second call
	msg = toolError(t, a, "reply", map[string]any{"question_id": "qaaaaaaaaaaaaaaaa", "answer": "x"})
	require.Contains(t, msg, "rate limited: a run may make ask and reply calls at 0.001 per second on average, in bursts of 2")
}

func TestAskEndsWithTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s, a := b.serve(t, b.host(t, coordination.Config{}), "run-a", "g1")
	call := askAsync(t, a, map[string]any{"to": "operator", "question": "still there?", "timeout_seconds": 60})
	// Asked: the question is stored and published, and the call waits. (Its
	// key alone is stored before it is published: a run that ends between
	// the two asks nothing, and its call fails.)
	b.waitEvent(t, "run-a", coordination.EventAsked)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx))
	<-call.done
	require.Empty(t, b.openQuestions(t), "the run's end expires its questions")
	un := b.eventsOf("run-a", coordination.EventUnanswered)
	require.Len(t, un, 1)
	require.Equal(t, "run ended", un[0].Reason)
}

// An MCP client that sends no progress token cannot be kept waiting: it
// gives up after its own request timeout (60 s in common clients,
// anomalyco/opencode#28186; 5 s here). Its ask returns "no answer" before
// (bridge.Options.NoProgressWait, 1 s here), the question stays open for
// its whole timeout, and an answer that comes later reaches the run's
// inbox, saying which question it answers.
func TestAskWithoutProgressTokenReturnsBeforeTheClientGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, _ := b.serve(t, h, "run-a", "g1")
	a := coordtest.BridgeWith(t, s.SocketPath(), bridge.Options{Version: "test", NoProgressWait: time.Second})
	_, peer := b.serve(t, h, "run-b", "g1")

	ask := func(args map[string]any) relay.AskResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second) // the client's own timeout
		defer cancel()
		res, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "ask", Arguments: args})
		require.NoError(t, err, "the client gave up before the ask returned")
		require.False(t, res.IsError, coordtest.Text(res))
		var out relay.AskResponse
		data, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &out))
		return out
	}
	closed := func(id string) {
		t.Helper()
		require.Eventually(t, func() bool { _, open := b.openQuestions(t)[id]; return !open }, 10*time.Second, 20*time.Millisecond)
	}

	// The operator answers after the call returned.
	got := ask(map[string]any{"to": "operator", "question": "Drop the legacy table?", "timeout_seconds": 60})
	require.Equal(t, relay.AskNoAnswer, got.Status)
	require.NotEmpty(t, got.QuestionID)
	require.Contains(t, got.Note, "no progress token")
	require.Contains(t, got.Note, "inbox")
	require.Contains(t, b.openQuestions(t), got.QuestionID, "the question stays open")
	require.Empty(t, b.eventsOf("run-a", coordination.EventUnanswered))
	b.operatorAnswer(t, got.QuestionID, "no, keep it")
	msgs := inbox(t, a, 10)
	require.Len(t, msgs, 1)
	require.Equal(t, relay.Message{ID: msgs[0].ID, From: "operator", To: "run-a", Body: "no, keep it", Time: msgs[0].Time, AnswerTo: got.QuestionID}, msgs[0])
	closed(got.QuestionID)
	answered := b.eventsOf("run-a", coordination.EventAnswered)
	require.Len(t, answered, 1)
	require.Equal(t, "operator", answered[0].From)
	require.Equal(t, got.QuestionID, answered[0].QuestionID)

	// A peer replies after the call returned.
	got = ask(map[string]any{"to": "run-b", "question": "Which port?", "timeout_seconds": 60})
	require.Equal(t, relay.AskNoAnswer, got.Status)
	q := inbox(t, peer, 5)
	require.Len(t, q, 1)
	require.Equal(t, got.QuestionID, q[0].QuestionID)
	coordtest.Decode[relay.ReplyResponse](t, peer, "reply", map[string]any{"question_id": got.QuestionID, "answer": "9090"})
	msgs = inbox(t, a, 10)
	require.Len(t, msgs, 1)
	require.Equal(t, "run-b", msgs[0].From)
	require.Equal(t, "9090", msgs[0].Body)
	require.Equal(t, got.QuestionID, msgs[0].AnswerTo)
	require.Empty(t, msgs[0].QuestionID, "an answer is no question to reply to")
	closed(got.QuestionID)

	// Nobody answers: the question closes at its own timeout.
	got = ask(map[string]any{"to": "operator", "question": "Anyone?", "timeout_seconds": 2})
	require.Equal(t, relay.AskNoAnswer, got.Status)
	closed(got.QuestionID)
	un := b.eventsOf("run-a", coordination.EventUnanswered)
	require.Len(t, un, 1)
	require.Equal(t, got.QuestionID, un[0].QuestionID)
	require.Contains(t, un[0].Reason, "timeout")
	require.Empty(t, inbox(t, a, 0))
}
