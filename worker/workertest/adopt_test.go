package workertest_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// recorder collects each stream's output.
type recorder struct {
	mu          sync.Mutex
	out, errOut strings.Builder
}

func (r *recorder) output(stream string, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stream == messages.StreamStdout {
		r.out.Write(p)
	} else {
		r.errOut.Write(p)
	}
}

func (r *recorder) streams() (stdout, stderr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String(), r.errOut.String()
}

// requireOutput waits up to 10 s for rec to hold stdout and stderr.
func requireOutput(t *testing.T, rec *recorder, stdout, stderr string) {
	t.Helper()
	require.Eventually(t, func() bool {
		o, e := rec.streams()
		return o == stdout && e == stderr
	}, 10*time.Second, time.Millisecond, "want %q and %q", stdout, stderr)
}

// phased writes a phase of output on both streams, then waits for the
// next value on go, three times, and exits 7.
func phased(next <-chan struct{}) workertest.Behaviour {
	return func(ctx context.Context, _ jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
		for i, phase := range []string{"a", "b", "c"} {
			if i > 0 {
				select {
				case <-next:
				case <-ctx.Done():
					return jail.ExitStatus{Code: 143}
				}
			}
			out(messages.StreamStdout, []byte(phase+"-out\r\n"))
			out(messages.StreamStderr, []byte(phase+"-err \xff"))
		}
		return jail.ExitStatus{Code: 7}
	}
}

// TestAdopt: a fake container outlives the Container Start returned (its
// ctx ended, its Wait's ctx ended, detached); while detached it writes on,
// and Start's OutputFunc sees none of it; an Adopt on the same Runtime by
// id gets all of its output from the start, then follows it, and its
// Wait returns the exit code. Adopted again after the exit (by name), it
// passes the whole log and its status at once; removed, it is not found.
func TestAdopt(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	next := make(chan struct{})
	rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) { return phased(next), nil }
	spec := jail.ContainerSpec{Name: "jetcrew-r1-1-1", Cmd: []string{"agent"}, OutputLogBytes: 1 << 20,
		Labels: map[string]string{jail.LabelRunID: "r1"},
		Mounts: []jail.Mount{{Source: "/srv/run", Target: "/run/jetcrew", ReadOnly: true}}}

	ctx, cancel := context.WithCancel(context.Background())
	rec1 := &recorder{}
	c1, err := rt.Start(ctx, spec, rec1.output)
	require.NoError(t, err)
	cancel()
	requireOutput(t, rec1, "a-out\r\n", "a-err \xff")
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer wcancel()
	_, err = c1.Wait(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c1.Detach(context.Background()))
	_, err = c1.Wait(context.Background())
	require.ErrorIs(t, err, jail.ErrDetached)

	next <- struct{}{} // phase b, while no one is attached
	rec2 := &recorder{}
	c2, found, err := rt.Adopt(context.Background(), c1.ID(), rec2.output)
	require.NoError(t, err)
	require.Equal(t, jail.Found{ID: c1.ID(), Name: spec.Name, Labels: spec.Labels, Running: true,
		StartedAt: found.StartedAt, Mounts: spec.Mounts}, found)
	require.WithinDuration(t, time.Now(), found.StartedAt, time.Minute)
	requireOutput(t, rec2, "a-out\r\nb-out\r\n", "a-err \xffb-err \xff")
	next <- struct{}{} // phase c, followed
	st, err := c2.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, jail.ExitStatus{Code: 7}, st)
	o, e := rec2.streams()
	require.Equal(t, "a-out\r\nb-out\r\nc-out\r\n", o)
	require.Equal(t, "a-err \xffb-err \xffc-err \xff", e)
	o, e = rec1.streams()
	require.Equal(t, "a-out\r\n", o, "nothing reached the detached Container's OutputFunc")
	require.Equal(t, "a-err \xff", e)

	rec3 := &recorder{}
	c3, found, err := rt.Adopt(context.Background(), spec.Name, rec3.output)
	require.NoError(t, err)
	require.False(t, found.Running)
	require.Equal(t, jail.ExitStatus{Code: 7}, found.Status)
	wctx2, wcancel2 := context.WithTimeout(context.Background(), time.Second)
	defer wcancel2()
	st, err = c3.Wait(wctx2)
	require.NoError(t, err)
	require.Equal(t, jail.ExitStatus{Code: 7}, st)
	o, e = rec3.streams()
	require.Equal(t, "a-out\r\nb-out\r\nc-out\r\n", o)
	require.Equal(t, "a-err \xffb-err \xffc-err \xff", e)

	require.NoError(t, c3.Remove(context.Background()))
	_, _, err = rt.Adopt(context.Background(), c1.ID(), nil)
	require.ErrorIs(t, err, jail.ErrNotFound)
	require.ErrorIs(t, err, jail.ErrPermanent)
}

// TestAdoptScriptKeepsRunning: a script container (`out hello;sleep 1h`)
// runs on when Start's ctx and its Wait's ctx end and after Detach; an
// adopter sees its output, stops it, and its Wait returns 143.
func TestAdoptScriptKeepsRunning(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	ctx, cancel := context.WithCancel(context.Background())
	c1, err := rt.Start(ctx, jail.ContainerSpec{Name: "s", Cmd: []string{"sh", "-c", "out hello;err world;sleep 1h"}, OutputLogBytes: 1 << 10},
		func(string, []byte) {})
	require.NoError(t, err)
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer wcancel()
	_, err = c1.Wait(wctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c1.Detach(context.Background()))
	list, err := rt.ListManaged(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "running", list[0].State)

	rec := &recorder{}
	c2, found, err := rt.Adopt(context.Background(), c1.ID(), rec.output)
	require.NoError(t, err)
	require.True(t, found.Running)
	requireOutput(t, rec, "hello\n", "world\n")
	require.NoError(t, c2.Stop(context.Background(), time.Second))
	st, err := c2.Wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, 143, st.Code)
	require.NoError(t, c2.Remove(context.Background()))
}

// TestAdoptOutputLog: without OutputLogBytes nothing is kept and the
// container cannot be adopted; past it the oldest writes are dropped.
func TestAdoptOutputLog(t *testing.T) {
	t.Parallel()
	rt := workertest.NewTestRuntime(t)
	c, err := rt.Start(context.Background(), jail.ContainerSpec{Name: "none", Cmd: []string{"out lost"}}, nil)
	require.NoError(t, err)
	_, err = c.Wait(context.Background())
	require.NoError(t, err)
	_, found, err := rt.Adopt(context.Background(), c.ID(), nil)
	require.ErrorIs(t, err, jail.ErrNoOutputLog)
	require.Equal(t, "none", found.Name)

	c, err = rt.Start(context.Background(), jail.ContainerSpec{Name: "small", Cmd: []string{"out 1111;out 2222;out 3333;out 4444"}, OutputLogBytes: 10}, nil)
	require.NoError(t, err)
	_, err = c.Wait(context.Background())
	require.NoError(t, err)
	rec := &recorder{}
	a, _, err := rt.Adopt(context.Background(), "small", rec.output)
	require.NoError(t, err)
	_, err = a.Wait(context.Background())
	require.NoError(t, err)
	o, _ := rec.streams()
	require.Equal(t, "3333\n4444\n", o, "the last 10 bytes, whole writes")
}
