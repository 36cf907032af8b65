package console

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// egressLive fills le, the run page's line of an egress event (data, a
// messages.EgressEvent), with what the attempt was: "refused: CONNECT
// evil.example:443: <reason>", "upstream failed: POST
// api.anthropic.com:443: <cause>" (an allowed attempt whose host could not
// be reached or did not answer), or "allowed: POST api.anthropic.com:443
// (10 bytes up, 2,048 down)". The method, host and reason are the run's
// choice: made visible.
func egressLive(le liveEvent, data []byte) liveEvent {
	var e messages.EgressEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return le
	}
	what := "refused"
	switch {
	case e.UpstreamFailed():
		what = "upstream failed"
	case e.Allowed:
		what = "allowed"
	}
	parts := []string{what}
	if e.Method != "" || e.Host != "" {
		parts = append(parts, e.Method+" "+net.JoinHostPort(e.Host, strconv.Itoa(e.Port)))
	}
	if e.Reason != "" {
		parts = append(parts, e.Reason)
	}
	le.Text = visible(strings.Join(parts, ": "))
	if e.Allowed && e.Reason == "" {
		le.Text += " (" + thousands(e.BytesUp) + " bytes up, " + thousands(e.BytesDown) + " down)"
	}
	return le
}

// egressTotalsText says a run's egress totals on its page: "4 allowed · 1
// refused · 2 upstream failures" (the failures only when there are some);
// "-" for a run without an egress proxy.
func egressTotalsText(e *messages.EgressTotals) string {
	if e == nil {
		return "-"
	}
	s := thousands(e.Allowed) + " allowed · " + thousands(e.Refused) + " refused"
	if e.UpstreamFailed > 0 {
		s += " · " + plural(e.UpstreamFailed, "upstream failure")
	}
	return s
}
