// Package bridge is the MCP server that runs inside a run container (the
// binary is cmd/jetcrew-bridge). It offers an agent eight tools, status, send,
// inbox, claim, release, claims, ask and reply, and relays each call over the run's unix socket to the worker
// (package relay), which maps it onto NATS.
//
// Every failure of a tool call, including a missing socket or an unreachable
// NATS server, is a tool error (CallToolResult.IsError) whose text the agent
// can act on, never a protocol error.
//
// While the run's worker is replaced, a tool call waits for the socket (the
// relay client's reconnect window) and one cut off in flight is made again
// when that is safe; else it is the tool error "coordination interrupted:
// ...", saying the call may or may not have taken effect and may be made
// again (package relay, reconnect.go). WatchSteers resumes against the new
// worker's session.
package bridge

import (
	"context"
	"log/slog"
	"time"

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
	// ToolClaim claims paths or globs of the workspace for this run.
	ToolClaim = "claim"
	// ToolRelease releases claims this run holds.
	ToolRelease = "release"
	// ToolClaims lists the group's current claims.
	ToolClaims = "claims"
)

// Options configures NewServer. The zero value is valid.
type Options struct {
	// Version is the implementation version reported to the client.
	// Default "dev".
	Version string
	// Logger receives the MCP SDK's diagnostics. Nil discards them. It
	// must never write to the stdio transport's stdout.
	Logger *slog.Logger
	// ProgressEvery is how often a waiting ask sends a progress
	// notification (when the call carries a progress token). Default
	// ProgressEvery.
	ProgressEvery time.Duration
	// Workspace is the directory claims are relative to, as the bridge
	// sees it (messages.WorkspaceDir in a run container): the symlinks on
	// a claimed or released pattern are resolved there, and a claim
	// reaching files through a symlink it does not cover by their own
	// paths is refused (claimpath.go). Empty: patterns are taken as
	// given.
	Workspace string
	// NoProgressWait is how long an ask whose call carries no progress
	// token waits before it returns "no answer", the question staying
	// open and a later answer going to the run's inbox; whole seconds, at
	// least 1. Default NoProgressWait.
	NoProgressWait time.Duration
}

const instructions = `You are one run in a group of agents coordinated by jetcrew. ` +
	`Call status to learn your run id, your group and your peers; send to message a peer by run id, ` +
	`"all" for every other run of your group, or "operator" for the people watching; ` +
	`inbox to read messages sent to you (wait_seconds long-polls). Messages are plain text up to 16 KiB. ` +
	`Before editing files another run of your group may edit, claim them (paths or globs relative to the workspace); ` +
	`a claim another run holds is refused with its holder, so you can ask it. Claims last until you release them or your run ends. ` +
	`When you need a decision you cannot make, ask a peer, "all" or "operator" and wait for the answer (it may be "no answer": then decide); ` +
	`an inbox message with a question_id is a peer's question: answer it with reply. ` +
	`The operator may message you while you work: when a tool result says messages wait unread, call inbox and follow them.`

// NewServer returns an MCP server offering the status, send and inbox tools,
// each relayed through c. Serve it with server.Run(ctx, transport).
func NewServer(c *relay.Client, opts Options) *mcp.Server {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ProgressEvery <= 0 {
		opts.ProgressEvery = ProgressEvery
	}
	if opts.NoProgressWait <= 0 {
		opts.NoProgressWait = NoProgressWait
	}
	s := mcp.NewServer(&mcp.Implementation{Name: Name, Title: "jetcrew coordination", Version: opts.Version},
		&mcp.ServerOptions{Instructions: instructions, Logger: opts.Logger})
	s.AddReceivingMiddleware(unreadNote(c))

	addMessageTools(s, c)
	addClaimTools(s, c, opts.Workspace)
	addQuestionTools(s, c, opts.ProgressEvery, opts.NoProgressWait)
	return s
}

// relayed returns the handler of a tool that checks its input (check
// returns it normalized) and relays it to the worker (call). An input that
// fails the check is a tool error and reaches no worker.
func relayed[In, Out any](check func(In) (In, error), call func(context.Context, In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		in, err := check(in)
		if err != nil {
			var zero Out
			return nil, zero, err
		}
		out, err := call(ctx, in)
		return nil, out, err
	}
}

// addMessageTools adds status, send and inbox to s, each calling c.
func addMessageTools(s *mcp.Server, c *relay.Client) {
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
	}, relayed(func(in relay.SendRequest) (relay.SendRequest, error) { return in, relay.ValidateSend(in) }, c.Send))

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
}

// addClaimTools adds claim, release and claims to s, each calling c; the
// patterns of claim and release are resolved against workspace.
func addClaimTools(s *mcp.Server, c *relay.Client, workspace string) {
	mcp.AddTool(s, &mcp.Tool{
		Name: ToolClaim,
		Description: "Claim paths or globs relative to the workspace (e.g. `src/api`, `docs/*.md`, `internal/**/store.go`) so that " +
			"other runs of your group know you are editing them. A path covers everything under it; `*`, `?` and `[…]` match within " +
			"one directory level, `**` any number of levels. All are claimed or none: when one overlaps another run's claim, the call " +
			"fails naming the holder, its pattern and since when. A claim lasts until you release it or your run ends; claiming a " +
			"pattern you hold again only updates its reason. At most 64 claims per run, 32 paths per call, 256 bytes per path and reason.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
	}, relayed(func(in relay.ClaimRequest) (relay.ClaimRequest, error) {
		in, err := relay.NormalizeClaim(in)
		if err == nil {
			in.Paths, err = resolveClaims(workspace, in.Paths, true)
		}
		return in, err
	}, c.Claim))

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolRelease,
		Description: "Release claims you hold, naming each pattern exactly as you claimed it. All are released or none: " +
			"a pattern you do not hold makes the call fail and says so.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: false, OpenWorldHint: new(false)},
	}, relayed(func(in relay.ReleaseRequest) (relay.ReleaseRequest, error) {
		in, err := relay.NormalizeRelease(in)
		if err == nil {
			in.Paths, err = resolveClaims(workspace, in.Paths, false)
		}
		return in, err
	}, c.Release))

	mcp.AddTool(s, &mcp.Tool{
		Name:        ToolClaims,
		Description: "List your group's current claims: pattern, holder run id, reason, when claimed and age in seconds.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, relay.ClaimsResponse, error) {
		resp, err := c.Claims(ctx)
		if err == nil && resp.Claims == nil {
			resp.Claims = []relay.Claim{}
		}
		return nil, resp, err
	})
}
