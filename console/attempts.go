package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// maxAttemptPatch is the most bytes of one attempt's patch the group page
// shows (its run page shows maxPatchShown): a longer one is cut at a whole
// line, with links to the run's page and to the whole patch.
const maxAttemptPatch = 64 << 10

// maxGroupDiffs caps the attempts whose diffs one group page reads: a
// group of more runs (a coordinating group, not submit --attempts) shows
// the diffs of its first maxGroupDiffs workspace runs and says so.
const maxGroupDiffs = 16

// attemptView is one run of a group as the group page compares it: what
// `jetcrew compare` prints of it (dispatcher.Attempt), said for people,
// and its changes.
type attemptView struct {
	ID, Profile, State string
	// Outcome is the state with its reason or exit code, made visible.
	Outcome string
	// Key changes when anything the page shows of the run does: the
	// page's script fetches the attempts again when a state brings
	// another (attemptKey).
	Key string
	// QueuedAt is when it was queued.
	QueuedAt time.Time
	// Duration, Files, Ins, Del, Tokens and Cost as compare says them
	// ("-" for what the run does not have).
	Duration, Files, Ins, Del, Tokens, Cost string
	// Apply is `jetcrew apply ID` for a run with a bundle.
	Apply string
	// Changes is its workspace result with the first maxAttemptPatch
	// bytes of its patch; Changes.Shown is false for a run without one.
	Changes changesView
}

// attemptsData is the group page's "Attempts" section.
type attemptsData struct {
	// Pool and Group name the group; Compare is the command that compares
	// its attempts ("jetcrew compare GROUP", --pool beyond the default
	// pool).
	Pool, Group, Compare string
	// Runs are the group's runs in the order they were submitted.
	Runs []attemptView
	// Diffs counts the runs with a workspace result; DiffsCut those past
	// maxGroupDiffs whose diffs are not read.
	Diffs, DiffsCut int
	// PatchLimit says maxAttemptPatch, for the page's note.
	PatchLimit string
}

// attemptKey identifies what the group page shows of st: its state and
// its workspace result.
func attemptKey(st *messages.RunState) string {
	return string(st.State) + "|" + changesKey(st)
}

// attempts returns the group page's comparison of runs: each one's
// dispatcher.Attempt and, for the first maxGroupDiffs with a workspace
// result, its diffstat and the first maxAttemptPatch bytes of its patch,
// read concurrently (one Object Store read each).
func (p *groupPage) attempts(ctx context.Context, g messages.GroupRef, runs []*messages.RunState) attemptsData {
	runs = slices.Clone(runs)
	slices.SortFunc(runs, dispatcher.SubmitOrder)
	d := attemptsData{Pool: g.Pool, Group: g.Name, Compare: compareCommand(g), Runs: make([]attemptView, len(runs)), PatchLimit: fmt.Sprintf("%d KiB", maxAttemptPatch>>10)}
	var wg sync.WaitGroup
	for i, st := range runs {
		d.Runs[i] = newAttemptView(st)
		if st.WorkspaceResult == nil {
			continue
		}
		if d.Diffs++; d.Diffs > maxGroupDiffs {
			d.DiffsCut++
			continue
		}
		wg.Go(func() { d.Runs[i].Changes = p.results.changesUpTo(ctx, st, maxAttemptPatch) })
	}
	wg.Wait()
	return d
}

// compareCommand is the jetcrew compare command line of group g's
// attempts: --pool only beyond the default pool.
func compareCommand(g messages.GroupRef) string {
	if g.Pool == messages.DefaultPool {
		return "jetcrew compare " + g.Name
	}
	return "jetcrew compare --pool " + g.Pool + " " + g.Name
}

// newAttemptView says dispatcher.AttemptOf(st) for the page, as `jetcrew
// compare` says it.
func newAttemptView(st *messages.RunState) attemptView {
	at := dispatcher.AttemptOf(st)
	v := attemptView{ID: st.ID, Profile: visible(st.Profile), State: string(st.State), Key: attemptKey(st), QueuedAt: st.QueuedAt,
		Duration: "-", Files: "-", Ins: "-", Del: "-", Tokens: "-", Cost: "-"}
	v.Outcome = string(at.State)
	switch {
	case at.Reason != "":
		v.Outcome = visible(shortText(string(at.State)+": "+at.Reason, 160))
	case at.ExitCode != nil && at.State != messages.StateSucceeded:
		v.Outcome = fmt.Sprintf("%s (exit code %d)", at.State, *at.ExitCode)
	}
	if at.DurationMS != nil {
		v.Duration = roundedSpan(time.Duration(*at.DurationMS) * time.Millisecond)
	}
	if at.FilesChanged != nil {
		v.Files, v.Ins, v.Del = strconv.Itoa(*at.FilesChanged), "+"+strconv.Itoa(*at.Insertions), "-"+strconv.Itoa(*at.Deletions)
	}
	if at.Tokens != nil {
		v.Tokens = compact(*at.Tokens)
	}
	if at.CostUSD != nil {
		v.Cost = fmt.Sprintf("$%.4f", *at.CostUSD)
	}
	if at.Bundle {
		v.Apply = "jetcrew apply " + st.ID
	}
	return v
}

// roundedSpan rounds d as compare does: to 10 ms under a second, to 100
// ms under a minute, else to the second.
func roundedSpan(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// attemptsFragment serves GET /groups/{pool}/{group}/attempts: the group
// page's "Attempts" section alone, which its script fetches when a run's
// state brings another outcome or result, or a new run joins.
func (p *groupPage) attemptsFragment(w http.ResponseWriter, r *http.Request) {
	g, ok := groupParam(w, r)
	if !ok {
		return
	}
	runs := p.cache.filter(inGroup(g))
	p.renderStatus(w, r, http.StatusOK, "group", "attempts", page{Data: groupData{Pool: g.Pool, Group: g.Name, Runs: runs, Attempts: p.attempts(r.Context(), g, runs)}})
}
