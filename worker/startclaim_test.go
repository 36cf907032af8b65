package worker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// gate blocks a worker at one point until the test opens it.
type gate struct {
	reached, open chan struct{}
	once          sync.Once
}

func newGate() *gate { return &gate{reached: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) wait() {
	g.once.Do(func() { close(g.reached) })
	<-g.open
}

// TestCancelBeforeStartNeverStarts, cancel first:
// a cancel that lands after the worker claimed the run but before its
// container is created is answered "will not run", and no container of the
// run is ever created; the run ends cancelled with no output.
func TestCancelBeforeStartNeverStarts(t *testing.T) {
	t.Parallel()
	g := newGate()
	b := setup(t, func(c *worker.Config) {
		c.Failpoint = func(name string) {
			if name == stage.FailpointBeforeStart {
				g.wait()
			}
		}
	})
	b.submit(t, messages.RunRequest{ID: "race1", Profile: "shell", Prompt: "out tick; sleep 1h"})
	select {
	case <-g.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never reached the start")
	}
	r := b.cancel(t, "race1")
	require.Equal(t, messages.CancelQueued, r.Result, r.Message)
	require.Contains(t, r.Message, "will not run")
	close(g.open)

	st := b.waitFinal(t, "race1")
	require.Equal(t, messages.StateCancelled, st.State)
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Empty(t, b.rt.Starts(), "no container of a run answered \"will not run\" is created")
	require.Empty(t, output(b.events(t, "race1"), messages.StreamStdout))
}

// TestCancelWhileCreatingStops, start first: a
// cancel that lands while the container is being created finds the run
// running and is answered "stopping" (never "will not run"); the container
// is stopped as soon as it exists and the run ends cancelled.
func TestCancelWhileCreatingStops(t *testing.T) {
	t.Parallel()
	g := newGate()
	b := setup(t, nil)
	b.rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
		g.wait() // the engine is slow to create the container
		return workertest.ScriptBehaviour(spec)
	}
	b.submit(t, messages.RunRequest{ID: "race2", Profile: "shell", Prompt: "out tick; sleep 1h"})
	select {
	case <-g.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never started creating the container")
	}
	r := b.cancel(t, "race2")
	require.Equal(t, messages.CancelStopping, r.Result, r.Message)
	close(g.open)

	st := b.waitFinal(t, "race2")
	require.Equal(t, messages.StateCancelled, st.State)
	require.Equal(t, 143, *st.ExitCode, "stopped, not run to its end")
	require.Eventually(t, func() bool { return b.rt.Live() == 0 }, 5*time.Second, 10*time.Millisecond)
}
