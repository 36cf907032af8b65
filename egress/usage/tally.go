package usage

import (
	"bytes"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// tally is the usage read so far from one response.
type tally struct {
	model  string
	tokens messages.Tokens
	// webSearches counts the response's billed web searches.
	webSearches int64
	// tier is the dearer processing tier the response was served at
	// (Result.Tier), "" for the standard one.
	tier string
	// known is set once a usage object has been read.
	known bool
}

// final returns t's tokens with the one-hour cache writes cut to the cache
// writes they are a part of (a provider's larger count is not to price
// more writes than were made).
func (t *tally) final() messages.Tokens {
	tk := t.tokens
	tk.CacheWrite1h = min(tk.CacheWrite1h, tk.CacheWrite)
	return tk
}

// reader reads one format's usage into a tally: event takes the data of
// one server-sent event, body a whole JSON body. Both ignore what they
// cannot read.
type reader struct {
	event func(t *tally, data []byte)
	body  func(t *tally, data []byte)
}

// readers are the formats' readers, by messages.Format*.
var readers = map[string]reader{
	messages.FormatAnthropic:        {event: anthropicEvent, body: anthropicBody},
	messages.FormatOpenAIChat:       {event: chatEvent, body: chatBody},
	messages.FormatOpenAIResponses:  {event: responsesEvent, body: responsesBody},
	messages.FormatGemini:           {event: geminiEvent, body: geminiBody},
	messages.FormatGeminiCodeAssist: {event: codeAssistEvent, body: codeAssistBody},
}

// mentions reports whether data holds the JSON key or string key (quotes
// included). It only saves decoding events that cannot matter: what it
// lets through is still decoded and checked.
func mentions(data []byte, key string) bool {
	return bytes.Contains(data, []byte(key))
}

// count returns *n, or 0 for a missing or negative count.
func count(n *int64) int64 {
	if n == nil || *n < 0 {
		return 0
	}
	return *n
}

// minus returns a-b, or 0 when b exceeds a (a provider's cached count
// larger than its prompt count is not to make Input negative).
func minus(a, b int64) int64 {
	if b > a {
		return 0
	}
	return a - b
}

// dearTier returns "<key> <value>" for a processing tier value dearer than
// the provider's standard rates (OpenAI's service_tier "priority", "scale",
// "fast", "ultrafast"; Anthropic's service_tier "priority" and speed
// "fast"; any value not known to be standard or cheaper), "" for the
// standard and cheaper ones and for none.
func dearTier(key, value string) string {
	switch value {
	case "", "auto", "default", "flex", "standard", "batch":
		return ""
	}
	if len(value) > 32 {
		value = value[:32]
	}
	return key + " " + strings.ToValidUTF8(value, "")
}
