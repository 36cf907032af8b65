package bridge

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
)

// FuzzUnbatch checks that no client frame panics the batch filter, and that
// what it hands the SDK is one JSON value a line.
func FuzzUnbatch(f *testing.F) {
	for _, s := range []string{`[]`, `[1]`, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, `[{"jsonrpc":"2.0","method":"x"},{"jsonrpc":"2.0","method":"y"}]`, `[{"id":1,"id":1}]`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		var out bytes.Buffer
		b := NewBatches(&out)
		for _, line := range bytes.Split(b.unbatch(frame), []byte("\n")) {
			if len(line) > 0 && !json.Valid(line) {
				t.Fatalf("handed the SDK %q", line)
			}
		}
		for _, line := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
			if len(line) > 0 && !json.Valid(line) {
				t.Fatalf("wrote %q", line)
			}
		}
	})
}

// TestReaderFrames checks what the SDK reads through Batches.Reader, read a
// few bytes at a time: one message a line, blank lines dropped, a batch of
// an old revision split into its messages, and the end of the stream (EOF,
// or the error of a frame over the limit: the larger of maxFrame and the
// scanner's first buffer, 64 KiB).
func TestReaderFrames(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		in, want string
		wantErr  bool
	}{
		"lines":    {in: "{\"a\":1}\n\n  {\"b\":2}  \n", want: "{\"a\":1}\n{\"b\":2}\n"},
		"no final": {in: `{"a":1}`, want: "{\"a\":1}\n"},
		"batch": {in: `[{"jsonrpc":"2.0","method":"x"},{"jsonrpc":"2.0","id":1,"method":"y"}]` + "\n",
			want: `{"jsonrpc":"2.0","method":"x"}` + "\n" + `{"jsonrpc":"2.0","id":1,"method":"y"}` + "\n"},
		"too long": {in: "{\"a\":1}\n{\"b\":\"" + string(bytes.Repeat([]byte("x"), 70<<10)) + "\"}\n", want: "{\"a\":1}\n", wantErr: true},
	} {
		var out bytes.Buffer
		r := NewBatches(&out).Reader(bytes.NewReader([]byte(tt.in)), 100)
		var got []byte
		buf := make([]byte, 3)
		var err error
		for {
			var n int
			n, err = r.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		if tt.wantErr {
			if err == io.EOF {
				t.Fatalf("%s: got EOF, want the scanner's error", name)
			}
		} else if err != io.EOF {
			t.Fatalf("%s: got %v, want EOF", name, err)
		}
		if string(got) != tt.want {
			t.Fatalf("%s: read %q, want %q", name, got, tt.want)
		}
		if _, err2 := r.Read(buf); err2 != err {
			t.Fatalf("%s: a second read returned %v, want %v again", name, err2, err)
		}
		if out.Len() != 0 {
			t.Fatalf("%s: wrote %q to the client", name, out.String())
		}
	}
}
