package coordination_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// reconnectWindow is the window of the bridges of these tests: longer than
// any gap they make.
const reconnectWindow = 20 * time.Second

// waitingBridge returns an MCP client of a bridge relaying to runID's
// socket with a reconnect window, as in a run container.
func (b *bundle) waitingBridge(t *testing.T, runID string) *mcp.ClientSession {
	t.Helper()
	c := relay.NewClientWith(coordtest.SocketPath(b.dir, runID), relay.ClientOptions{ReconnectWindow: reconnectWindow})
	t.Cleanup(c.Close)
	return coordtest.BridgeOn(t, c, bridge.Options{Version: "test"})
}

// callAsync calls tool on cs from a goroutine; the result comes on the
// channel (a protocol error as a nil result).
func callAsync(cs *mcp.ClientSession, tool string, args any) <-chan *mcp.CallToolResult {
	out := make(chan *mcp.CallToolResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			res = nil
		}
		out <- res
	}()
	return out
}

// result waits for a call of callAsync and decodes its structured result.
func result[T any](t *testing.T, ch <-chan *mcp.CallToolResult) T {
	t.Helper()
	var out T
	select {
	case res := <-ch:
		require.NotNil(t, res, "protocol error")
		require.False(t, res.IsError, coordtest.Text(res))
		data, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &out))
	case <-time.After(reconnectWindow + 20*time.Second):
		t.Fatal("the call never returned")
	}
	return out
}

// The worker serving a run stops (its session detached, the socket
// removed) and a new worker process serves the run again at the same
// path: the bridge's inbox long poll in flight and a status call made
// during the gap both wait, and succeed against the new worker.
func TestBridgeRidesOutAWorkerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h1 := b.host(t, coordination.Config{})
	_, a := b.serve(t, h1, "a", "g")
	sb, _ := b.serve(t, h1, "b", "g")
	bb := b.waitingBridge(t, "b")
	require.Equal(t, "b", status(t, bb).RunID)

	polling := callAsync(bb, "inbox", map[string]any{"wait_seconds": 15})
	coordtest.WaitLongPoll(t, b.srv, "b")
	require.NoError(t, sb.Detach(context.Background()))
	gap := callAsync(bb, "status", map[string]any{})
	time.Sleep(1500 * time.Millisecond)

	h2 := b.host(t, coordination.Config{})
	b.serve(t, h2, "b", "g")
	require.Equal(t, "b", result[relay.Status](t, gap).RunID, "the status call made during the gap")
	send(t, a, "b", "after the restart")
	msgs := result[relay.InboxResponse](t, polling).Messages
	require.Len(t, msgs, 1, "the inbox call in flight, sent again to the new worker")
	require.Equal(t, "after the restart", msgs[0].Body)
}

// The bridge announces steers across a worker restart: one put in the
// inbox by the new worker's session, whose count starts again at 0, is
// announced (once), though the old session had counted more.
func TestSteerNoticeAcrossAWorkerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h1 := b.host(t, coordination.Config{})
	s1, _ := b.running(t, h1, "r1", false)

	rc := relay.NewClientWith(s1.SocketPath(), relay.ClientOptions{ReconnectWindow: reconnectWindow})
	t.Cleanup(rc.Close)
	srv := bridge.NewServer(rc, bridge.Options{Version: "test"})
	st, ct := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ss, err := srv.Connect(ctx, st, nil)
	require.NoError(t, err)
	got := make(chan string, 8)
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "test"}, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			got <- fmt.Sprint(r.Params.Data)
		}})
	cs, err := client.Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait() })
	require.NoError(t, cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}))
	done := make(chan struct{})
	go func() { defer close(done); bridge.WatchSteers(ctx, srv, rc) }()
	t.Cleanup(func() { cancel(); <-done })
	notified := func(want string) {
		t.Helper()
		select {
		case note := <-got:
			require.Equal(t, want, note)
		case <-time.After(10 * time.Second):
			t.Fatal("no notification")
		}
	}

	for i, id := range []string{"s-1", "s-2"} {
		waitPoll(t, s1)
		require.Equal(t, messages.SteerQueued, steer(t, b.nc, "r1", id, "steer "+id).Outcome)
		notified(bridge.UnreadNote(i + 1))
	}

	// The worker goes; another serves the run at the same socket path.
	require.NoError(t, s1.Detach(context.Background()))
	h2 := b.host(t, coordination.Config{})
	s2, _ := b.running(t, h2, "r1", false)
	require.Equal(t, s1.SocketPath(), s2.SocketPath())
	waitPoll(t, s2)
	require.Equal(t, messages.SteerQueued, steer(t, b.nc, "r1", "s-3", "steer after the restart").Outcome)
	notified(bridge.UnreadNote(1))
	select {
	case note := <-got:
		t.Fatalf("a second notification: %s", note)
	case <-time.After(500 * time.Millisecond):
	}
}

// A question outlives its worker (issue 38): an ask waiting when the run's
// session ends by Leave (its worker stopping for an upgrade) fails as
// interrupted, saying its answer will come to the inbox, and leaves its
// question open; the session of a worker adopting the run takes the run's
// open questions over, so an answer given while no worker served the run
// and one given after the adoption each reach the run's inbox once.
func TestQuestionsOutliveTheirWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	s1, _ := b.serve(t, b.host(t, coordination.Config{}), "a", "g")
	a := b.waitingBridge(t, "a")
	var calls []<-chan *mcp.CallToolResult
	for i, q := range []string{"first?", "second?"} {
		calls = append(calls, callAsync(a, "ask", map[string]any{"to": "operator", "question": q, "timeout_seconds": 60}))
		require.Eventually(t, func() bool { return len(b.openQuestions(t)) == i+1 }, 10*time.Second, 10*time.Millisecond)
	}
	open := b.openQuestions(t)
	require.NoError(t, s1.Leave(context.Background()))
	for _, call := range calls {
		select {
		case res := <-call:
			require.NotNil(t, res, "a tool error, not a protocol error")
			require.True(t, res.IsError, "the ask was interrupted, not answered: %s", coordtest.Text(res))
			require.Contains(t, coordtest.Text(res), "coordination interrupted: ")
			require.Contains(t, coordtest.Text(res), "its answer will be put in your inbox")
		case <-time.After(20 * time.Second):
			t.Fatal("the ask never returned")
		}
	}
	require.Equal(t, open, b.openQuestions(t), "the questions stay open")
	require.Empty(t, b.eventsOf("a", coordination.EventUnanswered))
	var first, second string
	for id, q := range open {
		if q.Question == "first?" {
			first = id
		} else {
			second = id
		}
	}
	b.operatorAnswer(t, first, "given while no worker served the run")

	s2, err := b.host(t, coordination.Config{}).Serve(context.Background(),
		coordination.RunInfo{RunID: "a", Group: "g", Profile: "shell", Adopted: true}, s1.SocketPath())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s2.Close(context.Background()) })
	b.operatorAnswer(t, second, "given after the adoption")
	var got []relay.Message
	require.Eventually(t, func() bool { got = append(got, inbox(t, a, 1)...); return len(got) >= 2 }, 20*time.Second, 10*time.Millisecond)
	answers := map[string]string{}
	for _, m := range got {
		require.Equal(t, coordination.RecipientOperator, m.From)
		answers[m.AnswerTo] = m.Body
	}
	require.Equal(t, map[string]string{first: "given while no worker served the run", second: "given after the adoption"}, answers)
	require.Eventually(t, func() bool { return len(b.openQuestions(t)) == 0 }, 10*time.Second, 10*time.Millisecond, "answered, the questions close")
	require.Len(t, b.eventsOf("a", coordination.EventAnswered), 2)
	require.Empty(t, inbox(t, a, 1), "each answer once")
}
