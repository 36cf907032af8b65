package egress

import "github.com/jetcrew/jetcrew/messages"

// Carried is what a run's egress counted before its session: the totals
// of an adopted run's record, written by the worker that served the run
// until it stopped or died (issue 38), which the adopter's session goes
// on from (Session.Carry).
type Carried struct {
	// Egress are the run's egress totals (messages.RunState.Egress).
	Egress messages.EgressTotals
	// Usage is the run's model usage (messages.RunState.Usage).
	Usage messages.UsageTotals
}

// Carry makes the session go on from what its run counted before it (c):
// its totals (Totals, Usage) start from c's, so they end as everything
// the run did across both sessions; its own budgets (Metering.Limits)
// count c's usage as spent, so a run near a budget before cannot spend
// past it after; and the cap on events (Config.MaxEvents) counts the
// events c's session published (its attempts less EventsDropped, its
// model requests). The run's shared budgets (Metering.Shared) are not
// told: what c spent is in them already, added by the session that spent
// it. Call it before Serve.
func (s *Session) Carry(c Carried) {
	e := c.Egress
	s.events.mu.Lock()
	s.events.counts = e
	s.events.events = clamp(e.Allowed+e.Refused-e.EventsDropped, s.events.max)
	s.events.mu.Unlock()
	l := &s.meter.ledger
	l.mu.Lock()
	l.totals = c.Usage
	l.events = clamp(c.Usage.Requests, s.meter.maxEvents)
	l.mu.Unlock()
}

// clamp returns n within [0, most].
func clamp(n int64, most int) int {
	return int(min(max(n, 0), int64(most)))
}
