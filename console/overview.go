package console

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// overviewRefresh is the most often the overview's live stream tells the
// page to fetch the overview again (on state changes), and how often it
// does so anyway (heartbeat ages move on by themselves).
const (
	overviewMinInterval = time.Second
	overviewMaxInterval = 5 * time.Second
)

// overviewPage serves the overview: pools, workers, runs by state, alerts.
// The page (GET /) also charts the runs' trends; its live stream says
// when to fetch it again.
type overviewPage struct {
	*core
	cache     *cache
	queue     *queue
	questions *questionDesk
	hub       *hub
}

// poolRow is one pool on the overview.
type poolRow struct {
	dispatcher.PoolStats
	// Running counts the pool's runs whose state is running.
	Running int
	// QueuedRuns counts the pool's runs whose state is queued, and those
	// no worker has taken yet (their requests, as far as read).
	QueuedRuns int
	// StartedPerMin and FailedPerMin count the runs started, and ended
	// failed, timed out or stalled, in the last minute.
	StartedPerMin, FailedPerMin int
	// OldestQueued is the queue time of the pool's oldest queued run, or
	// when its oldest request no worker has taken was stored.
	OldestQueued time.Time
	// SpendUSD and SpendOutput sum the model usage (UsageTotals.CostUSD
	// and Tokens.Output) of the pool's runs whose state was written in
	// the last hour; Metered counts those runs that have usage.
	SpendUSD    float64
	SpendOutput int64
	Metered     int
	// Unserved is set for a pool whose requests wait in JETCREW_RUNS
	// with no workers-<pool> consumer to take them (Queued counts them).
	Unserved *dispatcher.UnservedPool
}

// workerRow is one live worker on the overview.
type workerRow struct {
	dispatcher.WorkerBeat
	// Held counts the runs whose state is running on this worker.
	Held int
}

// overviewData is the overview's data.
type overviewData struct {
	Pools   []poolRow
	Workers []workerRow
	Alerts  []string
	// EgressWaiting counts the connections waiting for an operator
	// (egress_ask): an alert linking to /egress.
	EgressWaiting int
	// QuestionsWaiting counts the runs' questions waiting for an
	// operator's answer: an alert linking to /questions.
	QuestionsWaiting int
	// States counts every run by state.
	States map[messages.State]int
	Total  int
	// Trends are the charts of the last hour and the last day, from the
	// run states (trend).
	Trends []trendView
	// Empty is set on an installation with no run yet: the page shows how
	// to submit one.
	Empty bool
	// Cluster is the NATS nodes of a cluster; nil on a single server.
	Cluster *clusterView
	// Errors are what could not be read (the page shows the rest).
	Errors []string
}

// data gathers the overview: pool stats from the pools' consumers,
// live workers from their heartbeats, rates and ages from the run states.
func (o *overviewPage) data(r *http.Request) overviewData {
	var d overviewData
	pools, err := o.d.Pools(r.Context())
	d.noteErr(err)
	workers, err := o.d.Workers(r.Context())
	d.noteErr(err)
	unserved, err := o.d.UnservedPools(r.Context())
	d.noteErr(err)
	asks, err := o.d.EgressWaiting(r.Context(), "", 0)
	d.noteErr(err)
	d.EgressWaiting = asks.Total
	qs, err := o.questions.open(r.Context(), nil)
	d.noteErr(err)
	d.QuestionsWaiting = len(qs)
	byPool := poolRows{}
	for _, p := range pools {
		byPool[p.Pool] = &poolRow{PoolStats: p}
	}
	// A submitter may spread requests over many pools: the first
	// dispatcher.MaxOldestLookups get a row and an alert each, the rest
	// one line.
	var shown, more int
	var moreRequests uint64
	for _, u := range unserved {
		switch {
		case byPool[u.Pool] != nil:
		case shown == dispatcher.MaxOldestLookups:
			more++
			moreRequests += u.Requests
		default:
			shown++
			byPool[u.Pool] = &poolRow{PoolStats: dispatcher.PoolStats{Pool: u.Pool, Queued: u.Requests}, OldestQueued: u.Oldest, Unserved: &u}
		}
	}
	nodes, err := o.d.StreamNodes(r.Context())
	d.noteErr(err)
	d.Cluster = nodesView(nodes)
	held := o.tally(&d, byPool, time.Now())
	// The runs no worker has taken have no state: their requests in
	// JETCREW_RUNS say how long the oldest of each pool has waited.
	queued := o.queue.queued(r.Context()).Runs
	d.Empty = d.Total == 0 && len(queued) == 0
	for _, st := range queued {
		byPool.get(st.Pool).queue(st.QueuedAt)
	}
	for _, p := range byPool {
		d.Pools = append(d.Pools, *p)
	}
	sort.Slice(d.Pools, func(i, j int) bool { return d.Pools[i].Pool < d.Pools[j].Pool })
	for _, w := range workers {
		d.Workers = append(d.Workers, workerRow{WorkerBeat: w, Held: held[w.ID]})
	}
	d.Alerts = alerts(d.Pools, len(workers), time.Now())
	if more > 0 {
		d.Alerts = append(d.Alerts, fmt.Sprintf("%d more pool(s) that no worker serves hold %d request(s) in %s", more, moreRequests, messages.StreamRuns))
	}
	return d
}

// noteErr adds err, when there is one, to what the overview could not read.
func (d *overviewData) noteErr(err error) {
	if err != nil {
		d.Errors = append(d.Errors, err.Error())
	}
}

// poolRows are the overview's pool rows by pool name.
type poolRows map[string]*poolRow

// get returns pool's row, adding an empty one when it has none.
func (b poolRows) get(pool string) *poolRow {
	p := b[pool]
	if p == nil {
		p = &poolRow{PoolStats: dispatcher.PoolStats{Pool: pool}}
		b[pool] = p
	}
	return p
}

// queue counts a queued run of the pool, queued at.
func (p *poolRow) queue(at time.Time) {
	p.QueuedRuns++
	if p.OldestQueued.IsZero() || at.Before(p.OldestQueued) {
		p.OldestQueued = at
	}
}

// tally counts every cached run into d (states, total, trends) and its
// pool's row, as of now, and returns how many runs each worker holds.
func (o *overviewPage) tally(d *overviewData, byPool poolRows, now time.Time) (held map[string]int) {
	held = map[string]int{}
	d.States = map[messages.State]int{}
	trends := make([]*trend, len(trendSpecs))
	for i, spec := range trendSpecs {
		trends[i] = newTrend(spec, now)
	}
	minute, hour := now.Add(-time.Minute), now.Add(-time.Hour)
	o.cache.each(func(st *messages.RunState) {
		d.States[st.State]++
		d.Total++
		for _, t := range trends {
			t.add(st)
		}
		p := byPool.get(st.Pool)
		switch st.State {
		case messages.StateQueued:
			p.queue(st.QueuedAt)
		case messages.StateRunning:
			p.Running++
			held[st.Worker]++
		}
		if st.State.Unsuccessful() && st.FinishedAt.After(minute) {
			p.FailedPerMin++
		}
		if st.StartedAt.After(minute) {
			p.StartedPerMin++
		}
		if st.Usage != nil && st.UpdatedAt.After(hour) {
			p.Metered++
			p.SpendUSD += st.Usage.CostUSD
			p.SpendOutput += st.Usage.Tokens.Output
		}
	})
	for _, t := range trends {
		d.Trends = append(d.Trends, t.view())
	}
	return held
}

// poolSpend says a pool's model spend over the last hour: "$0.0123 ·
// 1.2k out tok", the tokens alone when nothing was priced, "-" when no run
// of the pool was metered in the hour.
func poolSpend(p poolRow) string {
	switch {
	case p.Metered == 0:
		return "-"
	case p.SpendUSD > 0:
		return dollars(p.SpendUSD) + " · " + compact(p.SpendOutput) + " out tok"
	}
	return compact(p.SpendOutput) + " out tok"
}

// alerts lists what a person should act on: requests for a pool no worker
// serves, a pool with queued runs that no worker takes, and a pool at its
// max ack pending.
func alerts(pools []poolRow, liveWorkers int, now time.Time) []string {
	var out []string
	for _, p := range pools {
		queued := max(int(p.Queued), p.QueuedRuns)
		switch {
		case p.Unserved != nil:
			out = append(out, unservedAlert(*p.Unserved, now))
		case queued > 0 && liveWorkers == 0:
			out = append(out, fmt.Sprintf("pool %s has %d queued run(s) and no worker is alive", p.Pool, queued))
		case p.Queued > 0 && p.Waiting == 0 && p.InFlight == 0:
			out = append(out, fmt.Sprintf("pool %s has %d queued run(s) and no worker is pulling from it", p.Pool, p.Queued))
		}
		if p.MaxAckPending > 0 && p.InFlight >= p.MaxAckPending {
			out = append(out, fmt.Sprintf("pool %s is at its max ack pending (%d runs in flight): new runs wait", p.Pool, p.InFlight))
		}
	}
	return out
}

// unservedAlert says that u's requests wait for a worker of a pool no
// worker serves, until when, and how to remove them.
func unservedAlert(u dispatcher.UnservedPool, now time.Time) string {
	a := fmt.Sprintf("pool %s has %d request(s) in %s and no worker serves it (no %s consumer)",
		u.Pool, u.Requests, messages.StreamRuns, messages.ConsumerName(u.Pool))
	if !u.Oldest.IsZero() {
		a += fmt.Sprintf(": the oldest was stored %s ago", now.Sub(u.Oldest).Round(time.Second))
		if !u.Expires.IsZero() {
			a += fmt.Sprintf(" and is removed in %s (the stream's max age)", max(u.Expires.Sub(now), 0).Round(time.Second))
		}
	}
	return a + fmt.Sprintf("; start a worker with --pool %s, or remove them: nats stream purge %s --subject %s",
		u.Pool, messages.StreamRuns, messages.SubjectRuns(u.Pool))
}

// serve answers GET /.
func (o *overviewPage) serve(w http.ResponseWriter, r *http.Request) {
	o.render(w, r, "overview", page{Title: "Overview", Nav: "overview", Data: o.data(r)})
}

// fragment serves GET /overview/fragment: the overview's body
// alone, which the page swaps in when its live stream says so.
func (o *overviewPage) fragment(w http.ResponseWriter, r *http.Request) {
	o.renderStatus(w, r, http.StatusOK, "overview", "overview-body", page{Data: o.data(r)})
}

// live serves GET /live/overview: a "changed" server-sent event
// at most every overviewMinInterval while runs change, and at least every
// overviewMaxInterval.
func (o *overviewPage) live(w http.ResponseWriter, r *http.Request) {
	updates, _, unsubscribe := o.cache.subscribe(^uint64(0), nil)
	defer unsubscribe()
	s, release, ok := o.hub.start(w)
	if !ok {
		return
	}
	defer release()
	tick := time.NewTicker(overviewMinInterval)
	defer tick.Stop()
	dirty, last := false, time.Now()
	for {
		select {
		case <-r.Context().Done():
			return
		case _, ok := <-updates:
			if !ok {
				return
			}
			dirty = true
		case now := <-tick.C:
			if !dirty && now.Sub(last) < overviewMaxInterval {
				continue
			}
			if s.send("changed", now.UnixMilli()) != nil {
				return
			}
			dirty, last = false, now
		}
	}
}
