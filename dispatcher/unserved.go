package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// UnservedPool is a pool whose requests wait in JETCREW_RUNS with no
// worker to take them: it has no workers-<pool> consumer, so no worker
// has served it on this server.
type UnservedPool struct {
	// Pool is the pool name: the token after jetcrew.runs. (a subject
	// that names no pool, jetcrew.runs.a.b, is listed under its whole
	// rest, "a.b").
	Pool string
	// Requests counts the pool's requests in JETCREW_RUNS, replays
	// included.
	Requests uint64
	// Oldest is when the pool's oldest request was stored; zero when it
	// could not be read.
	Oldest time.Time
	// Expires is when the stream's max age removes that oldest request;
	// zero when the stream has no max age or Oldest is unknown.
	Expires time.Time
}

// MaxOldestLookups is the most unserved pools UnservedPools reads the
// oldest request of (one message read each), the first by name: a
// submitter may spread requests over many pools.
const MaxOldestLookups = 16

// UnservedPools returns the pools that hold requests in JETCREW_RUNS but
// have no workers-<pool> consumer, sorted by pool; the first
// MaxOldestLookups of them with their oldest request's time. Their requests stay
// until the stream's max age removes them, a worker of the pool starts,
// or an operator purges them (nats stream purge JETCREW_RUNS --subject
// jetcrew.runs.<pool>). The error wraps ErrNotProvisioned when the stream
// does not exist.
func (f *Fleet) UnservedPools(ctx context.Context) ([]UnservedPool, error) {
	stream, err := f.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return nil, fmt.Errorf("unserved pools: stream %s: %w", messages.StreamRuns, classify(err))
	}
	served := map[string]bool{}
	names := stream.ConsumerNames(ctx)
	for name := range names.Name() {
		if pool, ok := strings.CutPrefix(name, messages.ConsumerName("")); ok {
			served[pool] = true
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, fmt.Errorf("unserved pools: list consumers: %w", classify(err))
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(messages.SubjectRunsPrefix+".>"))
	if err != nil {
		return nil, fmt.Errorf("unserved pools: stream %s: %w", messages.StreamRuns, classify(err))
	}
	byPool := map[string]*UnservedPool{}
	for subj, n := range info.State.Subjects {
		pool, err := messages.PoolFromSubject(subj)
		if err != nil {
			pool = strings.TrimPrefix(subj, messages.SubjectRunsPrefix+".")
		}
		if served[pool] || n == 0 {
			continue
		}
		p := byPool[pool]
		if p == nil {
			p = &UnservedPool{Pool: pool}
			byPool[pool] = p
		}
		p.Requests += n
	}
	out := make([]UnservedPool, 0, len(byPool))
	for _, p := range byPool {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	for i := range out[:min(len(out), MaxOldestLookups)] {
		p := &out[i]
		for _, subj := range []string{messages.SubjectRuns(p.Pool), messages.SubjectReplay(p.Pool)} {
			if info.State.Subjects[subj] == 0 {
				continue
			}
			m, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subj))
			if err != nil {
				continue // taken or removed meanwhile: Oldest stays unknown
			}
			if p.Oldest.IsZero() || m.Time.Before(p.Oldest) {
				p.Oldest = m.Time.UTC()
			}
		}
		if maxAge := info.Config.MaxAge; maxAge > 0 && !p.Oldest.IsZero() {
			p.Expires = p.Oldest.Add(maxAge)
		}
	}
	return out, nil
}
