package relay

import (
	"context"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jetcrew/jetcrew/messages"
)

// Endpoints of questions that wait.
const (
	// PathAsk (POST AskRequest, AskResponse) is the ask tool. It answers
	// when the question is answered or its timeout passes.
	PathAsk = "/v1/ask"
	// PathReply (POST ReplyRequest, ReplyResponse) is the reply tool.
	PathReply = "/v1/reply"
)

// Limits of questions.
const (
	// MaxQuestionBytes is the longest question, in bytes.
	MaxQuestionBytes = 4 << 10
	// MaxAnswerBytes is the longest answer or reply, in bytes.
	MaxAnswerBytes = 4 << 10
	// MaxChoices is the most choices a question offers.
	MaxChoices = 10
	// MaxChoiceBytes is the longest choice, in bytes.
	MaxChoiceBytes = 256
	// DefaultAskSeconds is how long an ask waits when timeout_seconds is 0.
	DefaultAskSeconds = 300
	// MaxAskSeconds is the longest timeout_seconds, in seconds: the longest
	// run (messages.MaxTimeout). The worker also cuts the wait to the run's
	// remaining time.
	MaxAskSeconds = int(messages.MaxTimeout / time.Second)
)

// Codes of question errors (ErrorResponse.Code).
const (
	// CodeNoQuestion: reply names a question that is not open (answered,
	// timed out, its run ended, or never asked), or not one of the run's
	// group.
	CodeNoQuestion = "no_question"
	// CodeAnswered: reply names a question another run answered first.
	CodeAnswered = "answered"
)

// Outcomes of an ask (AskResponse.Status).
const (
	// AskAnswered: the question was answered.
	AskAnswered = "answered"
	// AskNoAnswer: nobody answered before the timeout (or the run's end).
	AskNoAnswer = "no answer"
)

// AskRequest is the body of POST /v1/ask. It has no asker field: the worker
// stamps the asker from the socket.
type AskRequest struct {
	// To is a peer's run id, RecipientAll or RecipientOperator.
	To string `json:"to" jsonschema:"a peer's run id (see status), all for any other run of your group, or operator for the people watching"`
	// Question is the question's text, 1 to MaxQuestionBytes bytes.
	Question string `json:"question" jsonschema:"the question, at most 4096 bytes"`
	// Choices are optional answers to offer, at most MaxChoices of at most
	// MaxChoiceBytes bytes each.
	Choices []string `json:"choices,omitempty" jsonschema:"optional answers to choose from (at most 10 of at most 256 bytes); the answer may still be other text"`
	// TimeoutSeconds is how long to wait for an answer, 0 (meaning
	// DefaultAskSeconds) to MaxAskSeconds; the worker cuts it to the
	// run's remaining time.
	TimeoutSeconds int `json:"timeout_seconds,omitempty" jsonschema:"seconds to wait for an answer (default 300); cut to your run's remaining time"`
	// ReturnAfterSeconds, when set below the wait, is how long the call
	// itself waits, 0 to MaxAskSeconds: past it the call returns
	// AskNoAnswer while the question stays open for its whole timeout,
	// and an answer that comes goes to the run's inbox (Message.AnswerTo).
	// The bridge sets it for an MCP client that sent no progress token;
	// the ask tool does not offer it.
	ReturnAfterSeconds int `json:"return_after_seconds,omitempty"`
}

// AskResponse answers POST /v1/ask: the answer, or "no answer". A question
// nobody answered in time is a result, not an error.
type AskResponse struct {
	// QuestionID names the question.
	QuestionID string `json:"question_id" jsonschema:"the question's id"`
	// Status is AskAnswered or AskNoAnswer.
	Status string `json:"status" jsonschema:"answered, or no answer"`
	// Answer is the answer's text (AskAnswered).
	Answer string `json:"answer,omitempty" jsonschema:"the answer"`
	// From is who answered: a run id or "operator" (AskAnswered).
	From string `json:"from,omitempty" jsonschema:"who answered: a run id, or operator"`
	// WaitedSeconds is how long the call waited, in whole seconds.
	WaitedSeconds int64 `json:"waited_seconds" jsonschema:"seconds waited"`
	// Note says why there is no answer (AskNoAnswer), or that the timeout
	// was cut to the run's remaining time.
	Note string `json:"note,omitempty" jsonschema:"why there is no answer, or how the timeout was cut"`
}

// ReplyRequest is the body of POST /v1/reply.
type ReplyRequest struct {
	// QuestionID is the question's id, as the inbox message carrying the
	// question gave it.
	QuestionID string `json:"question_id" jsonschema:"the question's id (question_id of the inbox message)"`
	// Answer is the answer's text, 1 to MaxAnswerBytes bytes.
	Answer string `json:"answer" jsonschema:"your answer, at most 4096 bytes"`
}

// ReplyResponse answers POST /v1/reply.
type ReplyResponse struct {
	// QuestionID is the question answered.
	QuestionID string `json:"question_id" jsonschema:"the question answered"`
	// To is the asking run.
	To string `json:"to" jsonschema:"the run that asked"`
	// Duplicate is true when this run had given this very answer already:
	// nothing new was sent.
	Duplicate bool `json:"duplicate,omitempty" jsonschema:"true when you had given this answer already"`
}

// validText checks an agent's text field: 1 to maxBytes bytes of UTF-8.
func validText(what, s string, maxBytes int) error {
	if s == "" {
		return invalid(CodeInvalid, "%s is empty", what)
	}
	if len(s) > maxBytes {
		return invalid(CodeTooLarge, "%s is %d bytes, longest allowed is %d bytes", what, len(s), maxBytes)
	}
	if !utf8.ValidString(s) {
		return invalid(CodeInvalid, "%s is not valid UTF-8", what)
	}
	return nil
}

// NormalizeAsk checks an ask request (a valid recipient, a question of 1 to
// MaxQuestionBytes bytes, at most MaxChoices distinct choices of 1 to
// MaxChoiceBytes bytes, TimeoutSeconds 0 to MaxAskSeconds) and returns it
// with TimeoutSeconds defaulted and repeated choices dropped. The error is
// an *InvalidError.
func NormalizeAsk(r AskRequest) (AskRequest, error) {
	if err := ValidateRecipient(r.To); err != nil {
		return r, err
	}
	if err := validText("question", r.Question, MaxQuestionBytes); err != nil {
		return r, err
	}
	if len(r.Choices) > MaxChoices {
		return r, invalid(CodeInvalid, "choices names %d answers, at most %d allowed", len(r.Choices), MaxChoices)
	}
	var choices []string
	for _, c := range r.Choices {
		if err := validText("a choice", c, MaxChoiceBytes); err != nil {
			return r, err
		}
		if !slices.Contains(choices, c) {
			choices = append(choices, c)
		}
	}
	r.Choices = choices
	if r.TimeoutSeconds < 0 || r.TimeoutSeconds > MaxAskSeconds {
		return r, invalid(CodeInvalid, "timeout_seconds %d is out of range: 0 to %d (0 means %d)", r.TimeoutSeconds, MaxAskSeconds, DefaultAskSeconds)
	}
	if r.TimeoutSeconds == 0 {
		r.TimeoutSeconds = DefaultAskSeconds
	}
	if r.ReturnAfterSeconds < 0 || r.ReturnAfterSeconds > MaxAskSeconds {
		return r, invalid(CodeInvalid, "return_after_seconds %d is out of range: 0 to %d", r.ReturnAfterSeconds, MaxAskSeconds)
	}
	return r, nil
}

// NormalizeReply checks a reply request: a question id of the form
// messages.ValidCoordQuestionID, an answer of 1 to MaxAnswerBytes bytes.
// The error is an *InvalidError.
func NormalizeReply(r ReplyRequest) (ReplyRequest, error) {
	if !messages.ValidCoordQuestionID(r.QuestionID) {
		return r, invalid(CodeInvalid, "question_id %q is not a question id (\"q\" and 16 letters or digits, from the inbox message)", r.QuestionID)
	}
	if err := validText("answer", r.Answer, MaxAnswerBytes); err != nil {
		return r, err
	}
	return r, nil
}

// DecodeAskRequest decodes and normalizes one ask request: a single JSON
// object with no unknown field (an asker field is refused). The error is an
// *InvalidError.
func DecodeAskRequest(data []byte) (AskRequest, error) {
	return decodeRequest(data, NormalizeAsk)
}

// DecodeReplyRequest decodes and normalizes one reply request. The error is
// an *InvalidError.
func DecodeReplyRequest(data []byte) (ReplyRequest, error) {
	return decodeRequest(data, NormalizeReply)
}

// Ask asks r.Question as the socket's run and waits for the answer, up to
// r.TimeoutSeconds, or r.ReturnAfterSeconds when it is set and shorter
// (and callTimeout more for the worker to answer). An ask cut off in
// flight is not asked again: it fails with ErrInterrupted.
func (c *Client) Ask(ctx context.Context, r AskRequest) (AskResponse, error) {
	secs := r.TimeoutSeconds
	if r.ReturnAfterSeconds > 0 {
		secs = min(secs, r.ReturnAfterSeconds)
	}
	return callFor[AskResponse](ctx, c, request{method: http.MethodPost, path: PathAsk, body: r, wait: seconds(secs, MaxAskSeconds)})
}

// Reply answers a peer's question as the socket's run. A reply cut off in
// flight is not sent again: it fails with ErrInterrupted.
func (c *Client) Reply(ctx context.Context, r ReplyRequest) (ReplyResponse, error) {
	return callFor[ReplyResponse](ctx, c, request{method: http.MethodPost, path: PathReply, body: r})
}
