package console

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// runsPage serves the runs list: filtered, newest first, a page at a time.
// It lists the runs the cache holds and those no worker has taken yet
// (queue), and its live stream adds and updates them.
type runsPage struct {
	*core
	cache *cache
	queue *queue
	hub   *hub
}

// parseFilter reads the runs list's filter from its query: state (a state,
// or "failure": dispatcher.AnyFailure), pool, profile, group, label (k=v,
// repeatable) and q (a search: dispatcher.RunFilter.Search).
func parseFilter(q url.Values) dispatcher.RunFilter {
	f := dispatcher.RunFilter{
		State:   messages.State(strings.TrimSpace(q.Get("state"))),
		Pool:    strings.TrimSpace(q.Get("pool")),
		Profile: strings.TrimSpace(q.Get("profile")),
		Group:   strings.TrimSpace(q.Get("group")),
		Search:  strings.TrimSpace(q.Get("q")),
	}
	for _, l := range q["label"] {
		if k, v, _ := strings.Cut(strings.TrimSpace(l), "="); k != "" {
			if f.Labels == nil {
				f.Labels = map[string]string{}
			}
			f.Labels[k] = v
		}
	}
	return f
}

// filterQuery returns f as URL query parameters (without the page cursor).
func filterQuery(f dispatcher.RunFilter) url.Values {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("state", string(f.State))
	set("pool", f.Pool)
	set("profile", f.Profile)
	set("group", f.Group)
	set("q", f.Search)
	for _, kv := range labelPairs(f.Labels) {
		q.Add("label", kv)
	}
	return q
}

// labelPairs returns labels as sorted "k=v" strings.
func labelPairs(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// cursor marks a place in the newest-first runs list: the last run shown,
// by its activity (dispatcher.Activity) and id.
type cursor struct {
	queued time.Time
	id     string
}

// cursorOf returns the cursor at st.
func cursorOf(st *messages.RunState) cursor {
	return cursor{queued: dispatcher.Activity(st), id: st.ID}
}

func parseCursor(s string) (cursor, bool) {
	ns, id, ok := strings.Cut(s, "_")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return cursor{}, false
	}
	return cursor{queued: time.Unix(0, n), id: id}, true
}

func (cu cursor) String() string {
	return strconv.FormatInt(cu.queued.UnixNano(), 10) + "_" + cu.id
}

// after reports whether st comes after the cursor in newest-first order.
func (cu cursor) after(st *messages.RunState) bool {
	if c := dispatcher.Activity(st).Compare(cu.queued); c != 0 {
		return c < 0
	}
	return st.ID < cu.id
}

// runsData is the runs page's data.
type runsData struct {
	Filter dispatcher.RunFilter
	// Label is the label filter as the form shows it: "k=v", first only.
	Label string
	// States lists the states the filter offers.
	States []messages.State
	Runs   []*messages.RunState
	// Total is the number of runs matching the filter.
	Total int
	// Next is the URL of the next page (older runs); empty on the last.
	Next string
	// Newer is the URL of the page before (newer runs), FirstPage the
	// first page's; both empty on the first page.
	Newer, FirstPage string
	// From and To are the 1-based positions of the first and last run
	// shown among Total ("51–100 of 350"); 0 when none is shown.
	From, To int
	// Links are the URLs the label chips filter by: the filter with
	// label k=v added, by "k=v".
	Links map[string]string
	// First is true on the first page: new runs are prepended live.
	First bool
	// LiveQuery is the live stream's query string (the filter).
	LiveQuery string
	// Queue is what was read of the requests no worker has taken: the
	// page says when the queue is longer than what was read.
	Queue queuedView
	// Back is this page's URL: where a Cancel confirmed from it returns.
	Back string
}

var allStates = []messages.State{messages.StateQueued, messages.StateRunning, messages.StateSucceeded,
	dispatcher.AnyFailure, messages.StateFailed, messages.StateCancelled, messages.StateTimedOut, messages.StateStalled}

// serve answers GET /runs: the filtered runs, newest first, one page at
// a time (?before=<cursor>). ?q= with an exact run id goes to that run.
func (p *runsPage) serve(w http.ResponseWriter, r *http.Request) {
	rev := p.cache.current()
	q := r.URL.Query()
	f := parseFilter(q)
	qv := p.queue.queued(r.Context())
	if id := f.Search; id != "" {
		// An exact run id goes to its page.
		_, ok := p.cache.get(id)
		for i := 0; !ok && i < len(qv.Runs); i++ {
			ok = qv.Runs[i].ID == id
		}
		if ok {
			http.Redirect(w, r, "/runs/"+url.PathEscape(id), http.StatusSeeOther)
			return
		}
	}
	all := p.cache.filterRuns(f)
	if n := len(all); f.State == "" || f.State == messages.StateQueued {
		for i := range qv.Runs {
			if f.Match(&qv.Runs[i]) {
				all = append(all, &qv.Runs[i])
			}
		}
		if len(all) > n {
			slices.SortFunc(all, dispatcher.Newer)
		}
	}
	start := 0
	cu, paged := parseCursor(q.Get("before"))
	if paged {
		for start < len(all) && !cu.after(all[start]) {
			start++
		}
	}
	size := p.cfg.PageSize
	end := min(start+size, len(all))
	d := runsData{Filter: f, States: allStates, Runs: all[start:end], Total: len(all), First: !paged,
		LiveQuery: filterQuery(f).Encode(), Queue: qv, Links: map[string]string{}, Back: r.URL.RequestURI()}
	if end > start {
		d.From, d.To = start+1, end
	}
	if ls := labelPairs(f.Labels); len(ls) > 0 {
		d.Label = ls[0]
	}
	if end < len(all) {
		nq := filterQuery(f)
		nq.Set("before", cursorOf(all[end-1]).String())
		d.Next = "/runs?" + nq.Encode()
	}
	if paged {
		d.FirstPage = "/runs?" + filterQuery(f).Encode()
		d.Newer = d.FirstPage
		if prev := start - size; prev > 0 {
			nq := filterQuery(f)
			nq.Set("before", cursorOf(all[prev-1]).String())
			d.Newer = "/runs?" + nq.Encode()
		}
	}
	for _, st := range d.Runs {
		for k, v := range st.Labels {
			kv := visible(k + "=" + v) // as labelList shows it
			if _, ok := d.Links[kv]; ok {
				continue
			}
			lf := f
			lf.Labels = map[string]string{k: v}
			for ok, ov := range f.Labels {
				if ok != k {
					lf.Labels[ok] = ov
				}
			}
			d.Links[kv] = "/runs?" + filterQuery(lf).Encode()
		}
	}
	p.render(w, r, "runs", page{Title: "Runs", Nav: "runs", Data: d, Rev: rev})
}

// runRow is a run as the live streams send it: every text made visible.
type runRow struct {
	ID      string   `json:"id"`
	State   string   `json:"state"`
	Pool    string   `json:"pool"`
	Profile string   `json:"profile"`
	Group   string   `json:"group"`
	Labels  []string `json:"labels"`
	Worker  string   `json:"worker"`
	Queued  string   `json:"queued"`
	Reason  string   `json:"reason"`
	Final   bool     `json:"final"`
	// QueuedAt, StartedAt and FinishedAt are the run's times (isoTime):
	// the pages say them relative to now, and its waits and durations.
	QueuedAt   string `json:"queued_at"`
	StartedAt  string `json:"started_at"`
	FinishedAt string `json:"finished_at"`
	// Activity is the time the list orders it by (dispatcher.Activity,
	// isoTime): a replay moves it.
	Activity string `json:"activity"`
	// Usage is the runs list's short model usage (usageShort).
	Usage string `json:"usage"`
	// Model is the run page's model usage section.
	Model usageView `json:"model"`
}

func newRunRow(st messages.RunState) runRow {
	return runRow{
		ID: st.ID, State: string(st.State), Pool: st.Pool, Profile: st.Profile, Group: st.Group,
		Labels: labelList(st.Labels), Worker: st.Worker, Queued: clock(st.QueuedAt),
		QueuedAt: isoTime(st.QueuedAt), StartedAt: isoTime(st.StartedAt), FinishedAt: isoTime(st.FinishedAt),
		Activity: isoTime(dispatcher.Activity(&st)),
		Reason:   visible(shortText(st.Reason, 120)), Final: st.State.Final(),
		Usage: usageShort(st.Usage), Model: newUsageView(&st),
	}
}

// queuePoll is how often the runs list's live stream looks for runs
// newly queued (their requests, in JETCREW_RUNS).
const queuePoll = 2 * time.Second

// live serves GET /live/runs?<filter>: a server-sent "run" event for
// every state change of a run matching the filter, as it happens, and for
// every run newly queued (its request, looked for every queuePoll).
func (p *runsPage) live(w http.ResponseWriter, r *http.Request) {
	f := parseFilter(r.URL.Query())
	s, updates, end, ok := p.hub.open(w, r, f.Match, "run", func(st messages.RunState) any { return newRunRow(st) })
	if !ok {
		return
	}
	defer end()
	keep := time.NewTicker(sseKeepAlive)
	defer keep.Stop()
	// Runs no worker has taken change no state: the queue is looked at
	// every queuePoll for new ones (the list shows them as they come).
	poll := time.NewTicker(queuePoll)
	defer poll.Stop()
	sent := map[string]bool{}
	for _, st := range p.queue.queued(r.Context()).Runs {
		sent[st.ID] = true // on the page already
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			if s.ping() != nil {
				return
			}
		case <-poll.C:
			if f.State != "" && f.State != messages.StateQueued {
				continue
			}
			for _, st := range p.queue.queued(r.Context()).Runs {
				if sent[st.ID] || !f.Match(&st) {
					continue
				}
				sent[st.ID] = true
				if s.send("run", newRunRow(st)) != nil {
					return
				}
			}
		case st, ok := <-updates:
			if !ok {
				return // fell behind: the page reconnects
			}
			if !f.Match(&st) {
				continue
			}
			if s.send("run", newRunRow(st)) != nil {
				return
			}
		}
	}
}
