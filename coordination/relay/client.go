package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// maxResponseBytes bounds a reply body the client reads, in bytes: MaxInboxMax
// messages of up to 64 KiB each, JSON-escaped, fit.
const maxResponseBytes = 16 << 20

// MaxClientConns is the most connections a Client opens to its socket at
// once; the worker serves up to 16 per run (coordination.MaxConnsPerSession).
const MaxClientConns = 8

// callTimeout bounds one status, send or hello call; an inbox call gets its
// wait on top.
const callTimeout = 15 * time.Second

// Client calls the worker over a run's unix socket. It is what the bridge
// and the steered launcher use; it is safe for concurrent use. While the
// worker is being replaced, a call waits for the socket to come back, and
// an idempotent call cut off in flight is sent again (reconnect.go). Every
// method returns an error matching ErrUnavailable (errors.Is) when the
// socket cannot be reached within the reconnect window or the worker cannot
// reach NATS, one matching ErrInterrupted when a call that is not safe to
// repeat was cut off in flight, and an *Error for any other error reply.
type Client struct {
	path   string
	hc     *http.Client
	window time.Duration // ClientOptions.ReconnectWindow

	// life ends when Close is called: every call in flight is cancelled
	// with it (context.AfterFunc, no goroutine per call).
	life  context.Context
	close context.CancelFunc

	// unreadSteers is the last reply's HeaderUnreadSteers.
	unreadSteers atomic.Int64
}

// ClientOptions configures NewClientWith. The zero value is valid: no
// reconnect window.
type ClientOptions struct {
	// ReconnectWindow is how long a call waits for the socket to come back
	// when it cannot be dialled or its connection was cut (see
	// reconnect.go); 0 or less: not at all, the call fails at once.
	ReconnectWindow time.Duration
}

// NewClient returns a Client for the socket at socketPath whose calls wait
// up to ReconnectWindow for it. It does no I/O: a missing socket shows
// only when a method is called.
func NewClient(socketPath string) *Client {
	return NewClientWith(socketPath, ClientOptions{ReconnectWindow: ReconnectWindow})
}

// NewClientWith returns a Client for the socket at socketPath configured by
// opts. It does no I/O.
func NewClientWith(socketPath string, opts ClientOptions) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConns:       4,
		MaxConnsPerHost:    MaxClientConns,
		IdleConnTimeout:    30 * time.Second,
		DisableCompression: true,
	}
	life, cancel := context.WithCancel(context.Background())
	return &Client{path: socketPath, hc: &http.Client{Transport: tr}, window: max(0, opts.ReconnectWindow), life: life, close: cancel}
}

// Close cancels every call in flight (they return an error matching
// ErrUnavailable) and makes later calls fail the same way. The bridge calls it
// when it is told to stop, so that a long-polling inbox call does not hold up
// its exit. It is safe to call more than once.
func (c *Client) Close() {
	c.close()
	c.hc.CloseIdleConnections()
}

// SocketPath returns the socket path the client dials.
func (c *Client) SocketPath() string { return c.path }

// request is one call of the relay.
type request struct {
	method, path string
	// body is the request's body, nil for none.
	body any
	// wait is a long poll's wait, on top of callTimeout.
	wait time.Duration
	// idempotent says the call may be sent again when its connection was
	// cut in flight: the worker does nothing twice for it. Read-only
	// calls are (hello, status, claims, notice); so are inbox (the worker
	// acknowledges what it read only as it replies, and naks it when the
	// bridge went away: what a cut reply carried comes back, unless it was
	// acknowledged, when repeating the call loses nothing more), claim (a
	// pattern the run holds is claimed again with the new reason), a send
	// with an idempotency key (JetStream deduplicates its Nats-Msg-Id),
	// steer next (a steer is handed out once; one a cut reply carried
	// waits in the inbox) and steer ack (a repeated or unknown ack is
	// dropped). A send without a key, ask (a new question each time),
	// reply (the asker may have dropped its question since: a repeat
	// would be refused "no open question") and release (a repeat is
	// refused "not held") are not.
	idempotent bool
	// rewait, for a long poll sent again, returns the body asking for
	// what is left of its wait: the call waits no longer in all than
	// asked.
	rewait func(left time.Duration) any
}

// Hello announces the bridge to the worker, which records that the run's
// bridge connected.
func (c *Client) Hello(ctx context.Context) error {
	return c.call(ctx, request{method: http.MethodPost, path: PathHello, idempotent: true}, nil)
}

// Status returns the run's identity, its peers and its unread count.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return callFor[Status](ctx, c, request{method: http.MethodGet, path: PathStatus, idempotent: true})
}

// Send sends one message as the socket's run and returns its id. A send cut
// off in flight is sent again when it has an idempotency key; without one
// it fails with ErrInterrupted.
func (c *Client) Send(ctx context.Context, r SendRequest) (SendResponse, error) {
	return callFor[SendResponse](ctx, c, request{method: http.MethodPost, path: PathSend, body: r, idempotent: r.IdempotencyKey != ""})
}

// Inbox returns the run's unread messages, oldest first, waiting up to
// r.WaitSeconds for one when none is unread, and marks them read.
func (c *Client) Inbox(ctx context.Context, r InboxRequest) (InboxResponse, error) {
	return callFor[InboxResponse](ctx, c, request{method: http.MethodPost, path: PathInbox, body: r,
		wait: seconds(r.WaitSeconds, MaxWaitSeconds), idempotent: true,
		rewait: func(left time.Duration) any { r.WaitSeconds = int(left / time.Second); return r }})
}

// Claim claims r.Paths for the socket's run, all or none, and returns every
// claim the run holds. A conflict is an *Error with Code CodeConflict.
func (c *Client) Claim(ctx context.Context, r ClaimRequest) (ClaimResponse, error) {
	return callFor[ClaimResponse](ctx, c, request{method: http.MethodPost, path: PathClaim, body: r, idempotent: true})
}

// Release releases r.Paths, all held by the socket's run, or none (an
// *Error with Code CodeNotHeld).
func (c *Client) Release(ctx context.Context, r ReleaseRequest) (ReleaseResponse, error) {
	return callFor[ReleaseResponse](ctx, c, request{method: http.MethodPost, path: PathRelease, body: r})
}

// Claims returns the group's current claims.
func (c *Client) Claims(ctx context.Context) (ClaimsResponse, error) {
	return callFor[ClaimsResponse](ctx, c, request{method: http.MethodGet, path: PathClaims, idempotent: true})
}

// callFor makes the call r and decodes the reply into a Resp.
func callFor[Resp any](ctx context.Context, c *Client, r request) (Resp, error) {
	var resp Resp
	err := c.call(ctx, r, &resp)
	return resp, err
}

// seconds is a request's wait of s seconds, kept within 0 and most.
func seconds(s, most int) time.Duration {
	return time.Duration(max(0, min(s, most))) * time.Second
}

// call makes the call r, decoding the reply into out (nil: none is read).
// One attempt may take callTimeout and r's wait; when it fails because the
// worker is being replaced (retryable), it is made again with
// ReconnectBackOff for up to the client's window from that failure. The
// whole call ends within callTimeout, r's wait and the window.
func (c *Client) call(ctx context.Context, r request, out any) error {
	if c.life.Err() != nil {
		return fmt.Errorf("%w: the bridge is stopping", ErrUnavailable)
	}
	timeout := callTimeout + r.wait
	ctx, cancel := context.WithTimeout(ctx, timeout+c.window)
	defer cancel()
	defer context.AfterFunc(c.life, cancel)()
	start := time.Now()
	err := c.attempt(ctx, r, r.body, timeout, out)
	if err == nil || c.window == 0 || !retryable(r, err) {
		return c.failed(r, err, 0)
	}
	failedAt, last := time.Now(), err
	err = backoff.Retry(func() error {
		body, t := r.body, timeout
		if r.rewait != nil {
			left := max(0, r.wait-time.Since(start))
			body, t = r.rewait(left), callTimeout+left
		}
		last = c.attempt(ctx, r, body, t, out)
		if last != nil && !retryable(r, last) {
			return backoff.Permanent(last)
		}
		return last
	}, backoff.WithContext(ReconnectBackOff(c.window), ctx))
	if err != nil {
		err = last // not the bare context error that ended the wait
	}
	return c.failed(r, err, time.Since(failedAt))
}

// failed returns the error of the call r that ended with err, after waiting
// for the worker for waited: a call not safe to repeat that the worker's
// going away cut off is ErrInterrupted.
func (c *Client) failed(r request, err error, waited time.Duration) error {
	var u *unreachableError
	switch {
	case err == nil:
		return nil
	case !r.idempotent && workerWent(err):
		return interrupted(r, err)
	case errors.As(err, &u):
		u.waited = waited
	}
	return err
}

// attempt makes one request of r with body within timeout (and ctx),
// decoding the reply into out.
func (c *Client) attempt(ctx context.Context, r request, body any, timeout time.Duration, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	// The host part is ignored: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, r.method, "http://jetcrew"+r.path, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // drop net/http's `Post "http://jetcrew/v1/send":` prefix
		}
		return c.transportError(ctx, err)
	}
	defer resp.Body.Close()
	c.noteUnread(resp.Header)
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: reading the worker's reply: %v", ErrUnavailable, err)
		}
		return &cutError{path: c.path, err: fmt.Errorf("reading the reply: %w", err)}
	}
	return decodeReply(resp.StatusCode, data, out)
}

// transportError classifies err, the failure of one attempt's round trip
// within ctx: the attempt's time ran out or the call was cancelled, the
// socket is not served (unreachableError), it could not be dialled for
// another reason, or the connection broke with the request on its way
// (cutError).
func (c *Client) transportError(ctx context.Context, err error) error {
	var op *net.OpError
	switch {
	case ctx.Err() != nil:
	case SocketGone(err):
		return &unreachableError{path: c.path, err: err}
	case errors.As(err, &op) && op.Op == "dial":
	default:
		return &cutError{path: c.path, err: err}
	}
	return fmt.Errorf("%w: cannot reach the worker through %s: %v", ErrUnavailable, c.path, err)
}

// decodeReply decodes a reply of status with body data into out, or
// returns the *Error it carries.
func decodeReply(status int, data []byte, out any) error {
	if status >= 300 {
		var er ErrorResponse
		if json.Unmarshal(data, &er) != nil || er.Error == "" {
			er.Error = fmt.Sprintf("the worker answered HTTP %d", status)
			if status == http.StatusServiceUnavailable {
				er.Code, er.Error = CodeUnavailable, ErrUnavailable.Error()+": "+er.Error
			}
		}
		return &Error{Status: status, Code: er.Code, Message: er.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode the worker's reply: %w", err)
	}
	return nil
}
