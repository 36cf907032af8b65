package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// The bridge tells the agent that the operator's steers wait unread in its
// inbox in two ways: a note added to the result of every tool call made
// meanwhile (unreadNote, from the worker's relay.HeaderUnreadSteers), which
// every MCP client shows its model, and an MCP logging notification
// (notifications/message, level "notice", logger "jetcrew") when a steer
// arrives (WatchSteers), which reaches a client that has set a log level.

// UnreadNote is the text added to a tool result while n steers wait unread.
func UnreadNote(n int) string {
	return fmt.Sprintf("jetcrew: %d message(s) from the operator wait unread in your inbox: call %s now and follow them before you go on.", n, ToolInbox)
}

// unreadNote is receiving middleware adding UnreadNote to the result of a
// tools/call (but inbox's own) while the worker says steers wait unread.
func unreadNote(c *relay.Client) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if err != nil || method != "tools/call" {
				return res, err
			}
			ctr, ok := res.(*mcp.CallToolResult)
			if !ok || ctr == nil {
				return res, err
			}
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok && p.Name == ToolInbox {
				return res, err
			}
			if n := c.UnreadSteers(); n > 0 {
				ctr.Content = append(ctr.Content, &mcp.TextContent{Text: UnreadNote(n)})
			}
			return res, err
		}
	}
}

// noticeWait is each notice long poll's wait, in seconds.
const noticeWait = 25

// WatchSteers long-polls the worker for steers put in the run's inbox and
// sends every session of srv a logging notification for each new one,
// until ctx ends or c is closed. A socket that cannot be reached is tried
// again every few seconds (past c's own reconnect window). Its cursor is
// the worker's count of steers and the session counting them
// (relay.Notice): when another worker's session serves the socket (the run
// was adopted), the poll counts from that session's start, so a steer put
// in the inbox after the worker was replaced is announced once, as any.
func WatchSteers(ctx context.Context, srv *mcp.Server, c *relay.Client) {
	var seen uint64
	var session string
	for ctx.Err() == nil {
		n, err := c.Notice(ctx, relay.NoticeRequest{After: seen, Session: session, WaitSeconds: noticeWait})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(3 * time.Second):
			}
			continue
		}
		if (n.Seq > seen || n.Session != session) && n.Unread > 0 {
			for ss := range srv.Sessions() {
				_ = ss.Log(ctx, &mcp.LoggingMessageParams{Level: "notice", Logger: Name, Data: UnreadNote(n.Unread)})
			}
		}
		seen, session = n.Seq, n.Session
	}
}
