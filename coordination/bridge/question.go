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

// NoProgressWait is the default of Options.NoProgressWait: how long an ask
// from an MCP client that sent no progress token waits before it returns
// "no answer", the question staying open. Such a client cannot be kept
// waiting by progress notifications and gives up on its own request
// timeout: 60 s in common clients (the MCP TypeScript SDK's default request
// timeout; anomalyco/opencode#28186).
const NoProgressWait = 50 * time.Second

// askArgs are the ask tool's arguments: relay.AskRequest as an agent gives
// it. ReturnAfterSeconds is the bridge's to set, not the agent's.
type askArgs struct {
	To             string   `json:"to" jsonschema:"a peer's run id (see status), all for any other run of your group, or operator for the people watching"`
	Question       string   `json:"question" jsonschema:"the question, at most 4096 bytes"`
	Choices        []string `json:"choices,omitempty" jsonschema:"optional answers to choose from (at most 10 of at most 256 bytes); the answer may still be other text"`
	TimeoutSeconds int      `json:"timeout_seconds,omitempty" jsonschema:"seconds to wait for an answer (default 300); cut to your run's remaining time"`
}

// askRequest is the relay request of an ask with in's arguments, made by
// req: when req carries no progress token, the call returns after
// noProgress (in whole seconds, at least 1) if the question waits longer.
func askRequest(in askArgs, req *mcp.CallToolRequest, noProgress time.Duration) (relay.AskRequest, error) {
	r, err := relay.NormalizeAsk(relay.AskRequest{To: in.To, Question: in.Question, Choices: in.Choices, TimeoutSeconds: in.TimeoutSeconds})
	if err != nil {
		return r, err
	}
	if progressToken(req) == nil {
		if secs := max(1, int(noProgress/time.Second)); secs < r.TimeoutSeconds {
			r.ReturnAfterSeconds = secs
		}
	}
	return r, nil
}

// noProgressNote tells the agent what an ask of a client without progress
// tokens does.
func noProgressNote(noProgress time.Duration) string {
	return fmt.Sprintf("When your MCP client sends no progress token, the call returns \"no answer\" after at most %d seconds "+
		"and the question stays open until its timeout: an answer that comes is put in your inbox, its answer_to naming the question. ",
		max(1, int(noProgress/time.Second)))
}

// progressToken returns the progress token req carries, nil without one.
func progressToken(req *mcp.CallToolRequest) any {
	if req == nil || req.Params == nil {
		return nil
	}
	return req.Params.GetProgressToken()
}

// addQuestionTools adds ask and reply to s, relayed through c; a waiting
// ask sends progress every every, and one whose client sent no progress
// token returns after noProgress.
func addQuestionTools(s *mcp.Server, c *relay.Client, every, noProgress time.Duration) {
	mcp.AddTool(s, &mcp.Tool{
		Name: ToolAsk,
		Description: "Ask a question and wait for the answer: to a peer (its run id from status), to `all` (any other run of your " +
			"group may answer) or to `operator` (the people watching). Offer choices when the answer is one of a few. The call returns " +
			"when an answer arrives or after timeout_seconds (default 300, cut to your run's remaining time) with status \"no answer\": " +
			"then decide for yourself. " + noProgressNote(noProgress) +
			"Peers see the question in their inbox with its question_id. At most 4 questions of yours wait at once.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), OpenWorldHint: new(false)},
	}, func(ctx context.Context, req *mcp.CallToolRequest, in askArgs) (*mcp.CallToolResult, relay.AskResponse, error) {
		r, err := askRequest(in, req, noProgress)
		if err != nil {
			return nil, relay.AskResponse{}, err
		}
		defer keepAlive(ctx, req, r.TimeoutSeconds, every)()
		resp, err := c.Ask(ctx, r)
		return nil, resp, err
	})

	mcp.AddTool(s, &mcp.Tool{
		Name: ToolReply,
		Description: "Answer a peer's question: question_id from the inbox message that carried it, answer at most 4096 bytes. " +
			"The first answer is the one the asker gets; replying again with the same answer is harmless.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), IdempotentHint: true, OpenWorldHint: new(false)},
	}, relayed(relay.NormalizeReply, c.Reply))
}

// keepAlive sends req's client a progress notification every every while
// an ask of timeoutSeconds waits, when the call carries a progress token.
// The returned stop ends it and waits for its goroutine, which also ends
// with ctx.
func keepAlive(ctx context.Context, req *mcp.CallToolRequest, timeoutSeconds int, every time.Duration) (stop func()) {
	token := progressToken(req)
	if token == nil || req.Session == nil {
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
