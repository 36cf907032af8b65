package console

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxEgressListed caps the questions the egress page lists: the oldest
// that many, with the count of the rest. jetcrew egress pending lists
// them all.
const maxEgressListed = 200

// maxEgressOnRun caps the questions a run's page notes.
const maxEgressOnRun = 5

// egressPoll is how often the egress page's live stream reads the
// waiting questions (names only, and the maxEgressListed oldest values).
const egressPoll = time.Second

// maxOperatorLen is the longest Config.Operator: what
// dispatcher.AnswerEgress takes.
const maxOperatorLen = 128

// defaultOperator is Config.Operator's default: "console@<hostname>".
func defaultOperator() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "console"
	}
	return shortText("console@"+h, maxOperatorLen-1)
}

// egressDesk serves the connections waiting for an operator, and answers.
// A connection waits when its profile says egress_ask: the egress page
// (GET /egress) lists them live with Allow and Deny, and a run's page
// notes its own.
type egressDesk struct {
	*core
	hub *hub
}

// egressRow is one waiting question as the pages show it, its untrusted
// names (host, profile, worker) made visible; the templates escape them.
type egressRow struct {
	ID, RunID, Profile, Worker string
	// HostPort is "host:port" ("[v6]:port" for an IPv6 address).
	HostPort string
	// Since and Until are when the question was put and when its run's
	// timeout refuses it.
	Since, Until time.Time
}

// SinceMS and UntilMS are Since and Until in Unix milliseconds, for the
// script that keeps "waiting for" and "refused in" moving.
func (r egressRow) SinceMS() int64 { return r.Since.UnixMilli() }

// UntilMS is Until in Unix milliseconds.
func (r egressRow) UntilMS() int64 { return r.Until.UnixMilli() }

func newEgressRow(q messages.EgressAsk) egressRow {
	return egressRow{ID: visible(q.ID), RunID: visible(q.RunID), Profile: visible(q.Profile), Worker: visible(q.Worker),
		HostPort: visible(net.JoinHostPort(q.Host, strconv.Itoa(q.Port))), Since: q.Time, Until: q.Until}
}

// until returns how long after now t is, shortly; "0s" once it passed.
func until(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return shortDuration(time.Until(t))
}

// egressData is the egress page's data.
type egressData struct {
	Rows []egressRow
	// Total counts every waiting question; More those not listed.
	Total, More int
	// Limit is maxEgressListed.
	Limit int
	// Answered is the question just answered from this page.
	Answered string
	// Operator is who the console answers as (Config.Operator).
	Operator string
	// Error is what could not be read.
	Error string
	// Sig is the listed questions' signature: the live stream says
	// "changed" when it differs.
	Sig string
}

// data reads the waiting questions, the maxEgressListed oldest.
func (e *egressDesk) data(ctx context.Context) egressData {
	d := egressData{Limit: maxEgressListed, Operator: e.cfg.Operator}
	w, err := e.d.EgressWaiting(ctx, "", maxEgressListed)
	if err != nil {
		d.Error = err.Error()
	}
	for _, q := range w.Asks {
		d.Rows = append(d.Rows, newEgressRow(q))
	}
	d.Total, d.More = w.Total, max(w.Total-len(w.Asks), 0)
	d.Sig = egressSig(w, err)
	return d
}

// egressSig is a short signature of what the egress page lists: the
// questions' ids, the count and the read error.
func egressSig(w dispatcher.EgressWaiting, err error) string {
	h := fnv.New64a()
	for _, q := range w.Asks {
		_, _ = fmt.Fprintf(h, "%s\n", q.ID)
	}
	_, _ = fmt.Fprintf(h, "%d\n", w.Total)
	if err != nil {
		_, _ = fmt.Fprintf(h, "%s\n", err)
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// egressAlert says how many connections wait: the overview's alert line.
func egressAlert(n int) string {
	if n == 1 {
		return "1 connection waits for an operator"
	}
	return fmt.Sprintf("%d connections wait for an operator", n)
}

// serve answers GET /egress: the connections waiting for an
// operator, with Allow and Deny.
func (e *egressDesk) serve(w http.ResponseWriter, r *http.Request) {
	d := e.data(r.Context())
	if id := r.URL.Query().Get("answered"); id != "" {
		if _, ok := messages.ParseEgressAskID(id); ok {
			d.Answered = id
		}
	}
	e.render(w, r, "egress", page{Title: "Connections waiting for an operator", Nav: "egress", Data: d})
}

// fragment serves GET /egress/fragment: the page's body alone,
// which the page swaps in when its live stream says so.
func (e *egressDesk) fragment(w http.ResponseWriter, r *http.Request) {
	e.renderStatus(w, r, http.StatusOK, "egress", "egress-body", page{Data: e.data(r.Context())})
}

// live serves GET /live/egress?v=<sig>: a "changed" server-sent
// event whenever what the page lists differs from what it was rendered
// with (v), read every egressPoll. The page's script moves the ages by
// itself.
func (e *egressDesk) live(w http.ResponseWriter, r *http.Request) {
	s, release, ok := e.hub.start(w)
	if !ok {
		return
	}
	defer release()
	last := r.URL.Query().Get("v")
	tick := time.NewTicker(egressPoll)
	defer tick.Stop()
	keep := time.NewTicker(sseKeepAlive)
	defer keep.Stop()
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			err = s.ping()
		case now := <-tick.C:
			ctx, cancel := context.WithTimeout(r.Context(), egressPoll*5)
			wt, rerr := e.d.EgressWaiting(ctx, "", maxEgressListed)
			cancel()
			if r.Context().Err() != nil {
				return
			}
			if sig := egressSig(wt, rerr); sig != last {
				last = sig
				err = s.send("changed", now.UnixMilli())
			}
		}
		if err != nil {
			return
		}
	}
}

// answer serves POST /egress/answer (form fields id, answer = allow
// or deny, profile = yes for the whole profile from now on):
// dispatcher.AnswerEgress as Config.Operator, what `jetcrew egress
// allow|deny [--profile] ID` does, then back to the egress page.
func (e *egressDesk) answer(w http.ResponseWriter, r *http.Request) {
	id := r.PostFormValue("id")
	if _, ok := messages.ParseEgressAskID(id); !ok {
		e.message(w, r, http.StatusBadRequest, "Bad question id",
			fmt.Sprintf("%q is not a question id (<run_id>.<n>)", id), "/egress")
		return
	}
	var allow bool
	switch r.PostFormValue("answer") {
	case "allow":
		allow = true
	case "deny":
	default:
		e.message(w, r, http.StatusBadRequest, "Not answered", "the answer is allow or deny", "/egress")
		return
	}
	forProfile := r.PostFormValue("profile") == "yes"
	ctx, cancel := context.WithTimeout(r.Context(), e.cfg.ActionTimeout)
	defer cancel()
	_, err := e.d.AnswerEgress(ctx, id, allow, forProfile, e.cfg.Operator)
	switch {
	case errors.Is(err, dispatcher.ErrNoQuestion):
		e.message(w, r, http.StatusConflict, "Not answered",
			id+": no connection waits under this id any more: it was answered elsewhere (another console, jetcrew egress), "+
				"or given up (its timeout refused it, or its run ended)", "/egress")
		return
	case errors.Is(err, dispatcher.ErrAnswered):
		e.message(w, r, http.StatusConflict, "Not answered", id+": another operator answered it first", "/egress")
		return
	case err != nil:
		e.message(w, r, http.StatusBadGateway, "Not answered", err.Error(), "/egress")
		return
	}
	http.Redirect(w, r, "/egress?answered="+url.QueryEscape(id), http.StatusSeeOther)
}

// ofRun returns the questions a run's page notes: none for a run that
// has ended, and none when they cannot be read (logged).
func (e *egressDesk) ofRun(ctx context.Context, st *messages.RunState) []egressRow {
	if st.State.Final() {
		return nil
	}
	w, err := e.d.EgressWaiting(ctx, st.ID, maxEgressOnRun)
	if err != nil {
		e.cfg.Log.Warn().Err(err).Str("run_id", st.ID).Msg("console: read the run's egress questions")
		return nil
	}
	rows := make([]egressRow, 0, len(w.Asks))
	for _, q := range w.Asks {
		rows = append(rows, newEgressRow(q))
	}
	return rows
}
