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
// uses; it is safe for concurrent use. Every method returns an error
// matching ErrUnavailable (errors.Is) when the socket cannot be reached or
// the worker cannot reach NATS, and an *Error for any other error reply.
type Client struct {
	path string
	hc   *http.Client

	// life ends when Close is called: every call in flight is cancelled
	// with it (context.AfterFunc, no goroutine per call).
	life  context.Context
	close context.CancelFunc

	// unreadSteers is the last reply's HeaderUnreadSteers.
	unreadSteers atomic.Int64
}

// NewClient returns a Client for the socket at socketPath. It does no I/O:
// a missing socket shows only when a method is called.
func NewClient(socketPath string) *Client {
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
	return &Client{path: socketPath, hc: &http.Client{Transport: tr}, life: life, close: cancel}
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

// Hello announces the bridge to the worker, which records that the run's
// bridge connected.
func (c *Client) Hello(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, PathHello, nil, nil, callTimeout)
}

// Status returns the run's identity, its peers and its unread count.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return callFor[Status](ctx, c, http.MethodGet, PathStatus, nil, 0)
}

// Send sends one message as the socket's run and returns its id.
func (c *Client) Send(ctx context.Context, r SendRequest) (SendResponse, error) {
	return callFor[SendResponse](ctx, c, http.MethodPost, PathSend, r, 0)
}

// Inbox returns the run's unread messages, oldest first, waiting up to
// r.WaitSeconds for one when none is unread, and marks them read.
func (c *Client) Inbox(ctx context.Context, r InboxRequest) (InboxResponse, error) {
	return callFor[InboxResponse](ctx, c, http.MethodPost, PathInbox, r, seconds(r.WaitSeconds, MaxWaitSeconds))
}

// Claim claims r.Paths for the socket's run, all or none, and returns every
// claim the run holds. A conflict is an *Error with Code CodeConflict.
func (c *Client) Claim(ctx context.Context, r ClaimRequest) (ClaimResponse, error) {
	return callFor[ClaimResponse](ctx, c, http.MethodPost, PathClaim, r, 0)
}

// Release releases r.Paths, all held by the socket's run, or none (an
// *Error with Code CodeNotHeld).
func (c *Client) Release(ctx context.Context, r ReleaseRequest) (ReleaseResponse, error) {
	return callFor[ReleaseResponse](ctx, c, http.MethodPost, PathRelease, r, 0)
}

// Claims returns the group's current claims.
func (c *Client) Claims(ctx context.Context) (ClaimsResponse, error) {
	return callFor[ClaimsResponse](ctx, c, http.MethodGet, PathClaims, nil, 0)
}

// callFor calls path with in (nil: no body) and decodes the reply into a
// Resp. The call may take callTimeout, and wait more for a long poll.
func callFor[Resp any](ctx context.Context, c *Client, method, path string, in any, wait time.Duration) (Resp, error) {
	var resp Resp
	err := c.call(ctx, method, path, in, &resp, callTimeout+wait)
	return resp, err
}

// seconds is a request's wait of s seconds, kept within 0 and most.
func seconds(s, most int) time.Duration {
	return time.Duration(max(0, min(s, most))) * time.Second
}

func (c *Client) call(ctx context.Context, method, path string, in, out any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if c.life.Err() != nil {
		return fmt.Errorf("%w: the bridge is stopping", ErrUnavailable)
	}
	defer context.AfterFunc(c.life, cancel)()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	// The host part is ignored: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://jetcrew"+path, body)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // drop net/http's `Post "http://jetcrew/v1/send":` prefix
		}
		return fmt.Errorf("%w: cannot reach the worker through %s: %v", ErrUnavailable, c.path, err)
	}
	defer resp.Body.Close()
	c.noteUnread(resp.Header)
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return fmt.Errorf("%w: reading the worker's reply: %v", ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		var er ErrorResponse
		if json.Unmarshal(data, &er) != nil || er.Error == "" {
			er.Error = fmt.Sprintf("the worker answered HTTP %d", resp.StatusCode)
			if resp.StatusCode == http.StatusServiceUnavailable {
				er.Code, er.Error = CodeUnavailable, ErrUnavailable.Error()+": "+er.Error
			}
		}
		return &Error{Status: resp.StatusCode, Code: er.Code, Message: er.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode the worker's reply: %w", err)
	}
	return nil
}
