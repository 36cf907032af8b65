package usage

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// Bounds is what a model request's body says about the most it can cost
// (ReadRequest): how many output tokens it lets the model generate and how
// large its input is.
type Bounds struct {
	// Whole is true when the body was read to its end within the bound
	// and is a JSON object: the fields below are the body's. False for a
	// body past the bound, one that is not JSON (an encoded body among
	// them) and a request without a body.
	Whole bool
	// Size is the body's length in bytes when Whole.
	Size int64
	// MaxOutput is the request's own cap on output tokens, 0 when it sets
	// none: Anthropic's max_tokens, Chat Completions' max_completion_tokens
	// or max_tokens (the larger), Responses' max_output_tokens, Gemini's
	// generationConfig.maxOutputTokens (Code Assist's in the wrapped
	// request's, request.generationConfig). Every one of them counts the
	// reasoning (thinking) tokens too.
	MaxOutput int64
	// Choices is how many answers the request asks for, each up to
	// MaxOutput: Chat Completions' n, Gemini's (and Code Assist's)
	// generationConfig.candidateCount; 1 otherwise.
	Choices int64
	// WebSearches is the most web searches the request may pay for
	// (webSearches): 0 without a web search tool.
	WebSearches int64
	// Background is true for a Responses request with "background": true,
	// which the provider answers at once and runs later: its usage is
	// read by no response the proxy sees.
	Background bool
}

// ReadRequest returns what a request of format (Detect's) to path says
// about itself and its Bounds, and a body to send upstream in place of
// body: it replays exactly the bytes read here, followed by the rest of
// body (and by the error that stopped reading, if one did), and its Close
// closes body. It reads at most max bytes of body (plus one, to tell a
// larger body apart); a larger body, or one that is not a JSON object,
// yields only what the path says (Bounds.Whole false) and is passed on
// unparsed. A nil body is returned as is. It never fails: the request
// goes upstream byte for byte in every case. What the path says comes
// first (requestPath: Gemini's and Claude on Vertex AI's model, a
// streaming method), the body's "model" and "stream" only where the path
// says nothing; a Code Assist body's bounds are those of the Gemini
// request it wraps ("request"). The body is read as JSON by its exact
// keys, the last of a repeated key winning (as the providers read it), so
// a key spelt in another case ("Stream") is not mistaken for the one the
// provider reads.
func ReadRequest(format, path string, body io.ReadCloser, max int64) (Request, Bounds, io.ReadCloser) {
	req := requestPath(format, path)
	b := Bounds{Choices: 1}
	if body == nil || body == http.NoBody || format == "" || max <= 0 {
		return req, b, body
	}
	limit := max
	if limit < math.MaxInt64 {
		limit++
	}
	var buf bytes.Buffer
	_, err := buf.ReadFrom(io.LimitReader(body, limit))
	read := buf.Bytes()
	rb := &replay{r: bytes.NewReader(read), err: err, rc: body}
	if err != nil || int64(len(read)) > max {
		return req, b, rb
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(read, &top) != nil || top == nil {
		return req, b, rb
	}
	rb.whole = read
	b.Whole, b.Size = true, int64(len(read))
	if format != messages.FormatGemini {
		if req.Model == "" {
			_ = json.Unmarshal(top["model"], &req.Model)
		}
		if !req.Stream {
			_ = json.Unmarshal(top["stream"], &req.Stream)
		}
	}
	switch format {
	case messages.FormatAnthropic:
		b.MaxOutput = jsonCount(top["max_tokens"])
		b.WebSearches = webSearches(format, top)
	case messages.FormatOpenAIChat:
		req.IncludeUsage = includeUsage(top["stream_options"])
		b.MaxOutput = max64(jsonCount(top["max_completion_tokens"]), jsonCount(top["max_tokens"]))
		b.Choices = max64(1, jsonCount(top["n"]))
	case messages.FormatOpenAIResponses:
		b.MaxOutput = jsonCount(top["max_output_tokens"])
		b.WebSearches = webSearches(format, top)
		_ = json.Unmarshal(top["background"], &b.Background)
	case messages.FormatGemini:
		b.MaxOutput, b.Choices = geminiBounds(top)
	case messages.FormatGeminiCodeAssist:
		var inner map[string]json.RawMessage
		_ = json.Unmarshal(top["request"], &inner)
		b.MaxOutput, b.Choices = geminiBounds(inner)
	}
	return req, b, rb
}

// webSearches returns the most web searches a request of format, its
// body top, may pay for: for each Anthropic web search tool (a tool whose
// type starts "web_search_": web_search_20250305 and its successors) its
// max_uses, else DefaultWebSearches; for a Responses request with a web
// search tool (type "web_search", "web_search_preview" or a dated one) its
// max_tool_calls (which bounds every built-in tool call of the answer),
// else DefaultWebSearches. 0 for a request without such a tool.
func webSearches(format string, top map[string]json.RawMessage) int64 {
	var tools []json.RawMessage
	if json.Unmarshal(top["tools"], &tools) != nil {
		return 0
	}
	var n int64
	var responses bool
	for _, raw := range tools {
		var tool map[string]json.RawMessage
		var typ string
		if json.Unmarshal(raw, &tool) != nil || json.Unmarshal(tool["type"], &typ) != nil {
			continue
		}
		switch {
		case format == messages.FormatAnthropic && strings.HasPrefix(typ, "web_search_"):
			uses := jsonCount(tool["max_uses"])
			if uses <= 0 {
				uses = DefaultWebSearches
			}
			n = addSat(n, uses)
		case format == messages.FormatOpenAIResponses && strings.HasPrefix(typ, "web_search"):
			responses = true
		}
	}
	if responses {
		if n = jsonCount(top["max_tool_calls"]); n <= 0 {
			n = DefaultWebSearches
		}
	}
	return n
}

// addSat returns a+b for a, b >= 0, saturated at math.MaxInt64.
func addSat(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// includeUsage reports whether stream_options (raw JSON) sets
// include_usage to true.
func includeUsage(raw json.RawMessage) bool {
	var so map[string]json.RawMessage
	if json.Unmarshal(raw, &so) != nil {
		return false
	}
	var on bool
	_ = json.Unmarshal(so["include_usage"], &on)
	return on
}

// geminiBounds returns generationConfig's maxOutputTokens and
// candidateCount (at least 1). Google's JSON mapping of protocol buffers
// accepts a field by its lowerCamel and its snake_case name alike, so
// both are read, the larger counting.
func geminiBounds(top map[string]json.RawMessage) (maxOut, choices int64) {
	choices = 1
	for _, key := range []string{"generationConfig", "generation_config"} {
		var gc map[string]json.RawMessage
		if json.Unmarshal(top[key], &gc) != nil {
			continue
		}
		maxOut = max64(maxOut, jsonCount(gc["maxOutputTokens"]), jsonCount(gc["max_output_tokens"]))
		choices = max64(choices, jsonCount(gc["candidateCount"]), jsonCount(gc["candidate_count"]))
	}
	return maxOut, choices
}

// jsonCount returns raw as a count of tokens: a JSON number (or a string
// holding one, as Google's mapping of 64-bit integers allows) that is a
// whole number >= 0, saturated at math.MaxInt64; else 0.
func jsonCount(raw json.RawMessage) int64 {
	if len(raw) == 0 {
		return 0
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(s)
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || f < 0 || math.IsNaN(f) || f != math.Trunc(f) {
		return 0
	}
	if f >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(f)
}

func max64(a int64, bs ...int64) int64 {
	for _, b := range bs {
		a = max(a, b)
	}
	return a
}

// IncludeUsage returns body, a Chat Completions request's body as
// ReadRequest returned it, rewritten to ask for usage in its stream:
// stream_options.include_usage = true, the request's other stream_options
// and keys kept (the keys in Go's order; a key the body repeated once, by
// its last value, which is the one the provider reads). It returns the new
// body and its length, and false (body as it was) when ReadRequest did not
// read body whole as a JSON object or stream_options is not an object.
func IncludeUsage(body io.ReadCloser) (io.ReadCloser, int64, bool) {
	rb, ok := body.(*replay)
	if !ok || rb.whole == nil {
		return body, 0, false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(rb.whole, &top) != nil {
		return body, 0, false
	}
	so := map[string]json.RawMessage{}
	if raw, ok := top["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if json.Unmarshal(raw, &so) != nil {
			return body, 0, false
		}
	}
	so["include_usage"] = json.RawMessage("true")
	top["stream_options"] = marshalRaw(so)
	data := marshalRaw(top)
	return &replay{r: bytes.NewReader(data), rc: rb.rc, whole: data}, int64(len(data)), true
}

// marshalRaw encodes v as JSON without Go's escaping of <, > and &, so the
// strings the request carries reach the provider as they were written.
func marshalRaw(v any) json.RawMessage {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // maps of raw JSON already checked
		panic(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
