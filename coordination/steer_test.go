package coordination_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/bridge"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// steer sends one steer request as an operator does and decodes the reply.
func steer(t *testing.T, nc *nats.Conn, runID, id, text string) messages.SteerReply {
	t.Helper()
	m := nats.NewMsg(messages.SubjectSteer(runID))
	if id != "" {
		m.Header.Set(messages.HeaderSteerID, id)
	}
	m.Data = []byte(text)
	resp, err := nc.RequestMsg(m, 10*time.Second)
	require.NoError(t, err)
	var r messages.SteerReply
	require.NoError(t, json.Unmarshal(resp.Data, &r))
	return r
}

// running serves run and marks it running, as the worker does once its
// container started.
func (b *bundle) running(t *testing.T, h *coordination.Host, runID string, input bool) (*coordination.Session, *relay.Client) {
	t.Helper()
	s, _ := b.serve(t, h, runID, "g")
	require.NoError(t, s.SetState(context.Background(), messages.StateRunning))
	s.SetSteerInput(input)
	c := relay.NewClient(s.SocketPath())
	t.Cleanup(c.Close)
	return s, c
}

// waitPoll waits until a long poll (the launcher's or the bridge's) waits
// on s for a steer, so that the steer a test sends next is one the poll
// must wake for, not one it finds already there.
func waitPoll(t *testing.T, s *coordination.Session) {
	t.Helper()
	require.Eventually(t, func() bool { return coordination.WaitingPolls(s) > 0 }, 10*time.Second, 2*time.Millisecond,
		"no long poll reached the session")
}

// launcher stands in for `jetcrew-bridge launch --steer`: it takes steers
// and acknowledges each as delivered, passing its text to got.
func launcher(t *testing.T, c *relay.Client, got chan<- string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			resp, err := c.SteerNext(ctx, relay.SteerNextRequest{WaitSeconds: 5})
			if err != nil {
				return
			}
			for _, sv := range resp.Steers {
				got <- sv.Text
				_ = c.SteerAck(ctx, relay.SteerAck{ID: sv.ID, Delivered: true})
			}
		}
	}()
}

func TestSteerDeliveredToTheLauncherAndTheInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, c := b.running(t, h, "r1", true)
	got := make(chan string, 4)
	launcher(t, c, got)

	// The launcher's polls are not the agent's bridge connecting.
	waitPoll(t, s)
	require.False(t, s.Connected())
	r := steer(t, b.nc, "r1", "s-1", "stop editing api.go; look at the tests first")
	require.Equal(t, messages.SteerDelivered, r.Outcome, r.Reason)
	require.NotEmpty(t, r.MessageID)
	require.Equal(t, "stop editing api.go; look at the tests first", <-got)

	// The inbox has it too, from the operator, and the reply said so.
	cs := b.bridge(t, s)
	msgs := inbox(t, cs, 2)
	require.Len(t, msgs, 1)
	require.Equal(t, messages.RecipientOperator, msgs[0].From)
	require.Equal(t, r.MessageID, msgs[0].ID)

	// Idempotent by id: the same outcome, nothing written or stored anew.
	again := steer(t, b.nc, "r1", "s-1", "stop editing api.go; look at the tests first")
	require.True(t, again.Duplicate)
	require.Equal(t, messages.SteerDelivered, again.Outcome)
	require.Empty(t, inbox(t, cs, 0))

	evs := b.eventsOf("r1", coordination.EventSteered)
	require.Len(t, evs, 2)
	require.Equal(t, messages.SteerDelivered, evs[0].Outcome)
	require.Equal(t, "s-1", evs[0].SteerID)
	require.True(t, evs[1].Duplicate)

	// The launcher writes steers in order: the next one it writes is the
	// next steer, so the repeat never reached it.
	r = steer(t, b.nc, "r1", "s-2", "now the docs")
	require.Equal(t, messages.SteerDelivered, r.Outcome, r.Reason)
	require.Equal(t, "now the docs", <-got)
}

func TestSteerQueuedWithoutStreamedInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, c := b.running(t, h, "r1", false)

	// The bridge's notice wakes on the steer.
	notice := make(chan relay.Notice, 1)
	go func() {
		n, err := c.Notice(context.Background(), relay.NoticeRequest{WaitSeconds: 10})
		if err == nil {
			notice <- n
		}
	}()
	waitPoll(t, s)
	r := steer(t, b.nc, "r1", "", "rebase on main before you push")
	require.Equal(t, messages.SteerQueued, r.Outcome)
	require.Contains(t, r.Reason, "takes no input")
	select {
	case n := <-notice:
		require.NotEmpty(t, n.Session)
		require.Equal(t, relay.Notice{Seq: 1, Unread: 1, Session: n.Session}, n)
	case <-time.After(5 * time.Second):
		t.Fatal("the notice poll did not wake on the steer")
	}

	// Every tool call's result says that a steer waits, until the inbox is
	// read.
	cs := b.bridge(t, s)
	res := status(t, cs)
	require.Equal(t, 1, res.Unread)
	require.Contains(t, coordtest.Text(coordtest.Call(t, cs, "claims", map[string]any{})), bridge.UnreadNote(1))
	_, err := c.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, c.UnreadSteers())
	require.Len(t, inbox(t, cs, 0), 1)
	_, err = c.Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, 0, c.UnreadSteers())
	require.NotContains(t, coordtest.Text(coordtest.Call(t, cs, "claims", map[string]any{})), "unread")
}

// A client that set a log level gets a notification when a steer arrives.
func TestSteerNotifiesTheMCPClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, _ := b.running(t, h, "r1", false)

	rc := relay.NewClient(s.SocketPath())
	t.Cleanup(rc.Close)
	srv := bridge.NewServer(rc, bridge.Options{Version: "test"})
	st, ct := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ss, err := srv.Connect(ctx, st, nil)
	require.NoError(t, err)
	got := make(chan string, 4)
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

	waitPoll(t, s)
	require.Equal(t, messages.SteerQueued, steer(t, b.nc, "r1", "", "please stop").Outcome)
	select {
	case note := <-got:
		require.Equal(t, bridge.UnreadNote(1), note)
	case <-time.After(5 * time.Second):
		t.Fatal("no notification")
	}
}

// Once the agent's last turn ended (its launcher closed its input), a
// steer would be read nowhere: refused, and not stored.
func TestSteerAfterTheInputClosedIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	s, c := b.running(t, h, "r1", true)
	_, err := c.SteerNext(context.Background(), relay.SteerNextRequest{Closed: true})
	require.NoError(t, err)
	r := steer(t, b.nc, "r1", "x", "one more thing")
	require.Equal(t, messages.SteerRefused, r.Outcome)
	require.Equal(t, messages.SteerFinishing, r.Code)
	require.Empty(t, inbox(t, b.bridge(t, s), 0))
}

func TestSteerRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})

	// A queued run: not running yet.
	q, _ := b.serve(t, h, "q1", "g")
	_ = q
	r := steer(t, b.nc, "q1", "a", "hello")
	require.Equal(t, messages.SteerRefused, r.Outcome)
	require.Equal(t, messages.SteerNotRunning, r.Code)

	_, _ = b.running(t, h, "r1", false)
	for _, tc := range []struct{ id, text, code string }{
		{"e", "  ", messages.SteerInvalid},
		{"n", "a\x00b", messages.SteerInvalid},
		{"u", "\xff\xfe", messages.SteerInvalid},
		{"big", strings.Repeat("x", messages.MaxSteerBytes+1), messages.SteerTooLarge},
		{"bad.id", "hello", messages.SteerInvalid},
	} {
		r := steer(t, b.nc, "r1", tc.id, tc.text)
		require.Equal(t, messages.SteerRefused, r.Outcome, tc.id)
		require.Equal(t, tc.code, r.Code, tc.id)
	}

	// The rate limit: a burst of SteerBurst (refused ones above did not
	// count: they were refused before it), then refused.
	for i := range coordination.SteerBurst {
		r := steer(t, b.nc, "r1", "", "steer "+string(rune('a'+i)))
		require.Equal(t, messages.SteerQueued, r.Outcome, r.Reason)
	}
	r = steer(t, b.nc, "r1", "", "one too many")
	require.Equal(t, messages.SteerRefused, r.Outcome)
	require.Equal(t, messages.SteerRateLimited, r.Code)

	// A run whose session has ended has nobody to answer.
	_, err := b.nc.Request(messages.SubjectSteer("gone"), []byte("hi"), time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}

// bridge returns another MCP client relaying to s.
func (b *bundle) bridge(t *testing.T, s *coordination.Session) *mcp.ClientSession {
	t.Helper()
	return coordtest.Bridge(t, s.SocketPath())
}

// A steer sent as soon as Serve returns finds the session subscribed: it is
// answered (here refused, the run being queued), never "no responders".
func TestSteerRightAfterServeIsAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.host(t, coordination.Config{})
	for i := range 40 {
		runID := fmt.Sprintf("q%d", i)
		b.serve(t, h, runID, "g")
		r := steer(t, b.nc, runID, "a", "hello")
		require.Equal(t, messages.SteerNotRunning, r.Code, runID)
	}
}
