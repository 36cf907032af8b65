// Package relay is the protocol between a run's bridge (the MCP server inside
// the run container, cmd/jetcrew-bridge) and the worker that hosts the run
// (coordination.Host): HTTP/1.1 over a per-run unix socket with JSON bodies.
//
// The socket is the run's identity. The worker serves one socket per run and
// stamps every message sent through it with that run's id; nothing a request
// carries can name another sender, another group or another run's inbox.
//
// Endpoints (all bodies JSON, errors as ErrorResponse with a 4xx or 5xx code):
//
//	POST /v1/hello   no body       → 204; the bridge announces itself at start
//	GET  /v1/status                → 200 Status
//	POST /v1/send    SendRequest   → 200 SendResponse
//	POST /v1/inbox   InboxRequest  → 200 InboxResponse
//	POST /v1/claim   ClaimRequest  → 200 ClaimResponse (409 conflict)
//	POST /v1/release ReleaseRequest → 200 ReleaseResponse (409 not_held)
//	GET  /v1/claims                → 200 ClaimsResponse
//	POST /v1/ask     AskRequest    → 200 AskResponse, once answered or timed out
//	POST /v1/reply   ReplyRequest  → 200 ReplyResponse (404 no_question, 409 answered)
//
// While the worker is being replaced (it stopped or died, and its successor
// on the host serves the run's socket again at the same path), the Client
// waits for the socket and sends again what is safe to send again, within a
// bounded window (reconnect.go, ReconnectWindow).
//
// The package imports only the standard library, the messages package and
// the backoff package, so the bridge binary stays small and carries no NATS
// code.
package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// Where the bridge finds its socket.
const (
	// EnvSocket names the environment variable that overrides the socket
	// path the bridge dials (for tests and for unusual layouts).
	EnvSocket = "JETCREW_BRIDGE_SOCKET"
	// DefaultSocketPath is the socket path inside a run container: the
	// worker bind-mounts the run's directory at /run/jetcrew.
	DefaultSocketPath = messages.ContainerSocketPath
)

// Endpoint paths.
const (
	// PathHello (POST, no body, 204) is the bridge announcing itself.
	PathHello = "/v1/hello"
	// PathStatus (GET, Status) is the status tool.
	PathStatus = "/v1/status"
	// PathSend (POST SendRequest, SendResponse) is the send tool.
	PathSend = "/v1/send"
	// PathInbox (POST InboxRequest, InboxResponse) is the inbox tool.
	PathInbox = "/v1/inbox"
	// PathClaim (POST ClaimRequest, ClaimResponse) is the claim tool.
	PathClaim = "/v1/claim"
	// PathRelease (POST ReleaseRequest, ReleaseResponse) is the release
	// tool.
	PathRelease = "/v1/release"
	// PathClaims (GET, ClaimsResponse) is the claims tool.
	PathClaims = "/v1/claims"
)

// Reserved recipients of a send. Every other recipient is a run id.
const (
	// RecipientAll addresses every other run of the sender's group.
	RecipientAll = messages.RecipientAll
	// RecipientOperator addresses the people watching the group (they read
	// with `nats sub 'jetcrew.coord.<pool>.<group>.>'`).
	RecipientOperator = messages.RecipientOperator
)

// Limits on requests.
const (
	// MaxBodyBytes is the largest message body a run may send, in bytes
	// (16 KiB).
	MaxBodyBytes = 16 << 10
	// MaxIdempotencyKeyBytes is the longest idempotency key, in bytes.
	MaxIdempotencyKeyBytes = 256
	// MaxWaitSeconds is the longest an inbox call may wait for a message,
	// in seconds.
	MaxWaitSeconds = 30
	// DefaultInboxMax is the most messages one inbox call returns when the
	// request says 0.
	DefaultInboxMax = 10
	// MaxInboxMax is the largest max an inbox call may ask for.
	MaxInboxMax = 50
	// MaxRequestBytes bounds the encoded size of any request body, in bytes:
	// room for a MaxBodyBytes body even with every byte JSON-escaped.
	MaxRequestBytes = 8*MaxBodyBytes + 4<<10
	// MaxClaimPaths is the most paths one claim or release call names.
	MaxClaimPaths = 32
	// MaxPatternBytes is the longest claimed path or glob, in bytes.
	MaxPatternBytes = 256
	// MaxPatternSegments is the most '/'-separated segments of a pattern.
	MaxPatternSegments = 32
	// MaxPatternDoubleStars is the most "**" segments of a pattern.
	MaxPatternDoubleStars = 4
	// MaxReasonBytes is the longest reason a claim gives, in bytes.
	MaxReasonBytes = 256
)

// Status answers GET /v1/status: who this run is, who its peers are, and how
// many messages wait in its inbox.
type Status struct {
	// RunID is this run's id.
	RunID string `json:"run_id" jsonschema:"this run's id; peers address you by it"`
	// Group is this run's coordination group.
	Group string `json:"group" jsonschema:"this run's coordination group"`
	// Profile is the profile this run uses.
	Profile string `json:"profile" jsonschema:"the profile this run uses"`
	// Peers are the other runs of the group that are queued or running,
	// ordered by run id. Never nil.
	Peers []Peer `json:"peers" jsonschema:"the other runs of the group that are queued or running"`
	// Unread is the number of messages waiting in this run's inbox, as the
	// server counts them: a message stored a moment ago may not be counted
	// yet (inbox returns it all the same).
	Unread int `json:"unread" jsonschema:"messages waiting in your inbox (a message sent a moment ago may not be counted yet)"`
}

// Peer is another run of the same group.
type Peer struct {
	// RunID is the peer's run id, the value to send to.
	RunID string `json:"run_id" jsonschema:"the peer's run id: use it as to in send"`
	// Profile is the profile the peer runs with.
	Profile string `json:"profile,omitempty" jsonschema:"the profile the peer runs with"`
	// State is "queued" or "running".
	State string `json:"state" jsonschema:"queued or running"`
	// StartedAt is when the peer's container started; zero while queued.
	StartedAt time.Time `json:"started_at,omitzero" jsonschema:"when the peer started running (RFC 3339)"`
}

// SendRequest is the body of POST /v1/send. It has no sender field: the
// worker stamps the sender from the socket.
type SendRequest struct {
	// To is a peer's run id, RecipientAll or RecipientOperator.
	To string `json:"to" jsonschema:"a peer's run id (see status), all for every other run of your group, or operator for the people watching"`
	// Body is the message text, at most MaxBodyBytes bytes.
	Body string `json:"body" jsonschema:"the message text, at most 16384 bytes"`
	// IdempotencyKey, when set, makes the send idempotent: a repeat with
	// the same key sends nothing new and returns the first message's id.
	IdempotencyKey string `json:"idempotency_key,omitempty" jsonschema:"optional; a repeat with the same key (within 10 minutes) sends nothing new and returns the same message id"`
}

// SendResponse answers POST /v1/send.
type SendResponse struct {
	// MessageID identifies the message: its sequence number in the
	// coordination stream, in decimal.
	MessageID string `json:"message_id" jsonschema:"the message's id"`
	// Duplicate is true when the idempotency key matched an earlier send
	// and nothing new was sent.
	Duplicate bool `json:"duplicate,omitempty" jsonschema:"true when an earlier send with the same idempotency key already sent this message"`
}

// InboxRequest is the body of POST /v1/inbox.
type InboxRequest struct {
	// WaitSeconds is how long to wait for a message when none is unread,
	// 0 to MaxWaitSeconds. With 0 an empty inbox answers after a short
	// grace (the worker's, about 150 ms) that lets a message stored a
	// moment earlier through.
	WaitSeconds int `json:"wait_seconds,omitempty" jsonschema:"seconds to wait for a message when none is unread, 0 to 30; 0 does not wait"`
	// Max is the most messages to return, 1 to MaxInboxMax; 0 means
	// DefaultInboxMax.
	Max int `json:"max,omitempty" jsonschema:"the most messages to return, 1 to 50 (default 10)"`
}

// InboxResponse answers POST /v1/inbox. The messages returned are marked
// read: they are not returned again.
type InboxResponse struct {
	// Messages are the unread messages, oldest first. Never nil.
	Messages []Message `json:"messages" jsonschema:"unread messages, oldest first; they are now marked read"`
}

// Message is one message in a run's inbox.
type Message struct {
	// ID is the message's sequence number in the coordination stream.
	ID string `json:"id" jsonschema:"the message's id"`
	// From is the sender's run id, or "operator" for a person.
	From string `json:"from" jsonschema:"the sender's run id, or operator"`
	// To is this run's id, or "all" for a message to the whole group.
	To string `json:"to" jsonschema:"your run id, or all for a message to the whole group"`
	// Body is the message text.
	Body string `json:"body" jsonschema:"the message text"`
	// Time is when the message was stored.
	Time time.Time `json:"time" jsonschema:"when the message was sent (RFC 3339)"`
	// QuestionID is set when the message is a peer's question (its ask):
	// answer it with reply.
	QuestionID string `json:"question_id,omitempty" jsonschema:"set when the message is a question: answer it with reply and this id"`
	// Choices are the answers the asker offers, if any.
	Choices []string `json:"choices,omitempty" jsonschema:"the answers the asker offers, if any"`
	// AnswerTo is set when the message answers one of this run's
	// questions whose ask returned "no answer" before the answer came
	// (messages.HeaderAnswerTo): From answered question AnswerTo with Body.
	AnswerTo string `json:"answer_to,omitempty" jsonschema:"set when the message is the answer to your question of this id, which came after your ask returned"`
}

// ClaimRequest is the body of POST /v1/claim. It has no holder field: the
// worker stamps the holder from the socket.
type ClaimRequest struct {
	// Paths are paths or globs relative to the workspace (see
	// ValidatePattern), 1 to MaxClaimPaths of them. They are claimed all
	// together or not at all.
	Paths []string `json:"paths" jsonschema:"paths or globs relative to the workspace (path.Match syntax per segment, ** for any number of directories); a path covers everything under it; 1 to 32"`
	// Reason says why, at most MaxReasonBytes bytes.
	Reason string `json:"reason" jsonschema:"why you claim them, shown to the group (at most 256 bytes)"`
}

// ClaimResponse answers POST /v1/claim.
type ClaimResponse struct {
	// Claims are every claim this run now holds, ordered by pattern.
	Claims []Claim `json:"claims" jsonschema:"every claim you now hold"`
}

// ReleaseRequest is the body of POST /v1/release.
type ReleaseRequest struct {
	// Paths are patterns this run holds, exactly as claimed (after
	// cleaning), 1 to MaxClaimPaths of them. All are released or none.
	Paths []string `json:"paths" jsonschema:"patterns you hold, exactly as you claimed them; all are released or none"`
}

// ReleaseResponse answers POST /v1/release.
type ReleaseResponse struct {
	// Released are the patterns released.
	Released []string `json:"released" jsonschema:"the patterns released"`
	// Claims are the claims this run still holds.
	Claims []Claim `json:"claims" jsonschema:"the claims you still hold"`
}

// ClaimsResponse answers GET /v1/claims.
type ClaimsResponse struct {
	// Claims are the group's current claims, ordered by holder, then
	// pattern. Never nil.
	Claims []Claim `json:"claims" jsonschema:"the group's current claims"`
}

// Claim is one run's claim on a path or glob.
type Claim struct {
	// Pattern is the claimed path or glob.
	Pattern string `json:"pattern" jsonschema:"the claimed path or glob"`
	// RunID is the run holding it.
	RunID string `json:"run_id" jsonschema:"the run holding it"`
	// Reason is the holder's reason.
	Reason string `json:"reason,omitempty" jsonschema:"the holder's reason"`
	// Since is when the holder claimed it.
	Since time.Time `json:"since" jsonschema:"when it was claimed (RFC 3339)"`
	// AgeSeconds is how long ago that was, in whole seconds.
	AgeSeconds int64 `json:"age_seconds" jsonschema:"seconds since it was claimed"`
}

// Error codes carried in ErrorResponse.Code.
const (
	// CodeInvalid: the request breaks a rule (bad recipient, bad range).
	CodeInvalid = "invalid"
	// CodeUnknownPeer: the recipient is not a queued or running run of the
	// sender's group.
	CodeUnknownPeer = "unknown_peer"
	// CodeTooLarge: the body or the request is larger than allowed.
	CodeTooLarge = "too_large"
	// CodeRateLimited: the run sent too many messages too fast.
	CodeRateLimited = "rate_limited"
	// CodeUnavailable: the worker cannot reach NATS, or the socket holds
	// too many connections.
	CodeUnavailable = "unavailable"
	// CodeSessionEnded: the run's coordination session on this worker has
	// ended while the call was in flight (the worker is stopping, or
	// handing the run to another): a successor may serve the socket again.
	CodeSessionEnded = "session_ended"
	// CodeConflict: a claimed path overlaps another run's claim (the
	// message names the holder and since when).
	CodeConflict = "conflict"
	// CodeNotHeld: a release names a pattern this run does not hold.
	CodeNotHeld = "not_held"
	// CodeLimit: a claim would take the run or the group past its most
	// claims.
	CodeLimit = "limit"
)

// ErrorResponse is the body of every error reply.
type ErrorResponse struct {
	// Code is one of the Code* constants.
	Code string `json:"code"`
	// Error is a sentence the agent can act on.
	Error string `json:"error"`
}

// ErrUnavailable is matched (errors.Is) by every error that means coordination
// cannot be reached: the socket is missing or refuses connections (past the
// client's reconnect window), or the worker answered 503 because it cannot
// reach NATS or the run's session ended. Its text, "coordination
// unavailable", starts every such error's message.
var ErrUnavailable = errors.New("coordination unavailable")

// Error is an error reply from the worker.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the reply's error code (one of the Code* constants).
	Code string
	// Message is the reply's error text.
	Message string
}

// Error returns the worker's message verbatim.
func (e *Error) Error() string { return e.Message }

// Is reports whether target is ErrUnavailable and e is a 503 reply
// (CodeUnavailable or CodeSessionEnded).
func (e *Error) Is(target error) bool {
	return target == ErrUnavailable && (e.Code == CodeUnavailable || e.Code == CodeSessionEnded)
}

// InvalidError is returned, wrapped in *Error by the worker, for a request
// that breaks a rule; Code says which kind.
type InvalidError struct {
	// Code is CodeInvalid, CodeTooLarge or CodeUnknownPeer.
	Code string
	// Message says what is wrong and how to fix it.
	Message string
}

// Error returns the message.
func (e *InvalidError) Error() string { return e.Message }

func invalid(code, format string, args ...any) error {
	return &InvalidError{Code: code, Message: fmt.Sprintf(format, args...)}
}
