package docker

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/jail"
)

// script builds a shell script together with the exact bytes it writes to
// each stream.
type script struct {
	sh             strings.Builder
	stdout, stderr bytes.Buffer
}

// out adds a printf of p to stdout, every byte an octal escape, so CR,
// invalid UTF-8 and '%' pass through the shell unchanged.
func (s *script) out(p string) { s.printf(p, ""); s.stdout.WriteString(p) }

// err adds a printf of p to stderr.
func (s *script) err(p string) { s.printf(p, " >&2"); s.stderr.WriteString(p) }

func (s *script) printf(p, redirect string) {
	s.sh.WriteString("printf '")
	for _, b := range []byte(p) {
		fmt.Fprintf(&s.sh, "\\%03o", b)
	}
	s.sh.WriteString("'" + redirect + "\n")
}

// longLine adds a line of n bytes 'x' without a newline to stdout (fd 1)
// or stderr (fd 2): longer than the engine's 16 KiB log messages.
func (s *script) longLine(fd, n int) {
	fmt.Fprintf(&s.sh, "head -c %d /dev/zero | tr '\\0' x >&%d\n", n, fd)
	if fd == 1 {
		s.stdout.WriteString(strings.Repeat("x", n))
	} else {
		s.stderr.WriteString(strings.Repeat("x", n))
	}
}

// interleave adds n lines to each stream in turn, slowly.
func (s *script) interleave(tag string, n int) {
	for i := range n {
		s.out(fmt.Sprintf("%s-out%d\r\n", tag, i))
		s.err(fmt.Sprintf("%s-err%d\n", tag, i))
		s.sh.WriteString("usleep 2000\n")
	}
}

// awaitSignal adds a wait for the phase'th SIGUSR1 (see the trap in
// adoptScript).
func (s *script) awaitSignal(phase int) {
	fmt.Fprintf(&s.sh, "while [ $phase -lt %d ]; do sleep 0.05; done\n", phase)
}

// adoptScript is the process of TestDockerAdopt in three phases, each
// started by a SIGUSR1 after the first: A while the first runtime is
// attached, B while no one is, C while the adopting runtime follows. It
// returns the script and what phases A and B write to each stream.
func adoptScript() (s *script, aOut, aErr, abOut string) {
	s = &script{}
	s.sh.WriteString("phase=0; trap 'phase=$((phase+1))' USR1\n")
	s.interleave("a", 20)
	s.out("ready-a\n")
	aOut, aErr = s.stdout.String(), s.stderr.String()
	s.awaitSignal(1)
	s.interleave("b", 10)
	s.longLine(1, 40<<10)         // 40 KiB without a newline...
	s.err("\xff\xfe\rbad-utf8\r") // ...meanwhile invalid UTF-8 and CRs on stderr
	s.out("\n\r\r\n")
	s.err("\n")
	s.interleave("b2", 10)
	s.out("done-b\n")
	abOut = s.stdout.String()
	s.awaitSignal(2)
	s.interleave("c", 10)
	s.longLine(2, 40<<10)
	s.out("tail without a newline \xc3")
	s.sh.WriteString("exit 7\n")
	return s, aOut, aErr, abOut
}

// requireSameBytes fails the test when got is not want, showing where
// they part (not the whole of outputs of 100 KiB).
func requireSameBytes(t *testing.T, want, got, what string) {
	t.Helper()
	if got == want {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Fatalf("%s: %d bytes, want %d; from byte %d got %q, want %q", what, len(got), len(want), i,
		got[i:min(len(got), i+60)], want[i:min(len(want), i+60)])
}

// eventually polls cond every 10 ms for up to 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(10 * time.Millisecond)
	}
}

// loggedStdout returns what the engine's log of container id holds of
// stdout now.
func loggedStdout(t *testing.T, rt *Runtime, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs, err := rt.cli.ContainerLogs(ctx, id, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	require.NoError(t, err)
	defer logs.Close()
	rec := &recorder{}
	repair := newNewlineRepair(rec.output)
	require.NoError(t, demux(logs, repair.output, repair.endFrame))
	return rec.Stdout()
}

// freshRuntime returns a Runtime of its own, as the next worker process
// would make.
func freshRuntime(t *testing.T) *Runtime {
	t.Helper()
	newDockerRuntime(t) // the engine answers, the image exists
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, err := New(ctx, Config{Logger: zerolog.Nop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	return rt
}

// TestDockerAdopt: a container started by one runtime, which detaches
// from it as a dying worker's process would (its output stream closed),
// runs on and writes while no one is attached; a fresh runtime adopts it
// and gets every byte of each stream the process wrote since it started,
// exactly (CRs, invalid UTF-8, 40 KiB lines without a newline, a last
// line without one), then follows it to its exit code; what it found is
// the container's. Adopted again once it has exited, it passes its whole
// log and its status at once; removed, it is not found.
func TestDockerAdopt(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)
	ctx := context.Background()

	vol := "jetcrew-test-" + randomSuffix(t) + "-ws"
	require.NoError(t, rt.CreateVolume(ctx, jail.VolumeSpec{Name: vol, SizeBytes: 1 << 20, UID: 65532, GID: 65532}))
	t.Cleanup(func() { _ = rt.RemoveVolume(context.Background(), vol) })
	dir := t.TempDir()

	s, aOut, aErr, abOut := adoptScript()
	spec := sandboxSpec(t, rt, s.sh.String())
	spec.OutputLogBytes = 8 << 20
	spec.Mounts = []jail.Mount{{Source: dir, Target: "/in", ReadOnly: true}, {Source: vol, Volume: true, Target: "/ws"}}
	c1, rec1 := start(t, rt, spec)
	eventually(t, "phase A through attach", func() bool { return rec1.Stdout() == aOut && rec1.Stderr() == aErr })

	// The first worker goes away: the process runs on.
	require.NoError(t, c1.Detach(ctx))
	_, err := c1.Wait(ctx)
	require.ErrorIs(t, err, jail.ErrDetached)
	require.NoError(t, c1.Signal(ctx, "SIGUSR1"))
	eventually(t, "phase B in the engine's log", func() bool { return loggedStdout(t, rt, c1.ID()) == abOut })

	rt2 := freshRuntime(t)
	rec2 := &recorder{}
	c2, found, err := rt2.Adopt(ctx, c1.ID(), rec2.output)
	require.NoError(t, err)
	require.Equal(t, c1.ID(), c2.ID())
	require.Equal(t, c1.ImageID(), c2.ImageID())
	require.Equal(t, c1.ID(), found.ID)
	require.Equal(t, spec.Name, found.Name)
	require.NotEmpty(t, found.ImageID)
	require.Equal(t, c1.ImageID(), found.ImageID)
	require.Equal(t, spec.Labels[jail.LabelRunID], found.Labels[jail.LabelRunID])
	require.Equal(t, "true", found.Labels[jail.LabelManaged])
	require.True(t, found.Running)
	require.WithinDuration(t, time.Now(), found.StartedAt, time.Minute)
	require.Zero(t, found.Status)
	mounts := slices.SortedFunc(slices.Values(found.Mounts), func(a, b jail.Mount) int { return strings.Compare(a.Target, b.Target) })
	require.Equal(t, []jail.Mount{
		{Source: filepath.Clean(dir), Target: "/in", ReadOnly: true},
		{Source: vol, Volume: true, Target: "/ws"},
	}, mounts)

	eventually(t, "phases A and B through the adopted log", func() bool { return rec2.Stdout() == abOut })
	require.NoError(t, c2.Signal(ctx, "SIGUSR1"))
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err := c2.Wait(wctx)
	require.NoError(t, err)
	require.Equal(t, jail.ExitStatus{Code: 7}, st)
	requireSameBytes(t, s.stdout.String(), rec2.Stdout(), "every stdout byte since the start, exactly")
	requireSameBytes(t, s.stderr.String(), rec2.Stderr(), "every stderr byte since the start, exactly")
	requireSameBytes(t, aOut, rec1.Stdout(), "nothing reached the detached container's OutputFunc")
	requireSameBytes(t, aErr, rec1.Stderr(), "nothing reached the detached container's OutputFunc")

	// Adopted once it has exited: the whole log, the status at once.
	rec3 := &recorder{}
	began := time.Now()
	c3, found, err := freshRuntime(t).Adopt(ctx, spec.Name, rec3.output)
	require.NoError(t, err)
	require.False(t, found.Running)
	require.Equal(t, jail.ExitStatus{Code: 7}, found.Status)
	st, err = c3.Wait(wctx)
	require.NoError(t, err)
	require.Equal(t, jail.ExitStatus{Code: 7}, st)
	require.Less(t, time.Since(began), 10*time.Second)
	requireSameBytes(t, s.stdout.String(), rec3.Stdout(), "stdout of the exited container")
	requireSameBytes(t, s.stderr.String(), rec3.Stderr(), "stderr of the exited container")

	require.NoError(t, c3.Remove(ctx))
	_, _, err = rt2.Adopt(ctx, c1.ID(), nil)
	require.ErrorIs(t, err, jail.ErrNotFound)
	require.ErrorIs(t, err, jail.ErrPermanent)
}

// TestDockerAdoptRefused: a container that does not exist is not found; one
// whose engine keeps no log (no OutputLogBytes) or that was never started
// is refused, with what was found of it.
func TestDockerAdoptRefused(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)
	ctx := context.Background()

	_, _, err := rt.Adopt(ctx, "jetcrew-test-"+randomSuffix(t)+"-missing", nil)
	require.ErrorIs(t, err, jail.ErrNotFound)

	c, rec := start(t, rt, sandboxSpec(t, rt, "echo lost; sleep 30"))
	waitForOutput(t, rec, "lost\n")
	_, found, err := rt.Adopt(ctx, c.ID(), nil)
	require.ErrorIs(t, err, jail.ErrNoOutputLog)
	require.ErrorIs(t, err, jail.ErrPermanent)
	require.Equal(t, c.ID(), found.ID)
	require.True(t, found.Running)

	spec := sandboxSpec(t, rt, "echo never")
	spec.OutputLogBytes = 1 << 20
	cfg, host, netCfg, err := containerConfig(spec)
	require.NoError(t, err)
	created, err := rt.cli.ContainerCreate(ctx, cfg, host, netCfg, nil, spec.Name)
	require.NoError(t, err)
	_, found, err = rt.Adopt(ctx, created.ID, nil)
	require.ErrorIs(t, err, jail.ErrNotStarted)
	require.Equal(t, spec.Name, found.Name)
	require.False(t, found.Running)
	require.True(t, found.StartedAt.IsZero())
}

// TestDockerAdoptRotated: past OutputLogBytes the oldest output rotates
// out; what Adopt passes is then the end of what the process wrote, whole
// lines kept in order.
func TestDockerAdoptRotated(t *testing.T) {
	t.Parallel()
	rt := newDockerRuntime(t)
	ctx := context.Background()

	spec := sandboxSpec(t, rt, `i=0; while [ $i -lt 4000 ]; do echo "line $i of the output"; i=$((i+1)); done`)
	spec.OutputLogBytes = 32 << 10
	st, rec := run(t, rt, spec)
	require.Equal(t, 0, st.Code)

	kept := &recorder{}
	c, _, err := freshRuntime(t).Adopt(ctx, spec.Name, kept.output)
	require.NoError(t, err)
	_, err = c.Wait(ctx)
	require.NoError(t, err)
	all, tail := rec.Stdout(), kept.Stdout()
	require.NotEmpty(t, tail)
	require.Less(t, len(tail), 32<<10, "at most the bound is kept")
	require.Greater(t, len(tail), 8<<10, "the newest files are kept")
	require.True(t, strings.HasSuffix(all, tail), "the newest output, in order")
	require.True(t, strings.HasPrefix(tail, "line "), "rotation drops whole lines")
}
