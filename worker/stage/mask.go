package stage

// Masker masks a run's secrets in what the run shows anyone: its output
// events, the agent events and result parsed from them, its reason (and so
// its dead letter and the worker's log). Not safe for concurrent use: the
// engine calls it under its output lock.
type Masker interface {
	// String returns s with every secret masked.
	String(s string) string
	// Stream masks the next chunk p of output stream name and returns
	// what may be published now, holding back a tail that could begin a
	// secret split across chunks.
	Stream(name string, p []byte) []byte
	// Flush returns what stream name still holds back, at the end of the
	// output.
	Flush(name string) []byte
}
