package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawSession runs the bridge in process and speaks raw JSON-RPC lines to it.
type rawSession struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan string
	code  chan int
}

func startRaw(t *testing.T, version string) *rawSession {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sock := filepath.Join(t.TempDir(), "none.sock")
	s := &rawSession{t: t, in: inW, lines: make(chan string, 16), code: make(chan int, 1)}
	go func() {
		s.code <- run(context.Background(), nil, inR, outW, io.Discard, func(k string) string {
			if k == "JETCREW_BRIDGE_SOCKET" {
				return sock
			}
			return ""
		})
		_ = outW.Close()
	}()
	go func() { // ends when the bridge's stdout closes
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	t.Cleanup(func() {
		_ = inW.Close()
		select {
		case <-s.code:
		case <-time.After(10 * time.Second):
			t.Error("bridge did not end")
		}
	})
	s.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + version + `","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	init := s.next()
	require.Contains(t, init, `"protocolVersion":"`+version+`"`)
	s.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return s
}

func (s *rawSession) send(line string) {
	_, err := io.WriteString(s.in, line+"\n")
	require.NoError(s.t, err)
}

func (s *rawSession) next() string {
	select {
	case l, ok := <-s.lines:
		require.True(s.t, ok, "the bridge ended the session")
		return l
	case <-time.After(10 * time.Second):
		s.t.Fatal("no answer from the bridge")
		return ""
	}
}

// alive checks the session still answers a single request.
func (s *rawSession) alive(id int) {
	s.send(`{"jsonrpc":"2.0","id":` + itoa(id) + `,"method":"ping"}`)
	require.JSONEq(s.t, `{"jsonrpc":"2.0","id":`+itoa(id)+`,"result":{}}`, s.next())
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// Under 2025-03-26, the protocol version with batching, a batch is answered
// as JSON-RPC says (one array of the requests' responses; nothing for
// notifications); a batch of two notifications does not end the session;
// bad batches get errors.
func TestBatchesUnder20250326(t *testing.T) {
	t.Parallel()
	s := startRaw(t, "2025-03-26")
	s.send(`[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}},{"jsonrpc":"2.0","id":2,"method":"ping"}]`)
	require.JSONEq(t, `[{"jsonrpc":"2.0","id":2,"result":{}}]`, s.next())

	s.send(`[{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":98}},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":97}}]`)
	s.alive(3) // nothing answered the notifications, and the session goes on

	s.send(`[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","id":"five","method":"ping"}]`)
	var got []map[string]any
	require.NoError(t, json.Unmarshal([]byte(s.next()), &got))
	require.Len(t, got, 2)

	for batch, want := range map[string]string{
		`[]`: "empty batch",
		`[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]`: "repeats request id 6",
	} {
		s.send(batch)
		line := s.next()
		require.Contains(t, line, `"id":null`, batch)
		require.Contains(t, line, want, batch)
	}
	s.send(`[1,{"jsonrpc":"2.0","id":7,"method":"ping"}]`)
	require.NoError(t, json.Unmarshal([]byte(s.next()), &got))
	require.Len(t, got, 2, "an error for the bad member, a response for the ping")
	s.alive(8)
}

// Under 2025-06-18, which removed batching, a batch is refused with one
// JSON-RPC error and the session goes on.
func TestBatchesRefusedFrom20250618(t *testing.T) {
	t.Parallel()
	s := startRaw(t, "2025-06-18")
	s.send(`[{"jsonrpc":"2.0","id":2,"method":"ping"}]`)
	line := s.next()
	require.Contains(t, line, `"code":-32600`)
	require.Contains(t, line, `"id":null`)
	require.Contains(t, line, "not part of MCP 2025-06-18")
	s.alive(3)
}
