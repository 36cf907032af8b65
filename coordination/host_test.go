package coordination_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// bundle is what most tests need: a provisioned server, a socket directory
// and the events every host of the test reported.
type bundle struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	dir string

	mu     sync.Mutex
	events []coordination.Event
}

func setup(t *testing.T) *bundle {
	t.Helper()
	s, nc, js := coordtest.Provisioned(t)
	return &bundle{srv: s, nc: nc, js: js, dir: coordtest.SocketDir(t)}
}

func (b *bundle) onEvent(ev coordination.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, ev)
}

func (b *bundle) eventsOf(runID string, kind coordination.EventKind) []coordination.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []coordination.Event
	for _, ev := range b.events {
		if ev.RunID == runID && ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// host returns a Host on its own connection (as a worker has), recording
// events in b.
func (b *bundle) host(t *testing.T, cfg coordination.Config) *coordination.Host {
	t.Helper()
	cfg.OnEvent = b.onEvent
	// Most tests call status and send in tight loops; the rate limits have
	// their own tests (limits_test.go).
	if cfg.ReadRate == 0 {
		cfg.ReadRate = -1
	}
	h, err := coordination.NewHost(coordtest.Connect(t, b.srv), cfg)
	require.NoError(t, err)
	return h
}

// serve serves run on h and returns the session and an MCP client whose
// bridge relays to it. The session is closed when the test ends.
func (b *bundle) serve(t *testing.T, h *coordination.Host, runID, group string) (*coordination.Session, *mcp.ClientSession) {
	t.Helper()
	path := coordtest.SocketPath(b.dir, runID)
	s, err := h.Serve(context.Background(), coordination.RunInfo{RunID: runID, Group: group, Profile: "shell"}, path)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s, coordtest.Bridge(t, path)
}

func send(t *testing.T, cs *mcp.ClientSession, to, body string) relay.SendResponse {
	t.Helper()
	return coordtest.Decode[relay.SendResponse](t, cs, "send", map[string]any{"to": to, "body": body})
}

func inbox(t *testing.T, cs *mcp.ClientSession, wait int) []relay.Message {
	t.Helper()
	return coordtest.Decode[relay.InboxResponse](t, cs, "inbox", map[string]any{"wait_seconds": wait}).Messages
}

func status(t *testing.T, cs *mcp.ClientSession) relay.Status {
	t.Helper()
	return coordtest.Decode[relay.Status](t, cs, "status", map[string]any{})
}

// requireUnread waits for status to count n unread messages: the server
// counts a message stored a moment ago asynchronously.
func requireUnread(t *testing.T, cs *mcp.ClientSession, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := status(t, cs).Unread
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unread: want %d, got %d", n, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// toolError calls tool and returns its error text, failing unless the
// result is a tool error.
func toolError(t *testing.T, cs *mcp.ClientSession, tool string, args any) string {
	t.Helper()
	res := coordtest.Call(t, cs, tool, args)
	require.True(t, res.IsError, "want a tool error, got %s", coordtest.Text(res))
	return coordtest.Text(res)
}

func TestRoundTripBetweenTwoRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	sa, a := b.serve(t, h, "run-a", "g1")
	sb, bb := b.serve(t, h, "run-b", "g1")
	require.NoError(t, sb.SetState(context.Background(), messages.StateRunning))

	st := status(t, a)
	require.Equal(t, "run-a", st.RunID)
	require.Equal(t, "g1", st.Group)
	require.Equal(t, "shell", st.Profile)
	require.Len(t, st.Peers, 1)
	require.Equal(t, "run-b", st.Peers[0].RunID)
	require.Equal(t, "running", st.Peers[0].State)
	require.WithinDuration(t, time.Now(), st.Peers[0].StartedAt, time.Minute)
	require.Equal(t, 0, st.Unread)
	require.Equal(t, "queued", status(t, bb).Peers[0].State)

	sent := send(t, a, "run-b", "hello b")
	require.NotEmpty(t, sent.MessageID)
	require.False(t, sent.Duplicate)
	requireUnread(t, bb, 1)

	msgs := inbox(t, bb, 0)
	require.Len(t, msgs, 1)
	require.Equal(t, sent.MessageID, msgs[0].ID)
	require.Equal(t, "run-a", msgs[0].From)
	require.Equal(t, "run-b", msgs[0].To)
	require.Equal(t, "hello b", msgs[0].Body)
	require.WithinDuration(t, time.Now(), msgs[0].Time, time.Minute)
	requireUnread(t, bb, 0)
	require.Empty(t, inbox(t, bb, 0), "read messages are not returned again")

	// Broadcasts reach every other run, and not their sender.
	send(t, bb, "all", "hello everyone")
	// The server counts a stored message in b's inbox consumer in the
	// background: once it has, b's status must not count its own.
	inboxB, err := b.js.Consumer(context.Background(), coordination.StreamName, coordination.InboxName("run-b"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := inboxB.Info(context.Background())
		return err == nil && info.NumPending == 1
	}, 5*time.Second, 10*time.Millisecond, "the server never counted the broadcast in b's inbox")
	require.Equal(t, 0, status(t, bb).Unread, "own broadcast is not unread")
	got := inbox(t, a, 0)
	require.Len(t, got, 1)
	require.Equal(t, "run-b", got[0].From)
	require.Equal(t, "all", got[0].To)
	require.Empty(t, inbox(t, bb, 0))

	// The worker heard about all of it.
	require.True(t, sa.Connected())
	require.True(t, sb.Connected())
	require.Len(t, b.eventsOf("run-a", coordination.EventConnected), 1)
	sentEv := b.eventsOf("run-a", coordination.EventSent)
	require.Len(t, sentEv, 1)
	require.Equal(t, "run-b", sentEv[0].To)
	require.Equal(t, sent.MessageID, sentEv[0].MessageID)
	require.Equal(t, len("hello b"), sentEv[0].Bytes)
	readEv := b.eventsOf("run-b", coordination.EventRead)
	require.Len(t, readEv, 1)
	require.Equal(t, []string{sent.MessageID}, readEv[0].MessageIDs)
}

func TestIdempotencyKeyDedupes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")

	args := map[string]any{"to": "b", "body": "once", "idempotency_key": "k-1"}
	first := coordtest.Decode[relay.SendResponse](t, a, "send", args)
	again := coordtest.Decode[relay.SendResponse](t, a, "send", args)
	require.Equal(t, first.MessageID, again.MessageID)
	require.False(t, first.Duplicate)
	require.True(t, again.Duplicate)
	other := coordtest.Decode[relay.SendResponse](t, a, "send", map[string]any{"to": "b", "body": "twice", "idempotency_key": "k-2"})
	require.NotEqual(t, first.MessageID, other.MessageID)

	// The key is scoped by sender: b's "k-1" is its own message.
	fromB := coordtest.Decode[relay.SendResponse](t, bb, "send", map[string]any{"to": "a", "body": "mine", "idempotency_key": "k-1"})
	require.False(t, fromB.Duplicate)

	msgs := inbox(t, bb, 0)
	require.Len(t, msgs, 2)
	require.Equal(t, "once", msgs[0].Body)
	require.Equal(t, "twice", msgs[1].Body)
}

func TestSendRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g1")
	_, c := b.serve(t, h, "c", "g2")

	tests := []struct {
		name string
		args map[string]any
		want string
	}{
		{"too large", map[string]any{"to": "all", "body": strings.Repeat("x", relay.MaxBodyBytes+1)}, "largest allowed is 16384 bytes"},
		{"empty body", map[string]any{"to": "all", "body": ""}, "body is empty"},
		{"unknown peer", map[string]any{"to": "nobody", "body": "hi"}, `unknown peer "nobody"`},
		{"other group", map[string]any{"to": "c", "body": "hi"}, `unknown peer "c"`},
		{"dotted", map[string]any{"to": "g2.c", "body": "hi"}, "not a run id"},
		{"wildcard", map[string]any{"to": "*", "body": "hi"}, "not a run id"},
		{"full wildcard", map[string]any{"to": ">", "body": "hi"}, "not a run id"},
		{"self", map[string]any{"to": "a", "body": "hi"}, "your own run id"},
		{"no recipient", map[string]any{"body": "hi"}, `missing properties: ["to"]`},
		{"empty recipient", map[string]any{"to": "", "body": "hi"}, "to is empty"},
		{"forged sender", map[string]any{"to": "all", "body": "hi", "from": "c"}, "from"},
	}
	for _, tt := range tests {
		msg := toolError(t, a, "send", tt.args)
		require.Contains(t, msg, tt.want, tt.name)
	}
	require.Contains(t, toolError(t, a, "inbox", map[string]any{"wait_seconds": 31}), "wait_seconds 31 is out of range: 0 to 30")
	require.Contains(t, toolError(t, a, "inbox", map[string]any{"max": 500}), "max 500 is out of range")

	// Nothing reached group g2, nor any subject but g1's.
	info, err := b.js.Stream(context.Background(), coordination.StreamName)
	require.NoError(t, err)
	si, err := info.Info(context.Background(), jetstream.WithSubjectFilter("jetcrew.coord.>"))
	require.NoError(t, err)
	require.Zero(t, si.State.Msgs, "subjects: %v", si.State.Subjects)
	require.Empty(t, inbox(t, c, 0))
}

func TestBodyTooLargeRefusedByHostToo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	b.serve(t, h, "a", "g")
	// Straight to the socket, past the bridge's own check.
	_, err := relay.NewClient(coordtest.SocketPath(b.dir, "a")).Send(context.Background(),
		relay.SendRequest{To: "all", Body: strings.Repeat("y", relay.MaxBodyBytes+1)})
	var re *relay.Error
	require.ErrorAs(t, err, &re)
	require.Equal(t, http.StatusRequestEntityTooLarge, re.Status)
	require.Equal(t, relay.CodeTooLarge, re.Code)
	require.Contains(t, re.Message, "16384")
}

func TestSenderCannotBeForged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")

	// Through MCP: the schema has no "from".
	require.Contains(t, toolError(t, a, "send", map[string]any{"to": "b", "body": "x", "from": "b"}), "from")

	// Straight to the socket: a "from" field is refused, a header ignored.
	hc := socketHTTP(coordtest.SocketPath(b.dir, "a"))
	resp, err := hc.Post("http://x"+relay.PathSend, "application/json",
		strings.NewReader(`{"to":"b","body":"forged","from":"b"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	req, err := http.NewRequest(http.MethodPost, "http://x"+relay.PathSend, strings.NewReader(`{"to":"b","body":"header"}`))
	require.NoError(t, err)
	req.Header.Set(coordination.HeaderFrom, "operator")
	resp, err = hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	msgs := inbox(t, bb, 0)
	require.Len(t, msgs, 1)
	require.Equal(t, "header", msgs[0].Body)
	require.Equal(t, "a", msgs[0].From)

	// And on the wire, the header is the socket's run.
	stream, err := b.js.Stream(context.Background(), coordination.StreamName)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(context.Background(), coordination.Subject(coordtest.Group("g"), "b"))
	require.NoError(t, err)
	require.Equal(t, "a", m.Header.Get(coordination.HeaderFrom))
}

func TestRunOfAnotherGroupCannotRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g1")
	_, bb := b.serve(t, h, "b", "g1")
	_, c := b.serve(t, h, "c", "g2")

	send(t, a, "b", "private")
	send(t, a, "all", "g1 only")
	st := status(t, c)
	require.Empty(t, st.Peers, "runs of g1 are not c's peers")
	require.Equal(t, 0, st.Unread)
	require.Empty(t, inbox(t, c, 1))
	require.Len(t, inbox(t, bb, 0), 2)
}

func TestInboxSurvivesWorkerRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h1 := b.host(t, coordination.Config{})
	_, a := b.serve(t, h1, "a", "g")
	sb, bb := b.serve(t, h1, "b", "g")

	send(t, a, "b", "read before")
	require.Len(t, inbox(t, bb, 0), 1)
	send(t, a, "b", "unread 1")
	send(t, a, "b", "unread 2")

	// The worker stops: it detaches the run, keeping its inbox.
	require.NoError(t, sb.Detach(context.Background()))
	_, err := os.Stat(coordtest.SocketPath(b.dir, "b"))
	require.ErrorIs(t, err, os.ErrNotExist, "detach removes the socket")
	require.Contains(t, toolError(t, bb, "inbox", map[string]any{}), "coordination unavailable")
	send(t, a, "b", "while away")

	// A new worker process serves the run again.
	h2 := b.host(t, coordination.Config{})
	_, bb2 := b.serve(t, h2, "b", "g")
	requireUnread(t, bb2, 3)
	msgs := inbox(t, bb2, 0)
	require.Len(t, msgs, 3)
	require.Equal(t, []string{"unread 1", "unread 2", "while away"}, []string{msgs[0].Body, msgs[1].Body, msgs[2].Body})
}

func TestInboxSurvivesCrashedWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h1 := b.host(t, coordination.Config{})
	_, a := b.serve(t, h1, "a", "g")
	path := coordtest.SocketPath(b.dir, "b")
	old, err := h1.Serve(context.Background(), coordination.RunInfo{RunID: "b", Group: "g"}, path)
	require.NoError(t, err)
	send(t, a, "b", "before the crash")

	// The old worker never cleaned up; its socket file is still there. A
	// new Host replaces the stale socket and resumes the inbox.
	h2 := b.host(t, coordination.Config{})
	_, bb := b.serve(t, h2, "b", "g")
	msgs := inbox(t, bb, 0)
	require.Len(t, msgs, 1)
	require.Equal(t, "before the crash", msgs[0].Body)

	// The abandoned session, closed late (its worker thought the run
	// ended), leaves the new socket, presence and inbox alone.
	require.NoError(t, old.Close(context.Background()))
	_, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, "b", status(t, bb).RunID)
	require.Len(t, status(t, a).Peers, 1)
	_, err = b.js.Consumer(context.Background(), coordination.StreamName, coordination.InboxName("b"))
	require.NoError(t, err)
	send(t, a, "b", "after")
	require.Len(t, inbox(t, bb, 0), 1)
}

func TestOperatorMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")

	// An operator watches the whole conversation with a plain subscription.
	watch, err := b.nc.SubscribeSync(coordination.SubjectGroup(coordtest.Group("g")))
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())

	// `nats pub jetcrew.coord.default.g.b 'text'`: a core publish, no headers.
	require.NoError(t, b.nc.Publish(coordination.Subject(coordtest.Group("g"), "b"), []byte("from a person")))
	msgs := inbox(t, bb, 5)
	require.Len(t, msgs, 1)
	require.Equal(t, "operator", msgs[0].From)
	require.Equal(t, "from a person", msgs[0].Body)

	// A run answers the operator; the operator's subscription sees it.
	send(t, bb, "operator", "thanks")
	seen := map[string]string{}
	for range 2 {
		m, err := watch.NextMsg(5 * time.Second)
		require.NoError(t, err)
		seen[m.Subject] = string(m.Data)
		if m.Subject == coordination.Subject(coordtest.Group("g"), "operator") {
			require.Equal(t, "b", m.Header.Get(coordination.HeaderFrom))
		}
	}
	require.Equal(t, map[string]string{"jetcrew.coord.default.g.b": "from a person", "jetcrew.coord.default.g.operator": "thanks"}, seen)

	// Operator broadcasts reach every run.
	require.NoError(t, b.nc.Publish(coordination.Subject(coordtest.Group("g"), "all"), []byte("all hands")))
	for _, cs := range []*mcp.ClientSession{a, bb} {
		got := inbox(t, cs, 5)
		require.Len(t, got, 1)
		require.Equal(t, "operator", got[0].From)
		require.Equal(t, "all", got[0].To)
	}
}

func TestInboxLongPoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")

	type result struct {
		msgs []relay.Message
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		res := coordtest.Call(t, bb, "inbox", map[string]any{"wait_seconds": 20})
		var out relay.InboxResponse
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &out)
		done <- result{out.Messages, time.Since(start)}
	}()
	// Wait until b's long poll is parked on the server, then send.
	coordtest.WaitLongPoll(t, b.srv, "b")
	send(t, a, "b", "wake up")
	r := <-done
	require.Len(t, r.msgs, 1)
	require.Equal(t, "wake up", r.msgs[0].Body)
	require.Less(t, r.took, 10*time.Second)

	// An own broadcast does not end the wait early.
	start := time.Now()
	send(t, bb, "all", "mine")
	require.Empty(t, inbox(t, bb, 1))
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond)
}

func TestSocketMissing(t *testing.T) {
	t.Parallel()
	cs := coordtest.Bridge(t, filepath.Join(coordtest.SocketDir(t), "absent.sock"))
	tools, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	require.ElementsMatch(t, []string{"status", "send", "inbox", "claim", "release", "claims", "ask", "reply"}, names)
	for tool, args := range map[string]any{
		"status":  map[string]any{},
		"send":    map[string]any{"to": "all", "body": "anyone?"},
		"inbox":   map[string]any{"wait_seconds": 1},
		"claim":   map[string]any{"paths": []string{"src"}, "reason": "x"},
		"release": map[string]any{"paths": []string{"src"}},
		"claims":  map[string]any{},
		"ask":     map[string]any{"to": "operator", "question": "anyone?", "timeout_seconds": 1},
		"reply":   map[string]any{"question_id": "qaaaaaaaaaaaaaaaa", "answer": "yes"},
	} {
		msg := toolError(t, cs, tool, args)
		require.True(t, strings.HasPrefix(msg, "coordination unavailable: "), msg)
		require.Contains(t, msg, "absent.sock")
	}
}

func TestNATSDownIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{OpTimeout: time.Second})
	_, a := b.serve(t, h, "a", "g")
	start := time.Now()
	b.srv.Shutdown()
	b.srv.WaitForShutdown()
	t.Logf("shutdown took %s", time.Since(start))
	for tool, args := range map[string]any{
		"status": map[string]any{},
		"send":   map[string]any{"to": "all", "body": "anyone?"},
		"inbox":  map[string]any{},
	} {
		start := time.Now()
		msg := toolError(t, a, tool, args)
		t.Logf("%s took %s: %s", tool, time.Since(start), msg)
		require.True(t, strings.HasPrefix(msg, "coordination unavailable: "), msg)
	}
	refused := b.eventsOf("a", coordination.EventRefused)
	require.NotEmpty(t, refused)
	require.Contains(t, refused[0].Reason, "coordination unavailable")
}

func TestRateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{SendRate: 0.01, SendBurst: 2})
	_, a := b.serve(t, h, "a", "g")
	send(t, a, "operator", "1")
	send(t, a, "operator", "2")
	require.Contains(t, toolError(t, a, "send", map[string]any{"to": "operator", "body": "3"}), "rate limited")
}

func TestCloseLeavesNoTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	path := coordtest.SocketPath(b.dir, "b")
	sb, err := h.Serve(context.Background(), coordination.RunInfo{RunID: "b", Group: "g"}, path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket|coordination.SocketMode, fi.Mode())
	require.Len(t, status(t, a).Peers, 1)

	// A later delivery of the run supersedes this session: the first is
	// detached (its socket gone), and its Close leaves the later one's
	// presence alone.
	sb2, err := h.Serve(context.Background(), coordination.RunInfo{RunID: "b", Group: "g"}, path+"2")
	require.NoError(t, err)
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, sb.Close(context.Background()))
	require.Len(t, status(t, a).Peers, 1, "the superseded session's close leaves the later one's presence")

	require.NoError(t, sb2.Close(context.Background()))
	require.NoError(t, sb2.Close(context.Background()), "close is safe twice")
	require.NoError(t, sb2.Detach(context.Background()))
	_, err = os.Stat(path + "2")
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Empty(t, status(t, a).Peers)
	_, err = b.js.Consumer(context.Background(), coordination.StreamName, coordination.InboxName("b"))
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound)
	require.Contains(t, toolError(t, a, "send", map[string]any{"to": "b", "body": "gone?"}), "unknown peer")
}

func TestServeRefusesBadSetups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	ctx := context.Background()
	ok := coordination.RunInfo{RunID: "r", Group: "g"}
	for name, tt := range map[string]struct {
		run  coordination.RunInfo
		path string
		want string
	}{
		"reserved all":      {coordination.RunInfo{RunID: "all", Group: "g"}, "x.sock", "reserved"},
		"reserved operator": {coordination.RunInfo{RunID: "operator", Group: "g"}, "x.sock", "reserved"},
		"dotted group":      {coordination.RunInfo{RunID: "r", Group: "a.b"}, "x.sock", "group"},
		"no group":          {coordination.RunInfo{RunID: "r"}, "x.sock", "group"},
		"wildcard id":       {coordination.RunInfo{RunID: "r*", Group: "g"}, "x.sock", "run id"},
		"path too long":     {ok, strings.Repeat("p", 120) + ".sock", "at most 107"},
		"not a socket":      {ok, "file", "not a socket"},
	} {
		path := filepath.Join(b.dir, tt.path)
		if tt.path == "file" {
			require.NoError(t, os.WriteFile(path, nil, 0o600))
		}
		_, err := h.Serve(ctx, tt.run, path)
		require.ErrorContains(t, err, tt.want, name)
	}

	// Without Provision, Serve says what is missing.
	bare := coordtest.StartServer(t)
	h2, err := coordination.NewHost(coordtest.Connect(t, bare), coordination.Config{})
	require.NoError(t, err)
	_, err = h2.Serve(ctx, ok, filepath.Join(b.dir, "bare.sock"))
	require.ErrorContains(t, err, "Provision")
	_, err = os.Stat(filepath.Join(b.dir, "bare.sock"))
	require.ErrorIs(t, err, os.ErrNotExist, "a failed Serve leaves no socket")
}

func TestNewHostValidates(t *testing.T) {
	t.Parallel()
	s := coordtest.StartServer(t)
	nc := coordtest.Connect(t, s)
	for _, cfg := range []coordination.Config{
		{SendBurst: -1},
		{OpTimeout: time.Millisecond},
		{InboxInactiveThreshold: time.Second},
	} {
		_, err := coordination.NewHost(nc, cfg)
		require.Error(t, err)
	}
	d := coordination.Config{}.WithDefaults()
	require.Equal(t, 1.0, d.SendRate)
	require.Equal(t, 10, d.SendBurst)
	require.Equal(t, 1.0, d.ReadRate)
	require.Equal(t, 10, d.ReadBurst)
	require.Equal(t, coordination.RequestReadTimeout, d.RequestReadTimeout)
	require.Equal(t, 48*time.Hour, d.InboxInactiveThreshold)
	require.Greater(t, d.InboxInactiveThreshold, messages.MaxTimeout)
}

func TestProvisionIsIdempotent(t *testing.T) {
	t.Parallel()
	_, _, js := coordtest.Provisioned(t)
	ctx := context.Background()
	require.NoError(t, coordination.Provision(ctx, js, 1))
	st, err := js.Stream(ctx, coordination.StreamName)
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	require.Equal(t, []string{"jetcrew.coord.>"}, cfg.Subjects)
	require.Equal(t, jetstream.LimitsPolicy, cfg.Retention)
	require.Equal(t, jetstream.FileStorage, cfg.Storage)
	require.Equal(t, coordination.DuplicateWindow, cfg.Duplicates)
	kv, err := js.KeyValue(ctx, coordination.BucketPeers)
	require.NoError(t, err)
	kst, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, coordination.PeerTTL, kst.TTL())
	require.Error(t, coordination.Provision(ctx, js, -1))
}

func TestStageRunDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runs", "r1")
	require.NoError(t, coordination.StageRunDir(dir))
	require.NoError(t, coordination.StageRunDir(dir), "staging twice (a retry) works")
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, coordination.RunDirMode, fi.Mode().Perm())
	fi, err = os.Stat(filepath.Dir(dir))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())

	path := filepath.Join(dir, messages.MCPConfigName)
	fi, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, messages.MCPConfigMode, fi.Mode().Perm())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc map[string]map[string]map[string]any
	require.NoError(t, json.Unmarshal(data, &doc))
	require.Equal(t, map[string]map[string]map[string]any{
		"mcpServers": {"jetcrew": {"type": "stdio", "command": "/opt/jetcrew/bridge"}},
	}, doc)
	compact := &bytes.Buffer{}
	require.NoError(t, json.Compact(compact, data))
	require.Equal(t, `{"mcpServers":{"jetcrew":{"type":"stdio","command":"/opt/jetcrew/bridge"}}}`, compact.String())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temp file left behind")
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "jetcrew.coord.default.g.r1", coordination.Subject(coordtest.Group("g"), "r1"))
	require.Equal(t, "jetcrew.coord.default.g.>", coordination.SubjectGroup(coordtest.Group("g")))
	require.Equal(t, "inbox-r1", coordination.InboxName("r1"))
	require.Equal(t, "default.g.r1", coordination.PeerKey(coordtest.Group("g"), "r1"))
	require.Equal(t, messages.ContainerRunDir+"/"+messages.SocketName, messages.ContainerSocketPath)
	require.Equal(t, bridge.Name, messages.MCPServerName)
}

// socketHTTP returns an HTTP client that dials the unix socket at path.
func socketHTTP(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}, Timeout: 10 * time.Second}
}

func TestInboxMaxAndOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, a := b.serve(t, h, "a", "g")
	_, bb := b.serve(t, h, "b", "g")
	for _, body := range []string{"1", "2", "3"} {
		send(t, a, "b", body)
	}
	first := coordtest.Decode[relay.InboxResponse](t, bb, "inbox", map[string]any{"max": 2}).Messages
	require.Len(t, first, 2)
	require.Equal(t, "1", first[0].Body)
	require.Equal(t, "2", first[1].Body)
	requireUnread(t, bb, 1)
	rest := inbox(t, bb, 0)
	require.Len(t, rest, 1)
	require.Equal(t, "3", rest[0].Body)
}

// A run that named no group (its own group, named by its id) costs no
// presence write or inbox consumer until its bridge connects, and its Close
// then sends nothing; once connected it is in its presence list, which no
// other run joins: a run naming the solo run's id as its group is in
// another group.
func TestSoloRunJoinsOnConnect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	peers, err := b.js.KeyValue(context.Background(), coordination.BucketPeers)
	require.NoError(t, err)
	keys := func() []string {
		ks, err := peers.ListKeys(context.Background())
		require.NoError(t, err)
		var out []string
		for k := range ks.Keys() {
			out = append(out, k)
		}
		return out
	}

	silent, err := h.Serve(context.Background(), coordination.RunInfo{RunID: "silent", Group: "silent"}, coordtest.SocketPath(b.dir, "silent"))
	require.NoError(t, err)
	require.Empty(t, keys(), "a solo run joins its presence list only when its bridge connects")
	require.NoError(t, silent.SetState(context.Background(), messages.StateRunning))
	require.Empty(t, keys())
	require.NoError(t, silent.Close(context.Background()))

	_, solo := b.serve(t, h, "solo", "solo")
	require.Empty(t, status(t, solo).Peers)
	require.Equal(t, []string{coordination.PeerKey(messages.GroupRef{Pool: "default", Name: "solo", Own: true}, "solo")}, keys())
	_, other := b.serve(t, h, "joiner", "solo")
	require.Empty(t, status(t, other).Peers, "a group named after a solo run is not its group")
	require.Empty(t, status(t, solo).Peers)
}

// A message the server relayed into a run's inbox subject (another
// stream's RePublish, a source of JETCREW_COORD) is not a message a worker
// wrote: the run never reads it, whatever Jetcrew-From it carries. (Under
// package roles only workers configure streams; this is for a server whose
// permissions let someone else.)
func TestInboxRefusesRelayedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	_, victim := b.serve(t, h, "victim", "g")
	_, peer := b.serve(t, h, "peer", "g")
	ctx := context.Background()

	// RePublish: a stream of someone's republishing to the run's subject.
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.in"},
		RePublish: &jetstream.RePublish{Source: "relay.in", Destination: coordination.Subject(coordtest.Group("g"), "victim")}})
	require.NoError(t, err)
	m := nats.NewMsg("relay.in")
	m.Header.Set(coordination.HeaderFrom, "peer")
	m.Data = []byte("republished")
	_, err = b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
	// Sources: JETCREW_COORD sourcing a stream of someone's, transformed
	// onto the run's subject.
	_, err = b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORIGIN", Subjects: []string{"origin.in"}})
	require.NoError(t, err)
	m = nats.NewMsg("origin.in")
	m.Header.Set(coordination.HeaderFrom, "peer")
	m.Data = []byte("sourced")
	_, err = b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
	coord, err := b.js.Stream(ctx, coordination.StreamName)
	require.NoError(t, err)
	cfg := coord.CachedInfo().Config
	cfg.Sources = []*jetstream.StreamSource{{Name: "ORIGIN", SubjectTransforms: []jetstream.SubjectTransformConfig{
		{Source: "origin.in", Destination: coordination.Subject(coordtest.Group("g"), "victim")}}}}
	_, err = b.js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := coord.Info(ctx)
		return err == nil && info.State.Msgs >= 2
	}, 5*time.Second, 10*time.Millisecond, "both relays stored on the run's subject")

	// The peer's own message, after them, is the only one the run reads.
	send(t, peer, "victim", "really from the peer")
	msgs := inbox(t, victim, 1)
	require.Len(t, msgs, 1)
	require.Equal(t, "really from the peer", msgs[0].Body)
	require.Equal(t, "peer", msgs[0].From)
	require.Empty(t, inbox(t, victim, 0), "the relayed messages are not handed out later either")
	requireUnread(t, victim, 0)
}
