package bridge

import (
	"bytes"
	"encoding/json"
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
