// Package bridge is the MCP server that runs inside a run container (the
// binary is cmd/jetcrew-bridge). It offers an agent three tools, status, send
// and inbox, and relays each call over the run's unix socket to the worker
// (package relay), which maps it onto NATS.
//
// Every failure of a tool call, including a missing socket or an unreachable
// NATS server, is a tool error (CallToolResult.IsError) whose text the agent
// can act on, never a protocol error.
package bridge

import (
	"context"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// Name is the MCP implementation name the server reports, and the server's
// key in the generated mcp.json.
const Name = "jetcrew"

// Tool names.
const (
	// ToolStatus shows the run, its peers and its unread count.
	ToolStatus = "status"
	// ToolSend sends one message.
	ToolSend = "send"
	// ToolInbox reads unread messages, optionally waiting for one.
	ToolInbox = "inbox"
)

// Options configures NewServer. The zero value is valid.
type Options struct {
	// Version is the implementation version reported to the client.
	// Default "dev".
	Version string
	// Logger receives the MCP SDK's diagnostics. Nil discards them. It
	// must never write to the stdio transport's stdout.
	Logger *slog.Logger
}

const instructions = `You are one run in a group of agents coordinated by jetcrew. ` +
	`Call status to learn your run id, your group and your peers; send to message a peer by run id, ` +
	`"all" for every other run of your group, or "operator" for the people watching; ` +
	`inbox to read messages sent to you (wait_seconds long-polls). Messages are plain text up to 16 KiB.`

// NewServer returns an MCP server offering the status, send and inbox tools,
// each relayed through c. Serve it with server.Run(ctx, transport).
func NewServer(c *relay.Client, opts Options) *mcp.Server {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: Name, Title: "jetcrew coordination", Version: opts.Version},
		&mcp.ServerOptions{Instructions: instructions, Logger: opts.Logger})

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolStatus,
		Description: "Show this run's id, group and profile, the other runs of the group that are queued or running " +
			"(their run ids are what send's `to` takes), and how many messages wait in your inbox.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, relay.Status, error) {
		st, err := c.Status(ctx)
		return nil, st, err
	})

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolSend,
		Description: "Send a text message to a peer (its run id from status), to `all` (every other run of your group) " +
			"or to `operator` (the people watching). The body is at most 16384 bytes. Give an idempotency_key to make " +
			"a retry safe: a repeat with the same key sends nothing new and returns the same message id. Returns the message id.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), OpenWorldHint: new(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in relay.SendRequest) (*mcp.CallToolResult, relay.SendResponse, error) {
		if err := relay.ValidateSend(in); err != nil {
			return nil, relay.SendResponse{}, err
		}
		resp, err := c.Send(ctx, in)
		return nil, resp, err
	})

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolInbox,
		Description: "Return your unread messages, oldest first (id, from, to, body, time), and mark them read. " +
			"With wait_seconds (up to 30) it waits for a message to arrive when none is unread. max caps how many (default 10, up to 50).",
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in relay.InboxRequest) (*mcp.CallToolResult, relay.InboxResponse, error) {
		in, err := relay.NormalizeInbox(in)
		if err != nil {
			return nil, relay.InboxResponse{}, err
		}
		resp, err := c.Inbox(ctx, in)
		if err == nil && resp.Messages == nil {
			resp.Messages = []relay.Message{}
		}
		return nil, resp, err
	})
	return s
}
