package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// describeTokens says t as "10 in, 7 out, 3 cache read, 2 cache write (1
// 1h)" (the cache kinds only when there are any).
func describeTokens(t messages.Tokens) string {
	s := fmt.Sprintf("%d in, %d out", t.Input, t.Output)
	if t.CacheRead > 0 {
		s += fmt.Sprintf(", %d cache read", t.CacheRead)
	}
	if t.CacheWrite > 0 {
		s += fmt.Sprintf(", %d cache write", t.CacheWrite)
	}
	if t.CacheWrite1h > 0 {
		s += fmt.Sprintf(" (%d 1h)", t.CacheWrite1h)
	}
	return s
}

// describeUsage says a run's model usage in one line: requests, tokens,
// web searches, cost (when priced; "or more" when some was not), and what
// could not be read or priced.
func describeUsage(u messages.UsageTotals) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d model requests; tokens %s", u.Requests, describeTokens(u.Tokens))
	if u.WebSearches > 0 {
		fmt.Fprintf(&b, "; %d web searches", u.WebSearches)
	}
	if u.CostUSD > 0 || u.Unpriced == 0 && u.Requests > u.Unknown {
		fmt.Fprintf(&b, "; $%.4f", u.CostUSD)
		if u.Unpriced > 0 || u.PartlyUnpriced > 0 {
			b.WriteString(" or more")
		}
	}
	var notes []string
	if u.Unknown > 0 {
		notes = append(notes, fmt.Sprintf("%d with unknown usage", u.Unknown))
	}
	if u.Unpriced > 0 {
		notes = append(notes, fmt.Sprintf("%d not priced", u.Unpriced))
	}
	if u.PartlyUnpriced > 0 {
		notes = append(notes, fmt.Sprintf("%d partly priced", u.PartlyUnpriced))
	}
	if u.Refused > 0 {
		notes = append(notes, fmt.Sprintf("%d refused by a budget", u.Refused))
	}
	if len(notes) > 0 {
		b.WriteString(" (" + strings.Join(notes, ", ") + ")")
	}
	return b.String()
}

// printUsage prints a model response's usage as a lifecycle line ("---
// usage: claude-sonnet-4-5: 10 in, 7 out tokens, $0.0001, 1.2s").
func (p *runPrinter) printUsage(ev dispatcher.WatchEvent) error {
	var e messages.UsageEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return nil
	}
	model := cmp.Or(e.Model, "model unknown")
	line := "--- usage: " + visibleName(model) + ": "
	switch {
	case !e.Known:
		line += fmt.Sprintf("usage unknown (status %d)", e.Status)
	default:
		line += describeTokens(e.Tokens) + " tokens"
		if e.WebSearches > 0 {
			line += fmt.Sprintf(", %d web searches", e.WebSearches)
		}
		if e.CostUSD != nil {
			line += fmt.Sprintf(", $%.4f", *e.CostUSD)
		}
		if len(e.PartlyUnpriced) > 0 {
			line += " or more (no price for " + visibleName(strings.Join(e.PartlyUnpriced, ", ")) + ")"
		}
	}
	line += fmt.Sprintf(", %.1fs", float64(e.DurationMS)/1000)
	return p.lifecycleLine(line)
}

// printBudget prints a budget reached ("--- budget reached: ...").
func (p *runPrinter) printBudget(ev dispatcher.WatchEvent) error {
	var e messages.BudgetEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil {
		return nil
	}
	return p.lifecycleLine("--- " + visibleName(e.Reason) + "; the run ends")
}

// lifecycleLine writes line to stderr on a line of its own.
func (p *runPrinter) lifecycleLine(line string) error {
	if !p.atLineStart {
		line = "\n" + line
		p.atLineStart = true
	}
	_, err := fmt.Fprintln(p.stderr, line)
	return err
}
