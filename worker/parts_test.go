package worker

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordingPart records its starts and stops in log, and fails its Start
// or Stop with the errors set.
type recordingPart struct {
	name              string
	log               *[]string
	startErr, stopErr error
}

func (p *recordingPart) Start(context.Context) error {
	*p.log = append(*p.log, "start "+p.name)
	return p.startErr
}

func (p *recordingPart) Stop(context.Context) error {
	*p.log = append(*p.log, "stop "+p.name)
	return p.stopErr
}

// TestLifecycleOrder: parts start in their declared order and stop in
// the reverse order, each stopped whatever the others returned, their
// errors joined; a second stop has nothing to stop.
func TestLifecycleOrder(t *testing.T) {
	t.Parallel()
	var log []string
	l := lifecycle{}
	for _, name := range []string{"a", "b", "c"} {
		p := &recordingPart{name: name, log: &log}
		if name == "b" {
			p.stopErr = errors.New("b would not stop")
		}
		if name == "a" {
			p.stopErr = context.DeadlineExceeded
		}
		l.parts = append(l.parts, namedPart{name, p})
	}
	require.NoError(t, l.start(context.Background()))
	require.Equal(t, []string{"start a", "start b", "start c"}, log)
	log = nil
	err := l.stop(context.Background())
	require.Equal(t, []string{"stop c", "stop b", "stop a"}, log)
	require.ErrorContains(t, err, "b would not stop")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	log = nil
	require.NoError(t, l.stop(context.Background()))
	require.Empty(t, log)
}

// TestLifecycleFailedStart: a part whose Start fails stops the parts
// started before it, in reverse, and none after it starts; it is not
// stopped itself.
func TestLifecycleFailedStart(t *testing.T) {
	t.Parallel()
	var log []string
	l := lifecycle{}
	for _, name := range []string{"a", "b", "c", "d"} {
		p := &recordingPart{name: name, log: &log}
		if name == "c" {
			p.startErr = errors.New("c cannot start")
		}
		l.parts = append(l.parts, namedPart{name, p})
	}
	require.ErrorContains(t, l.start(context.Background()), "c cannot start")
	require.Equal(t, []string{"start a", "start b", "start c", "stop b", "stop a"}, log)
	log = nil
	require.NoError(t, l.stop(context.Background()))
	require.Empty(t, log, "what the failed start stopped is not stopped again")
}

// TestHooksAndMade: a part of functions calls them (nil ones do nothing);
// a part the stages make is looked up when it starts and stops.
func TestHooksAndMade(t *testing.T) {
	t.Parallel()
	var log []string
	require.NoError(t, hooks{}.Start(context.Background()))
	require.NoError(t, hooks{}.Stop(context.Background()))
	h := hooks{start: func(context.Context) error { log = append(log, "h start"); return nil },
		stop: func(context.Context) error { log = append(log, "h stop"); return nil }}
	require.NoError(t, h.Start(context.Background()))
	require.NoError(t, h.Stop(context.Background()))
	var later part
	m := made(func() part { return later })
	later = &recordingPart{name: "made", log: &log}
	require.NoError(t, m.Start(context.Background()))
	require.NoError(t, m.Stop(context.Background()))
	require.Equal(t, []string{"h start", "h stop", "start made", "stop made"}, log)
}

// TestWorkerPartsOrder: the worker's declared order, which its drain
// depends on (docs/operations.md, "Shutdown and drain"): stopped in
// reverse, fetching stops first, then the warm pool, then the runs in
// flight are waited for (or handed back), and only then the rest, the
// workers bucket's key last. Orphaned runs are adopted once fetching runs
// (the puller runs adopted runs), and the stages' leftovers swept only
// after that, so an adoptable run's directory is never swept. The crash,
// drain and adoption tests prove the behaviour; this pins the list they
// prove it of.
func TestWorkerPartsOrder(t *testing.T) {
	t.Parallel()
	w := &Worker{cfg: Config{ID: "w1", Concurrency: 1}}
	var names []string
	for _, p := range w.parts() {
		names = append(names, p.name)
	}
	require.Equal(t, []string{
		"presence", "state directory", "stages", "heartbeat", "reconciler", "dead-letterer",
		"cancel listener", "egress proxies", "workspaces", "runs in flight", "warm pool", "fetching",
		"adoption", "sweeper",
	}, names)
}
