package usage_test

import (
	"fmt"
	"io"
	"strings"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
)

// A proxy meters a model request: Detect and ReadRequest on the way up
// (with Worst, what to reserve for it), Wrap on the way down, Charge when
// the response has ended.
func Example() {
	prices, err := usage.ParsePrices("prices.toml", []byte(`
[models."claude-sonnet-4-5"]
input = 3.0
output = 15.0
`))
	if err != nil {
		panic(err)
	}

	format := usage.Detect("POST", "/v1/messages")
	req, bounds, upBody := usage.ReadRequest(format, "/v1/messages",
		io.NopCloser(strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":1024,"stream":true,"messages":[]}`)), 8<<20)
	w := prices.Worst(req.Model, bounds)
	fmt.Printf("reserve %d output tokens, %.6f USD\n", w.Output, w.CostUSD)
	_, _ = io.Copy(io.Discard, upBody) // sent upstream unchanged

	upstream := io.NopCloser(strings.NewReader("event: message_start\n" +
		`data: {"type":"message_start","message":{"model":"claude-sonnet-4-5-20250929","usage":{"input_tokens":25,"output_tokens":1}}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}` + "\n\n"))
	body := usage.Wrap(format, req, 200, "text/event-stream", upstream, 16<<20, func(r usage.Result) {
		c, ok := prices.Charge(r.Model, r)
		fmt.Printf("%s %s known=%v stream=%v tokens=%+v cost=%.6f priced=%v partly unpriced=%v\n",
			format, r.Model, r.Known, r.Stream, r.Tokens, c.USD, ok, c.PartlyUnpriced)
	})
	_, _ = io.Copy(io.Discard, body) // to the agent, as it arrives
	_ = body.Close()

	status, ct, quota := usage.QuotaError(messages.FormatAnthropic, "jetcrew: budget reached")
	fmt.Println(status, ct, string(quota))
	// Output:
	// reserve 1024 output tokens, 0.015435 USD
	// anthropic-messages claude-sonnet-4-5-20250929 known=true stream=true tokens={Input:25 Output:15 CacheRead:0 CacheWrite:0 CacheWrite1h:0} cost=0.000300 priced=true partly unpriced=[]
	// 429 application/json {"type":"error","error":{"type":"rate_limit_error","message":"jetcrew: budget reached"}}
}
