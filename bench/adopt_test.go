//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// The adoption benchmark (issue 38): adoptRuns runs of the built-in shell
// profile, each writing adoptLines numbered lines to stdout, one every
// 100 ms; adoptRounds rounds.
const (
	adoptRuns   = 20
	adoptRounds = 3
	adoptLines  = 120
)

// adoptBenchScript is each run's command: numbered lines, one every
// 100 ms, for about 12 s (long enough to be running when the successor
// starts, whatever the cold start of 20 costs on a busy host).
var adoptBenchScript = fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo "line $i"; sleep 0.1; done`, adoptLines)

// adoptSample is what one round measured of one run, in ms: its cold start
// (the first worker's Start call → its started event), its adoption (the
// successor's Start call → its adopted event), the adopted event's gap_ms
// and the gap between the last output event the first worker published
// and the first one its successor published.
type adoptSample struct {
	cold, adopt, gapMS, outputGap float64
}

// TestAdopt measures issue 38's adoption with real Docker and an embedded
// NATS server: adoptRuns requests are queued and a worker (in this
// process, Docker runtime, concurrency adoptRuns) is started: from its
// Start call to each run's started event is the cold start of adoptRuns
// runs, the baseline (what a redelivery pays today, the lost work not
// counted). Once every run has published output for a second, the worker
// is stopped for an upgrade (Worker.Leave, what SIGUSR2 does: its
// heartbeat key is deleted at once), every container still running, and a
// successor on the same engine and state directory is started at once:
// from its Start call to each run's adopted event is its adoption. Every
// run must end succeeded in attempt 1, adopted once, every line of its
// stdout published once and in order.
func TestAdopt(t *testing.T) {
	cli := dockerClient(t)
	s := workertest.StartServer(t)
	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)
	js, err := jetstream.New(workertest.Connect(t, s))
	require.NoError(t, err)
	// The requests are queued before any worker starts.
	_, err = worker.Provision(t.Context(), js, worker.ProvisionConfig{})
	require.NoError(t, err)

	var all []adoptSample
	reps := map[string][]float64{}
	for round := range adoptRounds {
		res := adoptRound(t, cli, s, d, js, round)
		samples := res.samples
		all = append(all, samples...)
		reps["leave"] = append(reps["leave"], round1(res.leave))
		reps["start_cold"] = append(reps["start_cold"], round1(res.startCold))
		reps["start_adopt"] = append(reps["start_adopt"], round1(res.startAdopt))
		for name, f := range map[string]func(adoptSample) float64{
			"cold": func(a adoptSample) float64 { return a.cold }, "adopt": func(a adoptSample) float64 { return a.adopt },
			"gap": func(a adoptSample) float64 { return a.gapMS }, "output": func(a adoptSample) float64 { return a.outputGap },
		} {
			var xs []float64
			for _, a := range samples {
				xs = append(xs, f(a))
			}
			reps[name+"_p50"] = append(reps[name+"_p50"], round1(median(xs)))
			reps[name+"_max"] = append(reps[name+"_max"], round1(slices.Max(xs)))
		}
		t.Logf("round %d: cold start p50 %.0f max %.0f ms; adoption p50 %.0f max %.0f ms; output gap p50 %.0f max %.0f ms; leave %.0f ms; Start %.0f ms (cold), %.0f ms (adopting)",
			round+1, reps["cold_p50"][round], reps["cold_max"][round], reps["adopt_p50"][round], reps["adopt_max"][round],
			reps["output_p50"][round], reps["output_max"][round], res.leave, res.startCold, res.startAdopt)
	}
	recordAdopt(t, reps, len(all))
}

// recordAdopt records the adoption figures: each the median over the
// rounds of that round's p50 or max over its adoptRuns runs (reps, by
// key), n samples in all, or of that round's one value.
func recordAdopt(t *testing.T, reps map[string][]float64, n int) {
	fig := func(name, key, baseline, what string) {
		record(t, name, Figure{Value: round1(median(reps[key])), Unit: "ms", Baseline: baseline, Samples: n, Repeats: reps[key], What: what})
	}
	how := fmt.Sprintf("%d runs of the built-in shell profile (coordination on), each writing a numbered line every 100 ms; a worker in this process, Docker runtime, concurrency %d; the median over %d rounds of each round's", adoptRuns, adoptRuns, adoptRounds)
	fig("cold_start20_p50_ms", "cold_p50", "", fmt.Sprintf("cold start of %d runs, today's path (what a redelivery pays, the lost work not counted): the %d requests queued, then a fresh worker started; its Start call → each run's `started` event; %s p50", adoptRuns, adoptRuns, how))
	fig("cold_start20_max_ms", "cold_max", "", "as cold_start20_p50_ms, the last of the 20 to start")
	fig("adopt20_p50_ms", "adopt_p50", "cold_start20_p50_ms", fmt.Sprintf("issue 38: the same %d runs left running by their worker stopped for an upgrade (Worker.Leave, what SIGUSR2 does: its heartbeat key deleted at once), a successor started at once on the same engine and state directory; its Start call → each run's `adopted` event (the container proved the run's, the record fenced, the request read back, the stages' parts taken over, the output re-attached); %s p50", adoptRuns, how))
	fig("adopt20_max_ms", "adopt_max", "cold_start20_max_ms", "as adopt20_p50_ms, the last of the 20 to be adopted")
	fig("adopt20_output_gap_p50_ms", "output_p50", "cold_start20_p50_ms", "the output gap a watcher saw: the last output event the stopped worker stored → the first its successor stored (stream timestamps), across the stop (Leave), the successor's start and the adoption; p50 over the 20 runs; no line lost, none twice")
	fig("adopt20_output_gap_max_ms", "output_max", "cold_start20_max_ms", "as adopt20_output_gap_p50_ms, the largest of the 20")
	fig("adopt20_record_gap_p50_ms", "gap_p50", "", "the adopted event's gap_ms: the stopped worker's last write of the run's record (at Leave) → the successor's fence of it; p50 over the 20 runs")
	fig("adopt20_record_gap_max_ms", "gap_max", "", "as adopt20_record_gap_p50_ms, the largest of the 20")
	once := func(name, key, baseline, what string) {
		record(t, name, Figure{Value: round1(median(reps[key])), Unit: "ms", Baseline: baseline, Samples: len(reps[key]), Repeats: reps[key], What: what})
	}
	once("adopt20_leave_ms", "leave", "", fmt.Sprintf("Worker.Leave of the worker holding the %d runs, until it returned (each run's record written once, in-process parts released, the containers left running, the heartbeat key deleted); median over the rounds", adoptRuns))
	once("cold_start20_worker_start_ms", "start_cold", "", fmt.Sprintf("the first worker's Start call → its return, %d requests queued (state directory, stages, heartbeat, the reconciler's first pass, the puller started; no run started yet); median over the rounds", adoptRuns))
	once("adopt20_worker_start_ms", "start_adopt", "cold_start20_worker_start_ms", fmt.Sprintf("the successor's Start call → its return, %d runs orphaned: as cold_start20_worker_start_ms, and the adoption pass (each run proved, fenced and its take-over spawned; the adopted events follow); median over the rounds", adoptRuns))
}

func round1(v float64) float64 { return round(v, 1) }

// adoptRoundResult is what one round of TestAdopt measured: each run's
// sample, and in ms how long the first worker's Leave took and each
// worker's Start call until it returned.
type adoptRoundResult struct {
	samples                      []adoptSample
	leave, startCold, startAdopt float64
}

// adoptRound runs one round of TestAdopt.
func adoptRound(t *testing.T, cli *client.Client, s *server.Server, d *dispatcher.Dispatcher, js jetstream.JetStream, round int) adoptRoundResult {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	prefix := fmt.Sprintf("bench-adopt-%s-%d", hex.EncodeToString(suffix), round)
	var ids []string
	for i := range adoptRuns {
		id, err := d.Submit(ctx, messages.RunRequest{ID: fmt.Sprintf("%s-%02d", prefix, i), Profile: "shell", Prompt: adoptBenchScript})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	stateDir := workertest.StateDir(t)
	var res adoptRoundResult
	first, firstStart, took := adoptWorker(t, s, prefix+"-first", stateDir)
	res.startCold = ms(took)
	for _, id := range ids {
		require.Eventually(t, func() bool {
			st, err := d.Status(ctx, id)
			return err == nil && st.State == messages.StateRunning
		}, time.Minute, 20*time.Millisecond, "run %s never ran", id)
	}
	time.Sleep(time.Second) // output published by the first worker
	leaveBegan := time.Now()
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, first.Leave(lctx))
	lcancel()
	res.leave = ms(time.Since(leaveBegan))
	running := filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+prefix+"-first"), filters.Arg("status", "running"))
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: running})
	require.NoError(t, err)
	require.Len(t, cs, adoptRuns, "every run's container runs on after Leave")

	second, secondStart, took := adoptWorker(t, s, prefix+"-second", stateDir)
	res.startAdopt = ms(took)
	for _, id := range ids {
		var st messages.RunState
		require.Eventually(t, func() bool {
			st, err = d.Status(ctx, id)
			return err == nil && st.State.Final()
		}, time.Minute, 50*time.Millisecond, "run %s never ended", id)
		require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", id, st.Reason)
		require.Equal(t, 1, st.Attempts, id)
		require.Equal(t, 1, st.Adoptions, id)
		require.Equal(t, prefix+"-second", st.Worker, id)
		res.samples = append(res.samples, adoptMeasure(t, js, id, firstStart, secondStart))
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, second.Stop(sctx))
	scancel()
	waitGone(t, cli, filters.NewArgs(filters.Arg("label", jail.LabelWorker+"="+prefix+"-first")))
	return res
}

// adoptWorker starts a worker id (Docker runtime, concurrency adoptRuns,
// state directory dir) on s and returns it, when its Start was called and
// how long Start took. A cleanup stops it, a no-op once it left or
// stopped.
func adoptWorker(t *testing.T, s *server.Server, id, dir string) (*worker.Worker, time.Time, time.Duration) {
	t.Helper()
	rt, err := docker.New(context.Background(), docker.Config{})
	require.NoError(t, err)
	w, err := worker.New(workertest.Connect(t, s), worker.Config{ID: id, Runtime: rt, Concurrency: adoptRuns,
		StateDir: dir, BridgePath: binary(t, "jetcrew-bridge")})
	require.NoError(t, err)
	began := time.Now()
	require.NoError(t, w.Start(context.Background()))
	took := time.Since(began)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
		_ = rt.Close()
	})
	return w, began, took
}

// adoptMeasure reads run id's events and returns its sample: its started
// event after firstStart, its adopted event after secondStart, the
// adopted event's gap_ms, and the gap in its output events' stream
// timestamps around secondStart. It fails unless its stdout is every line
// once, in order.
func adoptMeasure(t *testing.T, js jetstream.JetStream, id string, firstStart, secondStart time.Time) adoptSample {
	t.Helper()
	var a adoptSample
	var stdout strings.Builder
	var lastBefore, firstAfter time.Time
	adopted := 0
	for _, m := range workertest.Events(t, js, id) {
		typ := messages.EventType(m.Subject()[strings.LastIndexByte(m.Subject(), '.')+1:])
		var ev messages.Event
		switch typ {
		case messages.EventOutput:
			if m.Headers().Get(messages.HeaderStream) == messages.StreamStdout {
				stdout.Write(m.Data())
			}
			meta, err := m.Metadata()
			require.NoError(t, err)
			if meta.Timestamp.Before(secondStart) {
				lastBefore = meta.Timestamp
			} else if firstAfter.IsZero() {
				firstAfter = meta.Timestamp
			}
			continue
		case messages.EventStarted, messages.EventAdopted:
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
		default:
			continue
		}
		if typ == messages.EventStarted {
			a.cold = ms(ev.Time.Sub(firstStart))
			continue
		}
		adopted++
		a.adopt, a.gapMS = ms(ev.Time.Sub(secondStart)), float64(ev.GapMS)
	}
	require.Equal(t, 1, adopted, "%s: one adopted event", id)
	require.Positive(t, a.cold, "%s: a started event", id)
	var want strings.Builder
	for i := range adoptLines {
		fmt.Fprintf(&want, "line %d\n", i+1)
	}
	require.Equal(t, want.String(), stdout.String(), "%s: every line once, in order", id)
	require.False(t, lastBefore.IsZero() || firstAfter.IsZero(), "%s: output published before the successor started and after", id)
	a.outputGap = ms(firstAfter.Sub(lastBefore))
	return a
}
