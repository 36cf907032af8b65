package console

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxReplayBatch caps the runs one confirmation replays.
const maxReplayBatch = 500

// deadLetterPages serves the dead letters and their replay, discard and
// archive. The page is GET /dead-letters; archive also takes a run's
// letters out of the archive.
type deadLetterPages struct {
	*core
	cache *cache
	queue *queue
}

// deadLetter is one run's latest dead letter and what became of the run.
type deadLetter struct {
	dispatcher.DeadLetter
	Fate dispatcher.Fate
	// Resolved is Fate.Resolved(): the letter needs nothing more.
	Resolved bool
	// Replays is the run's replay count (its state's).
	Replays int
}

// deadGroup is the dead letters of one reason: each run's latest.
type deadGroup struct {
	Reason      string
	Count       int
	First, Last time.Time
	// Sample is one request of the group (the latest), made visible.
	Sample string
	// Runs are the ids of the group's runs not resolved, newest first:
	// what "Replay all" replays.
	Runs []string
	// Letters are the group's dead letters, one per run, newest first.
	Letters []deadLetter
	// Pools are the pools its runs failed in.
	Pools []string
}

// deadData is the dead letters page's data.
type deadData struct {
	Groups []deadGroup
	// All is true when resolved dead letters are shown (?all=1).
	All bool
	// Archived is true for the archive (?archived=1): the archived dead
	// letters only.
	Archived bool
	// Counts of the resolved (hidden unless All) and archived (shown only
	// in the archive) dead letters.
	Counts deadCounts
}

// deadCounts counts the dead letters a view of the page leaves out.
type deadCounts struct {
	// Resolved counts those not archived whose run was healed.
	Resolved int
	// Archived counts those archived (dispatcher.Archive).
	Archived int
}

// deadView says which dead letters the page shows: archived ones only
// (Archived), else those not archived, the resolved ones too with All.
type deadView struct {
	All, Archived bool
}

// shows reports whether the view shows dl.
func (v deadView) shows(dl deadLetter) bool {
	if v.Archived || dl.Archived {
		return v.Archived && dl.Archived
	}
	return v.All || !dl.Resolved
}

// groupDeadLetters keeps each run's latest dead letter, says what became
// of it (fate: from the run's id and latest dead letter), and groups those
// view shows by reason, the largest group first. It counts the resolved
// and the archived ones whatever the view.
func groupDeadLetters(dls []dispatcher.DeadLetter, fate func(dispatcher.DeadLetter) deadLetter, view deadView) ([]deadGroup, deadCounts) {
	latest := make(map[string]dispatcher.DeadLetter, len(dls))
	for _, dl := range dls {
		if cur, ok := latest[dl.RunID]; !ok || dl.Sequence > cur.Sequence {
			latest[dl.RunID] = dl
		}
	}
	byReason := map[string]*deadGroup{}
	pools := map[string]map[string]bool{}
	var n deadCounts
	for _, raw := range latest {
		dl := fate(raw)
		switch {
		case dl.Archived:
			n.Archived++
		case dl.Resolved:
			n.Resolved++
		}
		if !view.shows(dl) {
			continue
		}
		g := byReason[dl.Reason]
		if g == nil {
			g = &deadGroup{Reason: visible(dl.Reason), First: dl.Time}
			byReason[dl.Reason] = g
			pools[dl.Reason] = map[string]bool{}
		}
		g.Count++
		if dl.Time.Before(g.First) {
			g.First = dl.Time
		}
		if !dl.Time.Before(g.Last) {
			g.Last, g.Sample = dl.Time, visible(shortText(string(dl.Request), 2000))
		}
		dl.Request = nil // the sample carries one; the rest are not shown
		g.Letters = append(g.Letters, dl)
		pools[dl.Reason][dl.Pool] = true
	}
	out := make([]deadGroup, 0, len(byReason))
	for reason, g := range byReason {
		for p := range pools[reason] {
			g.Pools = append(g.Pools, p)
		}
		sort.Strings(g.Pools)
		sort.Slice(g.Letters, func(i, j int) bool { return g.Letters[i].Sequence > g.Letters[j].Sequence })
		for _, dl := range g.Letters {
			if !dl.Resolved && dl.Fate != dispatcher.FateReplaying {
				g.Runs = append(g.Runs, dl.RunID)
			}
		}
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Reason < out[j].Reason
	})
	return out, n
}

// serve answers GET /dead-letters: each run's latest dead letter and
// what became of the run, grouped by reason; the resolved ones only with
// ?all=1; the archived ones only, and only they, with ?archived=1.
func (p *deadLetterPages) serve(w http.ResponseWriter, r *http.Request) {
	dls, err := p.d.Failed(r.Context(), "")
	if err != nil {
		p.message(w, r, http.StatusBadGateway, "Dead letters unavailable", err.Error(), "/")
		return
	}
	reqs, _, _ := p.queue.requests(r.Context())
	waiting := dispatcher.ReplaysWaiting(reqs)
	fate := func(dl dispatcher.DeadLetter) deadLetter {
		st, ok := p.cache.get(dl.RunID)
		f := dispatcher.FateOf(st, ok, waiting[dl.RunID])
		return deadLetter{DeadLetter: dl, Fate: f, Resolved: f.Resolved(), Replays: st.Replays}
	}
	d := deadData{All: r.URL.Query().Get("all") == "1", Archived: r.URL.Query().Get("archived") == "1"}
	d.Groups, d.Counts = groupDeadLetters(dls, fate, deadView{All: d.All, Archived: d.Archived})
	p.render(w, r, "deadletters", page{Title: "Dead letters", Nav: "dead", Data: d})
}

// discard serves POST /dead-letters/discard with one run=<id>:
// without confirm=yes it asks for a confirmation; with it, it deletes every
// dead letter of the run (dispatcher.Discard).
func (p *deadLetterPages) discard(w http.ResponseWriter, r *http.Request) {
	id := r.PostFormValue("run")
	if err := messages.ValidateToken("run id", id); err != nil {
		p.message(w, r, http.StatusBadRequest, "Bad run id", err.Error(), "/dead-letters")
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		p.render(w, r, "confirm", page{Title: "Confirm discard", Nav: "dead", Data: confirmData{Runs: []string{id}, Action: "/dead-letters/discard",
			Question: "Discard every dead letter of this run? They are deleted from JETCREW_FAILED and the run can no longer be replayed; its state and output stay.",
			Button:   "Discard", Keep: "Keep them"}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ActionTimeout)
	defer cancel()
	n, err := p.d.Discard(ctx, id)
	if err != nil {
		p.message(w, r, http.StatusBadGateway, "Discard", err.Error(), "/dead-letters")
		return
	}
	p.message(w, r, http.StatusOK, "Discard", fmt.Sprintf("Discarded %d dead letter(s) of run %s: it can no longer be replayed.", n, id), "/dead-letters")
}

// archive serves POST /dead-letters/archive with one run=<id>
// (and undo=1 to take it out of the archive): without confirm=yes it asks
// for a confirmation; with it, dispatcher.Archive (or Unarchive).
func (p *deadLetterPages) archive(w http.ResponseWriter, r *http.Request) {
	id := r.PostFormValue("run")
	if err := messages.ValidateToken("run id", id); err != nil {
		p.message(w, r, http.StatusBadRequest, "Bad run id", err.Error(), "/dead-letters")
		return
	}
	undo := r.FormValue("undo") == "1" // in the query of the confirmation's form
	if r.PostFormValue("confirm") != "yes" {
		d := confirmData{Runs: []string{id}, Action: "/dead-letters/archive", Button: "Archive", Keep: "Cancel",
			Question: "Archive the dead letters of this run? They are kept (and can still be replayed), hidden from the dead letters until the archive is opened."}
		if undo {
			d.Action, d.Button, d.Back = "/dead-letters/archive?undo=1", "Unarchive", "/dead-letters?archived=1"
			d.Question = "Take the dead letters of this run out of the archive? They are listed with the others again."
		}
		p.render(w, r, "confirm", page{Title: "Confirm " + strings.ToLower(d.Button), Nav: "dead", Data: d})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ActionTimeout)
	defer cancel()
	if undo {
		if err := p.d.Unarchive(ctx, id); err != nil {
			p.message(w, r, http.StatusBadGateway, "Unarchive", err.Error(), "/dead-letters?archived=1")
			return
		}
		p.message(w, r, http.StatusOK, "Unarchive", "The dead letters of run "+id+" are listed again.", "/dead-letters")
		return
	}
	if err := p.d.Archive(ctx, id); err != nil {
		p.message(w, r, http.StatusBadGateway, "Archive", err.Error(), "/dead-letters")
		return
	}
	p.message(w, r, http.StatusOK, "Archive", "Archived the dead letters of run "+id+": kept, shown in the archive.", "/dead-letters")
}

// confirmData is a confirmation page's data: the question, the runs it
// is about, and the form that confirms it (posted to Action with
// confirm=yes, each run, and Back).
type confirmData struct {
	Question string
	Runs     []string
	Action   string
	// Button is the confirming button's text; Keep the link's that
	// leaves things as they are (back to Back, else the dead letters).
	Button, Keep string
	Back         string
}

// replayResult is the outcome of a confirmed replay.
type replayResult struct {
	Replayed []string
	Refused  []string
}

// replay serves POST /dead-letters/replay with one or more
// run=<id>: without confirm=yes it asks for a confirmation; with it, it
// replays each run's latest dead letter (dispatcher.Replay) and reports.
func (p *deadLetterPages) replay(w http.ResponseWriter, r *http.Request) {
	runs := r.PostForm["run"]
	if len(runs) == 0 {
		p.message(w, r, http.StatusBadRequest, "Nothing to replay", "no run was selected", "/dead-letters")
		return
	}
	if len(runs) > maxReplayBatch {
		p.message(w, r, http.StatusBadRequest, "Too many runs",
			fmt.Sprintf("%d runs selected; at most %d are replayed at once", len(runs), maxReplayBatch), "/dead-letters")
		return
	}
	for _, id := range runs {
		if err := messages.ValidateToken("run id", id); err != nil {
			p.message(w, r, http.StatusBadRequest, "Bad run id", err.Error(), "/dead-letters")
			return
		}
	}
	if r.PostFormValue("confirm") != "yes" {
		p.render(w, r, "confirm", page{Title: "Confirm replay", Nav: "dead", Data: confirmData{Runs: runs, Action: "/dead-letters/replay",
			Question: fmt.Sprintf("Replay the latest dead letter of these %d run(s)? Each request is published again, unchanged, and runs anew.", len(runs)),
			Button:   fmt.Sprintf("Replay %d run(s)", len(runs)), Keep: "Cancel"}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.ActionTimeout)
	defer cancel()
	var res replayResult
	for _, id := range runs {
		if _, err := p.d.Replay(ctx, id); err != nil {
			res.Refused = append(res.Refused, id+": "+err.Error())
			continue
		}
		res.Replayed = append(res.Replayed, id)
	}
	text := fmt.Sprintf("Replayed %d run(s) (below, each a link to its page).", len(res.Replayed))
	if len(res.Refused) > 0 {
		text += fmt.Sprintf(" Refused %d: %s.", len(res.Refused), strings.Join(res.Refused, "; "))
	}
	p.messageRuns(w, r, http.StatusOK, "Replay", text, "/dead-letters", res.Replayed)
}
