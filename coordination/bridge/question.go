package bridge

import (
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// Tool names of questions that wait.
const (
	// ToolAsk asks a peer, the group or the operator and waits for the
	// answer.
	ToolAsk = "ask"
	// ToolReply answers a peer's question.
	ToolReply = "reply"
)

// ProgressEvery is how often an ask that waits sends the client a progress
// notification, when the call carries a progress token: a client that
// resets its request timeout on progress (the MCP TypeScript SDK's
// resetTimeoutOnProgress) keeps waiting as long as the question does.
const ProgressEvery = 15 * time.Second

// addQuestionTools adds ask and reply to s, relayed through c; a waiting
// ask sends progress every every.
func addQuestionTools(s *mcp.Server, c *relay.Client, every time.Duration) {
	mcp.AddTool(s, &mcp.Tool{
		Name: ToolAsk,
		Description: "Ask a question and wait for the answer: to a peer (its run id from status), to `all` (any other run of your " +
			"group may answer) or to `operator` (the people watching). Offer choices when the answer is one of a few. The call returns " +
			"when an answer arrives or after timeout_seconds (default 300, cut to your run's remaining time) with status \"no answer\": " +
			"then decide for yourself. Peers see the question in their inbox with its question_id. At most 4 questions of yours wait at once.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), OpenWorldHint: new(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in relay.AskRequest) (*mcp.CallToolResult, relay.AskResponse, error) {
		in, err := relay.NormalizeAsk(in)
		if err != nil {
			return nil, relay.AskResponse{}, err
		}
		defer keepAlive(ctx, req, in.TimeoutSeconds, every)()
		resp, err := c.Ask(ctx, in)
		return nil, resp, err
	})

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolReply,
		Description: "Answer a peer's question: question_id from the inbox message that carried it, answer at most 4096 bytes. " +
			"The first answer is the one the asker gets; replying again with the same answer is harmless.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in relay.ReplyRequest) (*mcp.CallToolResult, relay.ReplyResponse, error) {
		in, err := relay.NormalizeReply(in)
		if err != nil {
			return nil, relay.ReplyResponse{}, err
		}
		resp, err := c.Reply(ctx, in)
		return nil, resp, err
	})
}

// keepAlive sends req's client a progress notification every every while
// an ask of timeoutSeconds waits, when the call carries a progress token.
// The returned stop ends it and waits for its goroutine, which also ends
// with ctx.
func keepAlive(ctx context.Context, req *mcp.CallToolRequest, timeoutSeconds int, every time.Duration) (stop func()) {
	if req == nil || req.Params == nil || req.Session == nil {
		return func() {}
	}
	token := req.Params.GetProgressToken()
	if token == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				waited := time.Since(start).Truncate(time.Second)
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token, Progress: waited.Seconds(), Total: float64(timeoutSeconds),
					Message: fmt.Sprintf("waiting for an answer (%s of at most %ds)", waited, timeoutSeconds),
				})
			}
		}
	}()
	return func() { cancel(); <-done }
}
