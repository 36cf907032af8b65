package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

func TestValidateSend(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		req  relay.SendRequest
		code string // "" means valid
		want string
	}{
		{"peer", relay.SendRequest{To: "run-1", Body: "x"}, "", ""},
		{"all", relay.SendRequest{To: "all", Body: "x"}, "", ""},
		{"operator", relay.SendRequest{To: "operator", Body: "x", IdempotencyKey: "k"}, "", ""},
		{"max body", relay.SendRequest{To: "all", Body: strings.Repeat("b", relay.MaxBodyBytes)}, "", ""},
		{"empty to", relay.SendRequest{Body: "x"}, relay.CodeInvalid, "to is empty"},
		{"dot", relay.SendRequest{To: "g.r", Body: "x"}, relay.CodeInvalid, "not a run id"},
		{"star", relay.SendRequest{To: "*", Body: "x"}, relay.CodeInvalid, "not a run id"},
		{"gt", relay.SendRequest{To: ">", Body: "x"}, relay.CodeInvalid, "not a run id"},
		{"space", relay.SendRequest{To: "a b", Body: "x"}, relay.CodeInvalid, "not a run id"},
		{"too long to", relay.SendRequest{To: strings.Repeat("r", 65), Body: "x"}, relay.CodeInvalid, "longest allowed is 64"},
		{"empty body", relay.SendRequest{To: "all"}, relay.CodeInvalid, "body is empty"},
		{"big body", relay.SendRequest{To: "all", Body: strings.Repeat("b", relay.MaxBodyBytes+1)}, relay.CodeTooLarge, "16385 bytes, largest allowed is 16384"},
		{"big key", relay.SendRequest{To: "all", Body: "x", IdempotencyKey: strings.Repeat("k", 257)}, relay.CodeInvalid, "idempotency_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := relay.ValidateSend(tt.req)
			if tt.code == "" {
				require.NoError(t, err)
				return
			}
			var ie *relay.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tt.code, ie.Code)
			require.Contains(t, ie.Message, tt.want)
		})
	}
}

func TestNormalizeInbox(t *testing.T) {
	t.Parallel()
	r, err := relay.NormalizeInbox(relay.InboxRequest{})
	require.NoError(t, err)
	require.Equal(t, relay.InboxRequest{Max: relay.DefaultInboxMax}, r)
	r, err = relay.NormalizeInbox(relay.InboxRequest{WaitSeconds: 30, Max: 50})
	require.NoError(t, err)
	require.Equal(t, relay.InboxRequest{WaitSeconds: 30, Max: 50}, r)
	for _, bad := range []relay.InboxRequest{{WaitSeconds: -1}, {WaitSeconds: 31}, {Max: -1}, {Max: 51}} {
		_, err := relay.NormalizeInbox(bad)
		require.Error(t, err, "%+v", bad)
	}
}

func TestDecodeRequests(t *testing.T) {
	t.Parallel()
	r, err := relay.DecodeSendRequest([]byte(`{"to":"a","body":"hi","idempotency_key":"k"}`))
	require.NoError(t, err)
	require.Equal(t, relay.SendRequest{To: "a", Body: "hi", IdempotencyKey: "k"}, r)
	for body, want := range map[string]string{
		`{"to":"a","body":"hi","from":"b"}`: `unknown field "from"`,
		`{"to":"a","body":"hi"} {}`:         "data after the JSON object",
		`[]`:                                "cannot unmarshal array",
		`nope`:                              "invalid character",
		`{"to":"a.b","body":"hi"}`:          "not a run id",
		// Exact keys, each once (messages.DecodeStrictJSON).
		`{"to":"a","body":"hi","To":"b"}`:                                        `key "To" is not "to"`,
		`{"to":"a","body":"hi","body":"evil"}`:                                   `key "body" appears twice`,
		`{"to":"a","body":"hi","BODY":"evil"}`:                                   `key "BODY" is not "body"`,
		`{"to":"a","body":"` + strings.Repeat("x", relay.MaxRequestBytes) + `"}`: "largest allowed",
	} {
		_, err := relay.DecodeSendRequest([]byte(body))
		require.ErrorContains(t, err, want, body[:min(len(body), 40)])
	}
	in, err := relay.DecodeInboxRequest(nil)
	require.NoError(t, err)
	require.Equal(t, relay.DefaultInboxMax, in.Max)
	_, err = relay.DecodeInboxRequest([]byte(`{"wait_seconds":5,"inbox_of":"b"}`))
	require.ErrorContains(t, err, `unknown field "inbox_of"`)
}

// serveSocket serves h on a unix socket in a short temp dir.
func serveSocket(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "jcr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	polling := make(chan struct{}, 1) // an inbox call reached the server
	path := serveSocket(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case relay.PathStatus:
			w.WriteHeader(http.StatusServiceUnavailable) // no body at all
		case relay.PathSend:
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(relay.ErrorResponse{Code: relay.CodeUnknownPeer, Error: `unknown peer "x"`})
		case relay.PathInbox:
			select {
			case polling <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	c := relay.NewClient(path)
	ctx := context.Background()
	require.NoError(t, c.Hello(ctx))

	_, err := c.Status(ctx)
	require.ErrorIs(t, err, relay.ErrUnavailable)
	require.True(t, strings.HasPrefix(err.Error(), "coordination unavailable: "), err.Error())

	_, err = c.Send(ctx, relay.SendRequest{To: "x", Body: "y"})
	var re *relay.Error
	require.ErrorAs(t, err, &re)
	require.Equal(t, http.StatusNotFound, re.Status)
	require.Equal(t, relay.CodeUnknownPeer, re.Code)
	require.Equal(t, `unknown peer "x"`, err.Error())
	require.NotErrorIs(t, err, relay.ErrUnavailable)

	// Close cuts a long poll short.
	done := make(chan error, 1)
	go func() {
		_, err := c.Inbox(ctx, relay.InboxRequest{WaitSeconds: 30})
		done <- err
	}()
	select {
	case <-polling:
	case err := <-done:
		t.Fatalf("the long poll ended before it reached the server: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll never reached the server")
	}
	c.Close()
	select {
	case err := <-done:
		require.ErrorIs(t, err, relay.ErrUnavailable)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not cancel the call in flight")
	}
	close(release)
	require.ErrorIs(t, c.Hello(ctx), relay.ErrUnavailable, "a closed client refuses calls")
	c.Close()
}

func TestClientSocketMissing(t *testing.T) {
	t.Parallel()
	c := relay.NewClientWith("/nonexistent/jetcrew/bridge.sock", relay.ClientOptions{})
	_, err := c.Status(context.Background())
	require.ErrorIs(t, err, relay.ErrUnavailable)
	require.Equal(t, "coordination unavailable: cannot reach the worker through /nonexistent/jetcrew/bridge.sock: dial unix /nonexistent/jetcrew/bridge.sock: connect: no such file or directory", err.Error())
	require.True(t, errors.Is(err, relay.ErrUnavailable))
}

// FuzzDecodeSendRequest checks that no input panics the decoder the worker
// runs on what a run's bridge sends, and that every accepted request passes
// validation and re-encodes to itself.
func FuzzDecodeSendRequest(f *testing.F) {
	for _, s := range []string{`{"to":"a","body":"b"}`, `{"to":"all","body":"x","idempotency_key":"k"}`, `{`, `null`, `{"to":"a.b"}`, `{"from":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := relay.DecodeSendRequest(data)
		if err != nil {
			var ie *relay.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("error is not an InvalidError: %v", err)
			}
			return
		}
		if err := relay.ValidateSend(r); err != nil {
			t.Fatalf("accepted request fails validation: %v", err)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := relay.DecodeSendRequest(b)
		if err != nil {
			t.Fatalf("re-encoded request refused: %v\n%s", err, b)
		}
		require.Equal(t, r, r2)
	})
}

// FuzzDecodeClaimRequest: whatever a claim request holds, it is refused
// with an *InvalidError or accepted with patterns that are clean, relative
// and inside the workspace, and stable when decoded again.
func FuzzDecodeClaimRequest(f *testing.F) {
	for _, s := range []string{`{"paths":["src"],"reason":"r"}`, `{"paths":["./a/../b/","**/*.go"],"reason":""}`, `{"paths":["/x"]}`,
		`{"paths":["../x"]}`, `{"paths":["a/[x"]}`, `{"paths":[]}`, `{"run_id":"x","paths":["a"]}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := relay.DecodeClaimRequest(data)
		if err != nil {
			var ie *relay.InvalidError
			if !errors.As(err, &ie) {
				t.Fatalf("error is not an InvalidError: %v", err)
			}
			return
		}
		for _, p := range r.Paths {
			c, err := relay.ValidatePattern(p)
			require.NoError(t, err)
			require.Equal(t, p, c, "accepted patterns are clean")
			require.False(t, p == "." || p == ".." || strings.HasPrefix(p, "/") || strings.HasPrefix(p, "../"), p)
		}
		b, err := json.Marshal(r)
		require.NoError(t, err)
		r2, err := relay.DecodeClaimRequest(b)
		require.NoError(t, err)
		require.Equal(t, r, r2)
	})
}

// Spellings of one file are one pattern: ValidatePattern cleans them
// lexically (path.Clean), so a claim and its release, or two runs' claims,
// meet whatever the spelling.
func TestValidatePatternSpellings(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"src/a.go", "./src//a.go", "src/./a.go", "src/a.go/", "src/../src/a.go", ".//src///a.go//", "src/sub/../a.go"} {
		c, err := relay.ValidatePattern(p)
		require.NoError(t, err, p)
		require.Equal(t, "src/a.go", c, p)
	}
	for _, p := range []string{"src/..", "./", "a/../../b", "/src/a.go"} {
		_, err := relay.ValidatePattern(p)
		require.Error(t, err, p)
	}
}
