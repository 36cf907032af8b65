package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxGrantUSD bounds one grant from the console's "Raise budget" form: a
// typo of a few zeros is refused, not granted. `jetcrew budget` has no
// such bound.
const maxGrantUSD = 10_000

// pausedPrefix starts RunState.Budget while a run's model requests are
// held by a budget with on_budget = "pause", until a grant.
const pausedPrefix = "paused:"

// fact is one labelled line of a run's model usage, made visible.
type fact struct {
	Label string `json:"label"`
	Text  string `json:"text"`
}

// usageView is a run's model usage as its page shows it, and as the run
// page's live stream sends it with every state change.
type usageView struct {
	// Facts are the usage totals and the receipt's budgets and price
	// table, in order; none for a run that is not metered.
	Facts []fact `json:"facts,omitempty"`
	// Budget is RunState.Budget, made visible.
	Budget string `json:"budget,omitempty"`
	// Paused is true while the run is not final and a budget holds its
	// model requests: the page offers "Raise budget".
	Paused bool `json:"paused,omitempty"`
}

// Shown reports whether the run page shows a model usage section.
func (v usageView) Shown() bool { return len(v.Facts) > 0 || v.Budget != "" }

// newUsageView returns st's model usage as its page shows it.
func newUsageView(st *messages.RunState) usageView {
	v := usageView{Budget: visible(st.Budget),
		Paused: strings.HasPrefix(st.Budget, pausedPrefix) && !st.State.Final()}
	if u := st.Usage; u != nil {
		v.Facts = append(v.Facts,
			fact{"Model requests", strconv.FormatInt(u.Requests, 10)},
			fact{"Tokens", tokenKinds(u.Tokens)},
			fact{"Cost", costText(u)})
		if u.Unknown > 0 {
			v.Facts = append(v.Facts, fact{"Unknown usage", plural(u.Unknown, "request")})
		}
		if u.WebSearches > 0 {
			v.Facts = append(v.Facts, fact{"Web searches", thousands(u.WebSearches)})
		}
		if u.Unpriced > 0 {
			v.Facts = append(v.Facts, fact{"Unpriced", plural(u.Unpriced, "response") + " (no price for the model)"})
		}
		if u.PartlyUnpriced > 0 {
			v.Facts = append(v.Facts, fact{"Partly unpriced", plural(u.PartlyUnpriced, "response") + " (a fee or tier the price table lacks)"})
		}
		if u.Refused > 0 {
			v.Facts = append(v.Facts, fact{"Refused", plural(u.Refused, "request") + " past a budget"})
		}
	}
	if rc := st.Receipt; rc != nil {
		if rc.Budgets != nil {
			v.Facts = append(v.Facts, fact{"Budgets", budgetsText(rc.Budgets)})
		}
		if rc.Prices != "" {
			v.Facts = append(v.Facts, fact{"Price table", visible(rc.Prices)})
		}
	}
	return v
}

// tokenKinds says tokens by kind, exactly: "1,234 in · 56 out · 7,890
// cache read · 12 cache write (8 for 1h)" (the cache kinds only when not
// zero).
func tokenKinds(t messages.Tokens) string {
	s := thousands(t.Input) + " in · " + thousands(t.Output) + " out"
	if t.CacheRead > 0 {
		s += " · " + thousands(t.CacheRead) + " cache read"
	}
	if t.CacheWrite > 0 {
		s += " · " + thousands(t.CacheWrite) + " cache write"
	}
	if t.CacheWrite1h > 0 {
		s += " (" + thousands(t.CacheWrite1h) + " for 1h)"
	}
	return s
}

// costText says what a run's model usage cost: dollars when any response
// was priced, "not priced" when none was; a lower bound when some were
// not, or only in part.
func costText(u *messages.UsageTotals) string {
	known := u.Requests - u.Unknown
	if u.CostUSD == 0 && (known == 0 || u.Unpriced >= known) {
		return "not priced"
	}
	s := dollars(u.CostUSD)
	switch {
	case u.Unpriced > 0:
		s += " (without the unpriced)"
	case u.PartlyUnpriced > 0:
		s += " (at least: a fee or tier the price table lacks)"
	}
	return s
}

// budgetsText says a run's budgets from its receipt: "run: $0.50, 10,000
// output tokens, 100 requests; group g: $5.00 per 1h0m0s; on budget:
// pause".
func budgetsText(b *messages.ReceiptBudgets) string {
	var parts []string
	if s := limitsText(b.MaxCostUSD, b.MaxOutputTokens, b.MaxModelRequests); s != "" {
		parts = append(parts, "run: "+s)
	}
	for _, sb := range []struct {
		scope string
		b     *messages.ReceiptSharedBudget
	}{{messages.BudgetScopeGroup, b.Group}, {messages.BudgetScopePool, b.Pool}} {
		if sb.b == nil {
			continue
		}
		s := sb.scope + " " + visible(sb.b.Name) + ": " + limitsText(sb.b.MaxCostUSD, sb.b.MaxOutputTokens, sb.b.MaxModelRequests)
		if sb.b.Window != "" {
			s += " per " + visible(sb.b.Window)
		}
		parts = append(parts, s)
	}
	if b.OnBudget != "" {
		parts = append(parts, "on budget: "+visible(b.OnBudget))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func limitsText(usd float64, output, requests int64) string {
	var l []string
	if usd > 0 {
		l = append(l, dollars(usd))
	}
	if output > 0 {
		l = append(l, thousands(output)+" output tokens")
	}
	if requests > 0 {
		l = append(l, plural(requests, "request"))
	}
	return strings.Join(l, ", ")
}

// usageShort is a run's model usage in a few characters, for the runs
// list: its cost ("$0.0123") when any response was priced, else its output
// tokens ("1.2k out tok"), else its requests ("3 req"); "" for a run that
// is not metered.
func usageShort(u *messages.UsageTotals) string {
	switch {
	case u == nil:
		return ""
	case u.CostUSD > 0:
		return dollars(u.CostUSD)
	case u.Tokens.Output > 0:
		return compact(u.Tokens.Output) + " out tok"
	case u.Requests > 0 || u.Refused > 0:
		return compact(u.Requests) + " req"
	}
	return ""
}

// dollars formats US dollars: four decimals under a dollar, two above.
func dollars(usd float64) string {
	if usd < 1 {
		return fmt.Sprintf("$%.4f", usd)
	}
	return fmt.Sprintf("$%.2f", usd)
}

// compact formats a count shortly: 999, 1.2k, 34k, 1.2M.
func compact(n int64) string {
	f := float64(n)
	switch {
	case n < 1000:
		return strconv.FormatInt(n, 10)
	case n < 10_000:
		return strconv.FormatFloat(math.Floor(f/100)/10, 'f', -1, 64) + "k"
	case n < 1_000_000:
		return strconv.FormatInt(n/1000, 10) + "k"
	case n < 10_000_000:
		return strconv.FormatFloat(math.Floor(f/100_000)/10, 'f', -1, 64) + "M"
	}
	return strconv.FormatInt(n/1_000_000, 10) + "M"
}

// thousands formats n with comma thousands separators: 1,234,567.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return thousands(n) + " " + what + "s"
}

// parseGrantUSD reads the "Raise budget" form's amount: US dollars, an
// optional leading "$" or "+", more than zero and at most maxGrantUSD.
func parseGrantUSD(s string) (float64, error) {
	s = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "+"), "$")
	usd, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsNaN(usd) || math.IsInf(usd, 0):
		return 0, fmt.Errorf("amount %q is not a number of US dollars", s)
	case usd <= 0:
		return 0, errors.New("a budget is raised by more than $0")
	case usd > maxGrantUSD:
		return 0, fmt.Errorf("the console raises a budget by at most $%d at once (jetcrew budget has no such bound)", maxGrantUSD)
	}
	return usd, nil
}

// budgets serves the run page's "Raise budget" form of a paused run.
// A grant goes on the run's own budget, as `jetcrew budget` makes one.
type budgets struct {
	*core
}

// raise serves POST /runs/{id}/budget (form field usd):
// dispatcher.GrantRun of that many US dollars on the run's own budget, what
// `jetcrew budget RUN_ID +USD` does, then back to the run's page. A run
// paused by a budget goes on once its worker sees the grant; a run that
// ended meanwhile is granted nothing (409).
func (b *budgets) raise(w http.ResponseWriter, r *http.Request) {
	id, ok := b.runID(w, r)
	if !ok {
		return
	}
	back := "/runs/" + url.PathEscape(id)
	usd, err := parseGrantUSD(r.PostFormValue("usd"))
	if err != nil {
		b.message(w, r, http.StatusBadRequest, "Budget not raised", err.Error(), back)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), b.cfg.ActionTimeout)
	defer cancel()
	if _, err := b.d.GrantRun(ctx, id, messages.BudgetSpend{CostUSD: usd}); err != nil {
		code := http.StatusBadGateway
		if errors.Is(err, dispatcher.ErrNoBudgets) || errors.Is(err, dispatcher.ErrRunEnded) || errors.Is(err, dispatcher.ErrRunNotFound) {
			code = http.StatusConflict
		}
		b.message(w, r, code, "Budget not raised", err.Error(), back)
		return
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}
