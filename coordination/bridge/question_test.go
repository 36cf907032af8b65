package bridge_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/relay"
)

// An ask that waits sends the client progress notifications carrying the
// call's progress token, so a client that resets its request timeout on
// progress keeps waiting; they stop when the answer comes.
func TestAskSendsProgressWhileItWaits(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "jcb")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	// A worker that answers every ask after 600 ms.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, relay.PathAsk, r.URL.Path)
		time.Sleep(600 * time.Millisecond)
		_ = json.NewEncoder(w).Encode(relay.AskResponse{QuestionID: "qaaaaaaaaaaaaaaaa", Status: relay.AskAnswered, Answer: "yes", From: "operator"})
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	st, ct := mcp.NewInMemoryTransports()
	s := bridge.NewServer(relay.NewClient(sock), bridge.Options{Version: "test", ProgressEvery: 100 * time.Millisecond})
	ss, err := s.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "t"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, req.Params)
		}})
	cs, err := client.Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait() })

	params := &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"to": "operator", "question": "ok?", "timeout_seconds": 30}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(t.Context(), params)
	require.NoError(t, err)
	require.False(t, res.IsError)
	seen := func() []*mcp.ProgressNotificationParams {
		mu.Lock()
		defer mu.Unlock()
		return append([]*mcp.ProgressNotificationParams(nil), got...)
	}
	// A notification sent before the answer may reach the handler just
	// after it (the client runs handlers apart from the call's result):
	// count from a settle shorter than ProgressEvery, so a ticker that
	// went on after the answer still shows up below, three times over.
	time.Sleep(60 * time.Millisecond)
	first := seen()
	require.GreaterOrEqual(t, len(first), 3, "about one per 100 ms of a 600 ms wait")
	for _, p := range first {
		require.Equal(t, "tok-1", p.ProgressToken)
		require.Equal(t, float64(30), p.Total)
		require.Contains(t, p.Message, "waiting for an answer")
	}
	time.Sleep(300 * time.Millisecond)
	require.Len(t, seen(), len(first), "no progress after the answer")

	// Without a progress token, none.
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"to": "operator", "question": "ok?"}})
	require.NoError(t, err)
	require.False(t, res.IsError)
	require.Len(t, seen(), len(first))
}

// A call without a progress token asks the worker to return after
// Options.NoProgressWait when the question waits longer; a call with one
// waits the whole timeout, kept alive by progress.
func TestAskWithoutProgressTokenAsksToReturnEarly(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "jcb")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	got := make(chan relay.AskRequest, 4)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req relay.AskRequest
		require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
		got <- req
		_ = json.NewEncoder(w).Encode(relay.AskResponse{QuestionID: "qaaaaaaaaaaaaaaaa", Status: relay.AskNoAnswer})
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	st, ct := mcp.NewInMemoryTransports()
	s := bridge.NewServer(relay.NewClient(sock), bridge.Options{Version: "test", NoProgressWait: 20 * time.Second})
	ss, err := s.Connect(context.Background(), st, nil)
	require.NoError(t, err)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "t"}, nil).Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait() })

	call := func(timeout int, token any) relay.AskRequest {
		params := &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"to": "operator", "question": "ok?", "timeout_seconds": timeout}}
		if token != nil {
			params.SetProgressToken(token)
		}
		res, err := cs.CallTool(t.Context(), params)
		require.NoError(t, err)
		require.False(t, res.IsError)
		return <-got
	}
	require.Equal(t, 20, call(60, nil).ReturnAfterSeconds)
	require.Equal(t, 0, call(60, "tok").ReturnAfterSeconds)
	require.Equal(t, 0, call(20, nil).ReturnAfterSeconds, "a wait no longer than NoProgressWait is the call's own")
	require.Equal(t, 20, call(0, nil).ReturnAfterSeconds, "the default timeout, 300 s")
}
