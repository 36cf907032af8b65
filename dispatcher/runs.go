package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// RunUpdate is one change of the jetcrew-runs bucket, as WatchRuns hands it
// to its callback.
type RunUpdate struct {
	// ID is the run id (the bucket key); empty on the Synced marker.
	ID string
	// State is the run's new state; zero when Deleted.
	State messages.RunState
	// Deleted is true when the run's state was deleted or purged.
	Deleted bool
	// Synced is true on the one marker update WatchRuns sends after the
	// last state stored when it started: every update before it was a
	// stored state, every one after it a live change.
	Synced bool
}

// WatchRuns calls fn with the state of every run stored in the jetcrew-runs
// bucket, then the Synced marker, then every change as it happens, until
// ctx ends. A state is what a worker wrote: a record the server relayed into
// the bucket (another stream's RePublish, a source: origin.Relayed) is
// passed over, and a run whose newest record is one is reported with the
// newest a worker wrote. A state that cannot be decoded is skipped. It
// returns an error wrapping ErrNotProvisioned when the bucket does not
// exist, and nil once ctx has ended; fn runs on WatchRuns' goroutine, one
// update at a time.
func (rs *RunStates) WatchRuns(ctx context.Context, fn func(RunUpdate)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prefix := "$KV." + messages.BucketRuns + "."
	cons, err := rs.js.OrderedConsumer(ctx, runsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return fmt.Errorf("watch runs: %w", classify(err))
	}
	synced := cons.CachedInfo().NumPending == 0
	if synced {
		fn(RunUpdate{Synced: true})
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("watch runs: %w", classify(err))
	}
	msgs, errc, done := readEvents(ctx, it)
	defer func() {
		cancel()
		it.Stop()
		<-done
	}()
	for {
		var m jetstream.Msg
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch runs: the watch of bucket %s ended: %w", messages.BucketRuns, err)
		case m = <-msgs:
		}
		id := strings.TrimPrefix(m.Subject(), prefix)
		data, h, ok := m.Data(), m.Headers(), true
		if origin.Relayed(h) {
			// A change no worker made: passed over live; while syncing, the
			// newest record a worker wrote stands for it.
			ok = false
			if !synced {
				if own, _, err := origin.Newest(ctx, rs.js.Conn(), runsStream, m.Subject()); err == nil {
					data, h, ok = own.Data, own.Header, true
				}
			}
		}
		switch {
		case !ok:
		case h.Get(kvOperation) != "":
			fn(RunUpdate{ID: id, Deleted: true})
		default:
			if st, err := decodeState(id, data); err == nil {
				fn(RunUpdate{ID: id, State: st})
			}
		}
		if meta, err := m.Metadata(); !synced && err == nil && meta.NumPending == 0 {
			synced = true
			fn(RunUpdate{Synced: true})
		}
	}
}

// runsStream is the stream of the jetcrew-runs bucket.
const runsStream = "KV_" + messages.BucketRuns

// AnyFailure is the state a RunFilter names to select every run that ended
// unsuccessfully without being cancelled: failed, timed out or stalled.
// No run is ever in it.
const AnyFailure messages.State = "failure"

// RunFilter selects runs by their state record. The zero value selects
// every run; each set field narrows the selection.
type RunFilter struct {
	// State: the run is in this state (AnyFailure: in any failed one).
	State messages.State
	// Pool, Profile, Group: the run's are these.
	Pool, Profile, Group string
	// Labels: the run has every one of these labels with this value.
	Labels map[string]string
	// Search: a case-insensitive substring of the run's id, group, one of
	// its labels (as "key=value") or its reason (see SearchText).
	Search string
}

// Match reports whether st passes the filter.
func (f RunFilter) Match(st *messages.RunState) bool {
	if !f.matchFields(st) {
		return false
	}
	return f.Search == "" || strings.Contains(SearchText(st), strings.ToLower(f.Search))
}

// MatchText is Match for a caller that keeps each run's SearchText: text
// must be SearchText(st), and needle strings.ToLower(f.Search).
func (f RunFilter) MatchText(st *messages.RunState, text, needle string) bool {
	return f.matchFields(st) && strings.Contains(text, needle)
}

func (f RunFilter) matchFields(st *messages.RunState) bool {
	switch {
	case f.State == AnyFailure:
		if !st.State.Unsuccessful() {
			return false
		}
	case f.State != "" && st.State != f.State:
		return false
	}
	if (f.Pool != "" && st.Pool != f.Pool) ||
		(f.Profile != "" && st.Profile != f.Profile) ||
		(f.Group != "" && st.Group != f.Group) {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := st.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// SearchText is what RunFilter.Search looks in: the run's id, group,
// labels ("key=value", sorted) and reason, lower-cased, one a line (so no
// needle without a newline matches across two of them).
func SearchText(st *messages.RunState) string {
	var b strings.Builder
	b.WriteString(st.ID)
	b.WriteByte('\n')
	b.WriteString(st.Group)
	keys := make([]string, 0, len(st.Labels))
	for k := range st.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte('\n')
		b.WriteString(k + "=" + st.Labels[k])
	}
	b.WriteByte('\n')
	b.WriteString(st.Reason)
	return strings.ToLower(b.String())
}

// Activity is the time a run is listed by: when it was queued or, for a
// replayed run, when its latest replay started (QueuedAt stays the first
// submit's), whichever is later.
func Activity(st *messages.RunState) time.Time {
	if st.Replays > 0 && st.StartedAt.After(st.QueuedAt) {
		return st.StartedAt
	}
	return st.QueuedAt
}

// Newer orders run states newest first: by Activity, then by id (run ids
// sort by creation time). It returns a negative number when a comes before
// b, positive when after, 0 for the same run; for slices.SortFunc.
func Newer(a, b *messages.RunState) int {
	if c := Activity(b).Compare(Activity(a)); c != 0 {
		return c
	}
	return strings.Compare(b.ID, a.ID)
}

// Runs returns the state of every run stored in the jetcrew-runs bucket
// that passes f, newest first (see Newer). It reads the bucket with one
// watch (WatchRuns) until the stored states are delivered. The error wraps
// ErrNotProvisioned when the bucket does not exist.
func (rs *RunStates) Runs(ctx context.Context, f RunFilter) ([]messages.RunState, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		out    []messages.RunState
		synced bool
	)
	err := rs.WatchRuns(ctx, func(u RunUpdate) {
		switch {
		case u.Synced:
			synced = true
			cancel()
		case !synced && !u.Deleted && f.Match(&u.State):
			out = append(out, u.State)
		}
	})
	if err != nil {
		return nil, err
	}
	if !synced {
		return nil, fmt.Errorf("runs: %w", context.Cause(ctx))
	}
	slices.SortFunc(out, func(a, b messages.RunState) int { return Newer(&a, &b) })
	return out, nil
}
