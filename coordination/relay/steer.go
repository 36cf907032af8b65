package relay

import (
	"context"
	"net/http"
	"strconv"
)

// Steering endpoints. The launcher (`jetcrew-bridge launch --steer FORMAT`)
// long-polls PathSteerNext for the operator's steers, writes each to the
// agent CLI's standard input as a user turn, and acknowledges it on
// PathSteerAck; the bridge long-polls PathNotice to tell its MCP client
// that steers wait in the inbox.
//
//	POST /v1/steer/next  SteerNextRequest → 200 SteerNextResponse
//	POST /v1/steer/ack   SteerAck         → 204
//	POST /v1/notice      NoticeRequest    → 200 Notice
const (
	// PathSteerNext (POST SteerNextRequest, SteerNextResponse) hands the
	// launcher the steers waiting for the agent's input.
	PathSteerNext = "/v1/steer/next"
	// PathSteerAck (POST SteerAck, 204) reports whether a steer reached the
	// agent's input.
	PathSteerAck = "/v1/steer/ack"
	// PathNotice (POST NoticeRequest, Notice) waits for a steer to be put
	// in the run's inbox.
	PathNotice = "/v1/notice"
)

// HeaderUnreadSteers is set on every reply of the worker to the run's
// socket while steers the run has not read wait in its inbox: their count,
// in decimal. The bridge adds a note to the result of every tool call made
// meanwhile (Client.UnreadSteers).
const HeaderUnreadSteers = "Jetcrew-Unread-Steers"

// MaxSteersPerNext is the most steers one PathSteerNext reply carries.
const MaxSteersPerNext = 8

// SteerNextRequest is the body of POST /v1/steer/next.
type SteerNextRequest struct {
	// WaitSeconds is how long to wait for a steer when none waits, 0 to
	// MaxWaitSeconds.
	WaitSeconds int `json:"wait_seconds,omitempty"`
	// Closed says the agent's input is closed for good (its last turn
	// ended): later steers go to the inbox only, and the reply is empty at
	// once.
	Closed bool `json:"closed,omitempty"`
}

// Steer is one operator steer for the agent's input.
type Steer struct {
	// ID is the steer's id (messages.HeaderSteerID).
	ID string `json:"id"`
	// Text is the steer's text, at most messages.MaxSteerBytes bytes.
	Text string `json:"text"`
}

// SteerNextResponse answers POST /v1/steer/next.
type SteerNextResponse struct {
	// Steers are the steers to write, oldest first; empty when the wait
	// passed. Never nil.
	Steers []Steer `json:"steers"`
}

// SteerAck is the body of POST /v1/steer/ack.
type SteerAck struct {
	// ID is the steer's id.
	ID string `json:"id"`
	// Delivered is true when the steer was written whole to the agent's
	// standard input.
	Delivered bool `json:"delivered"`
	// Reason says why not, when not delivered.
	Reason string `json:"reason,omitempty"`
}

// NoticeRequest is the body of POST /v1/notice.
type NoticeRequest struct {
	// After is the Notice.Seq the caller has seen; the call returns as
	// soon as the session's Seq is larger, or after WaitSeconds.
	After uint64 `json:"after"`
	// Session is the Notice.Session After counts in. When another session
	// serves the socket now (the run was adopted by another worker, whose
	// count starts again at 0), After is taken as 0. Empty: the session
	// serving the socket.
	Session string `json:"session,omitempty"`
	// WaitSeconds is how long to wait, 0 to MaxWaitSeconds.
	WaitSeconds int `json:"wait_seconds,omitempty"`
}

// Notice answers POST /v1/notice.
type Notice struct {
	// Seq counts the steers put in the run's inbox in this session.
	Seq uint64 `json:"seq"`
	// Session names the worker's session that counts Seq: an opaque id,
	// another one for every session that serves the run's socket.
	Session string `json:"session,omitempty"`
	// Unread is how many of them the run has not read (an inbox call
	// counts them read).
	Unread int `json:"unread"`
}

// NormalizeWait checks a wait in seconds: 0 to MaxWaitSeconds. The error
// is an *InvalidError.
func NormalizeWait(s int) error {
	if s < 0 || s > MaxWaitSeconds {
		return invalid(CodeInvalid, "wait_seconds %d is out of range: 0 to %d", s, MaxWaitSeconds)
	}
	return nil
}

// DecodeSteerNextRequest decodes one steer-next request (an empty body is
// the zero request). The error is an *InvalidError.
func DecodeSteerNextRequest(data []byte) (SteerNextRequest, error) {
	return decodeOptional(data, func(r SteerNextRequest) (SteerNextRequest, error) { return r, NormalizeWait(r.WaitSeconds) })
}

// DecodeSteerAck decodes one steer acknowledgement. The error is an
// *InvalidError.
func DecodeSteerAck(data []byte) (SteerAck, error) {
	return decodeRequest(data, func(r SteerAck) (SteerAck, error) {
		if r.ID == "" {
			return r, invalid(CodeInvalid, "id is empty")
		}
		return r, nil
	})
}

// DecodeNoticeRequest decodes one notice request. The error is an
// *InvalidError.
func DecodeNoticeRequest(data []byte) (NoticeRequest, error) {
	return decodeOptional(data, func(r NoticeRequest) (NoticeRequest, error) { return r, NormalizeWait(r.WaitSeconds) })
}

// SteerNext returns the steers waiting for the agent's input, waiting up
// to r.WaitSeconds for one.
func (c *Client) SteerNext(ctx context.Context, r SteerNextRequest) (SteerNextResponse, error) {
	return callFor[SteerNextResponse](ctx, c, request{method: http.MethodPost, path: PathSteerNext, body: r,
		wait: seconds(r.WaitSeconds, MaxWaitSeconds), idempotent: true})
}

// SteerAck reports whether a steer reached the agent's input.
func (c *Client) SteerAck(ctx context.Context, a SteerAck) error {
	return c.call(ctx, request{method: http.MethodPost, path: PathSteerAck, body: a, idempotent: true}, nil)
}

// Notice waits up to r.WaitSeconds for a steer past r.After (counted in
// session r.Session) to be put in the run's inbox.
func (c *Client) Notice(ctx context.Context, r NoticeRequest) (Notice, error) {
	return callFor[Notice](ctx, c, request{method: http.MethodPost, path: PathNotice, body: r,
		wait: seconds(r.WaitSeconds, MaxWaitSeconds), idempotent: true})
}

// UnreadSteers returns the steers waiting unread in the run's inbox, as
// the worker's last reply said (HeaderUnreadSteers); 0 before any reply.
func (c *Client) UnreadSteers() int { return int(c.unreadSteers.Load()) }

// noteUnread records a reply's HeaderUnreadSteers.
func (c *Client) noteUnread(h http.Header) {
	n, _ := strconv.Atoi(h.Get(HeaderUnreadSteers))
	c.unreadSteers.Store(int64(max(0, n)))
}
