package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// runPage serves a run's page, its live stream, and its cancel and replay.
// The page (GET /runs/{id}) gathers what the other concerns know of the
// run: its changes (results), its connections and questions waiting for
// an operator (egressDesk, questionDesk), and what it was asked.
type runPage struct {
	*core
	cache     *cache
	queue     *queue
	hub       *hub
	results   *results
	egress    *egressDesk
	questions *questionDesk
}

// runData is the run page's data.
type runData struct {
	State messages.RunState
	// Receipt is the profile receipt as indented JSON, made visible.
	Receipt string
	// Result is the agent's result text, made visible.
	Result string
	// Cancellable and Replayable say which buttons to show.
	Cancellable, Replayable bool
	// Usage is the run's model usage, budgets and price table.
	Usage usageView
	// Egress are the run's connections waiting for an operator.
	Egress []egressRow
	// Questions are the run's questions waiting for an operator.
	Questions []questionRow
	// Waiting is true for a run no worker has taken yet: its request
	// waits in JETCREW_RUNS and State is made from it.
	Waiting bool
	// Asked is what the run was asked to do; Commands the jetcrew
	// commands offered to copy.
	Asked    askedView
	Commands []command
	// Changes is what a workspace run changed.
	Changes changesView
}

// waiting returns the queued state of run id when its request waits in
// JETCREW_RUNS: from the latest read of the queue (with its place in the
// pool's queue), else looked for (dispatcher.Request). The error wraps
// dispatcher.ErrRunNotFound when it is found in neither.
func (p *runPage) waiting(ctx context.Context, id string) (messages.RunState, error) {
	for _, st := range p.queue.queued(ctx).Runs {
		if st.ID == id {
			return st, nil
		}
	}
	req, err := p.d.Request(ctx, id)
	if err != nil {
		return messages.RunState{}, err
	}
	return req.State(dispatcher.WaitingReason(req.Pool, 0)), nil
}

// serve answers GET /runs/{id}: the run's state and receipt; its events
// and output arrive over /live/run/{id}.
func (p *runPage) serve(w http.ResponseWriter, r *http.Request) {
	rev := p.cache.current()
	id, ok := p.runID(w, r)
	if !ok {
		return
	}
	st, ok := p.cache.get(id)
	waiting := false
	if !ok {
		var err error
		if st, err = p.d.Status(r.Context(), id); errors.Is(err, dispatcher.ErrRunNotFound) {
			st, err = p.waiting(r.Context(), id)
			waiting = err == nil
		}
		if err != nil {
			p.message(w, r, readStatus(err, dispatcher.ErrRunNotFound), "Run not found", err.Error(), "/runs")
			return
		}
	}
	d := runData{State: st, Waiting: waiting, Result: visible(st.Result),
		Cancellable: !st.State.Final(),
		Replayable:  st.State.Unsuccessful(),
		Usage:       newUsageView(&st),
		Egress:      p.egress.ofRun(r.Context(), &st),
		Asked:       p.asked(r.Context(), &st),
		Commands:    runCommands(&st),
		Changes:     p.results.changes(r.Context(), &st)}
	d.Receipt = receiptText(&st)
	if !st.State.Final() {
		d.Questions = p.questions.ofRun(r.Context(), id)
	}
	p.render(w, r, "run", page{Title: "Run " + id, Nav: "runs", Data: d, Rev: rev})
}

// receiptText returns st's profile receipt as indented JSON, made
// visible; empty when it has none. The page escapes it: JSON's own \u003c
// escapes would only hide the receipt's text.
func receiptText(st *messages.RunState) string {
	if st.Receipt == nil {
		return ""
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(st.Receipt)
	return visible(b.String())
}

// runDetail is a run as its page's live stream sends it: the list's row
// and every other fact the page shows, so that a run ending, cancelled or
// replayed while its page is open shows its exit code, times, output
// size, result and receipt without a reload.
type runDetail struct {
	runRow
	ExitCode  string `json:"exit_code"`
	Started   string `json:"started"`
	Finished  string `json:"finished"`
	Output    string `json:"output"`
	Attempts  string `json:"attempts"`
	Container string `json:"container"`
	Warm      bool   `json:"warm"`
	// Egress is the run's egress totals (egressTotalsText).
	Egress  string `json:"egress"`
	Result  string `json:"result"`
	Receipt string `json:"receipt"`
	// Changes identifies the workspace result (changesKey): the page
	// fetches its "Changes" section again when it differs.
	Changes string `json:"changes"`
}

func newRunDetail(st messages.RunState) runDetail {
	d := runDetail{runRow: newRunRow(st), ExitCode: "-", Started: clock(st.StartedAt), Finished: clock(st.FinishedAt),
		Output: "-", Attempts: attemptsText(st), Container: visible(shortText(st.ContainerID, 12)), Warm: st.Warm,
		Result: visible(st.Result), Receipt: receiptText(&st), Changes: changesKey(&st), Egress: egressTotalsText(st.Egress)}
	d.Worker = visible(st.Worker)
	if st.ExitCode != nil {
		d.ExitCode = strconv.Itoa(*st.ExitCode)
	}
	if st.State.Final() {
		d.Output = strconv.FormatInt(st.OutputBytes, 10) + " bytes"
	}
	return d
}

// attemptsText says a run's attempts, replays and adoptions: "2,
// replayed 1×, adopted 1×" (an adoption is no new attempt: a worker took
// the live container over from one that stopped or died).
func attemptsText(st messages.RunState) string {
	s := strconv.Itoa(st.Attempts)
	if st.Replays > 0 {
		s += ", replayed " + strconv.Itoa(st.Replays) + "×"
	}
	if st.Adoptions > 0 {
		s += ", adopted " + strconv.Itoa(st.Adoptions) + "×"
	}
	return s
}

// liveEvent is one event of a run as the run and group pages get it.
type liveEvent struct {
	Seq     uint64 `json:"seq"`
	RunID   string `json:"run_id,omitempty"`
	Type    string `json:"type"`
	Time    string `json:"time"`
	Attempt int    `json:"attempt,omitempty"`
	// Stream and Text: on output, the chunk made visible.
	Stream string `json:"stream,omitempty"`
	// Text is the event's readable summary, made visible.
	Text string `json:"text,omitempty"`
	// Kind: the agent's or coordination event's kind.
	Kind string `json:"kind,omitempty"`
	// From and To: a coordination message's sender and recipient.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
}

// live serves GET /live/run/{id}: "event" and "output" server-sent
// events of the run from its first one on, then live, and "state" events
// as its state changes.
func (p *runPage) live(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := messages.ValidateToken("run id", id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	carry := map[string][]byte{} // per stream and attempt: a split UTF-8 sequence
	serveLive(p.hub, w, r, func(st *messages.RunState) bool { return st.ID == id }, func(st messages.RunState) any { return newRunDetail(st) },
		func(ctx context.Context) <-chan dispatcher.WatchEvent {
			return p.hub.follow(ctx, []string{messages.SubjectEventsAll(id)})
		},
		func(ev dispatcher.WatchEvent) (string, any) { return toLive(ev, carry) })
}

// toLive turns one event into the page's form, and names its server-sent
// event: "output" or "event".
func toLive(ev dispatcher.WatchEvent, carry map[string][]byte) (string, liveEvent) {
	le := liveEvent{Seq: ev.Sequence, RunID: ev.Event.RunID, Type: string(ev.Type), Time: clock(ev.Time), Attempt: ev.Attempt}
	switch ev.Type {
	case messages.EventOutput:
		key := ev.Stream + "/" + strconv.Itoa(ev.Attempt)
		whole, rest := utf8Carry(append(carry[key], ev.Data...))
		carry[key] = append([]byte(nil), rest...)
		le.Stream, le.Text = ev.Stream, visible(string(whole))
		return "output", le
	case messages.EventAgent:
		var a messages.AgentEvent
		_ = json.Unmarshal(ev.Data, &a)
		le.RunID, le.Kind, le.Text = a.RunID, visible(a.Kind), visible(a.Text)
	case messages.EventCoord:
		le = coordLive(le, ev.Data)
	case messages.EventEgress:
		le = egressLive(le, ev.Data)
	default:
		e := ev.Event
		le.Text = visible(string(e.State))
		if e.Reason != "" {
			le.Text = visible(joinText(string(e.State), e.Reason))
		}
		if e.Worker != "" {
			le.Kind = visible(e.Worker)
		}
		if e.Warm && ev.Type == messages.EventStarted {
			le.Text = joinText(le.Text, "in a warm container")
		}
		if ev.Type == messages.EventAdopted {
			le.Text = visible(fmt.Sprintf("from %s, after %s unwatched", e.AdoptedFrom, (time.Duration(e.GapMS) * time.Millisecond).Round(10*time.Millisecond)))
		}
	}
	return "event", le
}

func joinText(a, b string) string {
	if a == "" {
		return b
	}
	return a + ": " + b
}

// cancel serves POST /runs/{id}/cancel: without confirm=yes it asks
// for a confirmation; with it, dispatcher.Cancel, then back to where the
// form was (back: the runs list or the run's page).
func (p *runPage) cancel(w http.ResponseWriter, r *http.Request) {
	id, ok := p.runID(w, r)
	if !ok {
		return
	}
	back := localBack(r.PostFormValue("back"), "/runs/"+url.PathEscape(id))
	if r.PostFormValue("confirm") != "yes" {
		p.render(w, r, "confirm", page{Title: "Confirm cancel", Nav: "runs", Data: confirmData{Runs: []string{id},
			Action:   "/runs/" + url.PathEscape(id) + "/cancel",
			Question: "Cancel this run? A running run's container is stopped and the run ends cancelled; a queued one is skipped when a worker takes it.",
			Button:   "Cancel the run", Keep: "Keep it", Back: back}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ActionTimeout)
	defer cancel()
	if _, err := p.d.Cancel(ctx, id); err != nil {
		p.message(w, r, http.StatusBadGateway, "Cancel failed", err.Error(), back)
		return
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// localBack returns back when it is the runs list ("/runs", with a query
// or not) or a run's page ("/runs/<id>"), else def: a form's back never
// leads off the console, nor to an action.
func localBack(back, def string) string {
	u, err := url.Parse(back)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Fragment != "" || strings.ContainsAny(back, "\\\r\n") {
		return def
	}
	if id, ok := strings.CutPrefix(u.Path, "/runs/"); u.Path == "/runs" || ok && messages.ValidateToken("run id", id) == nil {
		return back
	}
	return def
}

// replay serves POST /runs/{id}/replay: dispatcher.Replay of the run's
// latest dead letter, then back to the run's page.
func (p *runPage) replay(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ActionTimeout)
	defer cancel()
	if _, err := p.d.Replay(ctx, id); err != nil {
		p.message(w, r, http.StatusConflict, "Replay refused", err.Error(), "/runs/"+url.PathEscape(id))
		return
	}
	http.Redirect(w, r, "/runs/"+url.PathEscape(id), http.StatusSeeOther)
}
