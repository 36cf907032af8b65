//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// Sizes of the throughput benchmark.
const (
	noopConcurrency = 16   // worker slots; also the raw loop's pullers
	noopSubmitters  = 8    // goroutines submitting; also the raw loop's publishers
	noopWarmup      = 100  // runs (or messages) before the clock starts
	noopRuns        = 1000 // coordination on
	noopNocoordRuns = 5000 // coordination off
	rawMsgs         = 15000

	// On the three-node cluster (R3): fewer, as each step is a Raft commit.
	r3Runs        = 200
	r3NocoordRuns = 1500
	r3RawMsgs     = 5000

	// Every throughput is measured reps times in a row; the figure is the
	// median, the Repeats field has them all.
	reps = 3
)

// bed is where a throughput benchmark runs: a way to connect to the
// server(s), and the replica count of every stream.
type bed struct {
	connect  func(t *testing.T) *nats.Conn
	replicas int
	label    string // for logs and profile file names
}

// singleServer is one embedded server, R1.
func singleServer(t *testing.T) bed {
	s := workertest.StartServer(t)
	return bed{connect: func(t *testing.T) *nats.Conn { return workertest.Connect(t, s) }, replicas: 1, label: "r1"}
}

// threeNodeCluster is three embedded servers in a JetStream cluster, R3;
// connections spread over the nodes.
func threeNodeCluster(t *testing.T) bed {
	c := workertest.StartCluster(t, 3)
	var n atomic.Int64
	return bed{connect: func(t *testing.T) *nats.Conn {
		urls := c.URLs()
		// Rotate the URL list so that connections land on different nodes.
		parts := strings.Split(urls, ",")
		k := int(n.Add(1)) % len(parts)
		nc, err := nats.Connect(strings.Join(append(parts[k:], parts[:k]...), ","), nats.DontRandomize())
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc
	}, replicas: 3, label: "r3"}
}

// noopBehaviour is a container that exits 0 at once, writing nothing.
func noopBehaviour(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
	return jail.ExitStatus{}
}

// TestNoopThroughput measures runs per second through the whole path —
// dispatcher.Submit (publish) → JETCREW_RUNS → a worker's pull → claim
// (the queued state created), running and final states in jetcrew-runs, started and finished
// events on JETCREW_EVENTS, ack — with a runtime whose containers exit at
// once, against a bare JetStream loop with the same shape on the same
// embedded server: publishers doing synchronous publishes, pullers each
// fetching one message at a time and double-acking it. The three loops take
// turns, reps times, so a change in the machine's load hits them alike.
func TestNoopThroughput(t *testing.T) {
	b := singleServer(t)
	throughput(t, b, rawMsgs, noopRuns, noopNocoordRuns, "",
		fmt.Sprintf("bare JetStream: %d publishers (sync publish, ~200 B) → WorkQueue file stream → %d pullers (fetch 1, double ack), same embedded server", noopSubmitters, noopConcurrency),
		fmt.Sprintf("dispatcher.Submit (id generated) → JETCREW_RUNS → worker (concurrency %d) → states + events → ack; runtime: workertest.Runtime, container exits at once; built-in `shell` profile (coordination on: run dir, socket, inbox consumer, presence per run); %d submitters", noopConcurrency, noopSubmitters),
		"as noop_runs_per_s with coordination off in the profile: the run lifecycle alone")
}

// TestNoopThroughputCluster is TestNoopThroughput on a three-node JetStream
// cluster with every stream, bucket and consumer at three replicas, as
// deploy/compose runs it: the cost of scale-out's replication.
func TestNoopThroughputCluster(t *testing.T) {
	b := threeNodeCluster(t)
	throughput(t, b, r3RawMsgs, r3Runs, r3NocoordRuns, "r3_",
		"raw_js_msgs_per_s on a three-node embedded cluster, stream and consumer R3",
		"noop_runs_per_s on the three-node cluster, everything R3 (coordination on)",
		"noop_nocoord_runs_per_s on the three-node cluster, everything R3")
}

// throughput measures the raw loop, the bare run plan and the noop runs
// with coordination on and off, in turns, reps times, and records the
// medians as raw_js_<infix>msgs_per_s, raw_js_<infix>runplan_runs_per_s,
// noop_<infix>runs_per_s and noop_<infix>nocoord_runs_per_s.
func throughput(t *testing.T, b bed, nRaw, nRuns, nNocoord int, infix, rawWhat, coordWhat, nocoordWhat string) {
	t.Helper()
	raw := rawJetStreamLoop(t, b, nRaw)
	plan := rawRunPlanLoop(t, b, nNocoord)
	startNoopWorker(t, b)
	coord := noopRunLoop(t, b, "shell", nRuns)
	nocoord := noopRunLoop(t, b, "nocoord", nNocoord)
	var rawR, planR, coordR, nocoordR []float64
	for i := range reps {
		prof := func(name string) string {
			if i > 0 {
				return ""
			}
			return fmt.Sprintf("%s-%s.cpu.prof", name, b.label)
		}
		rawR = append(rawR, raw(prof("raw-js")))
		planR = append(planR, plan(prof("raw-runplan")))
		coordR = append(coordR, coord(prof("noop-shell")))
		nocoordR = append(nocoordR, nocoord(prof("noop-nocoord")))
	}
	rawName := "raw_js_" + infix + "msgs_per_s"
	record(t, rawName, Figure{Value: median(rawR), Repeats: rawR, Unit: "msgs/s", Samples: nRaw, What: rawWhat})
	record(t, "raw_js_"+infix+"runplan_runs_per_s", Figure{Value: median(planR), Repeats: planR, Unit: "runs/s", Baseline: rawName, Samples: nNocoord,
		What: "the JetStream floor under a coordination-off no-op run: bare nats.go making its message plan, no jetcrew code (request publish with Nats-Msg-Id; pull, queued state KV create, running state CAS, started event async, final state CAS, finished event, each event with a run's headers and Nats-Msg-Id, ack; a watcher reading each finished event's state; a real run's payload sizes); same server, submitters and pullers as the raw loop"})
	record(t, "noop_"+infix+"runs_per_s", Figure{Value: median(coordR), Repeats: coordR, Unit: "runs/s", Baseline: rawName, Samples: nRuns, What: coordWhat})
	record(t, "noop_"+infix+"nocoord_runs_per_s", Figure{Value: median(nocoordR), Repeats: nocoordR, Unit: "runs/s", Baseline: rawName, Samples: nNocoord, What: nocoordWhat})
}

// startNoopWorker starts a worker whose containers exit at once, with the
// built-in profiles plus "nocoord", until the test ends.
func startNoopWorker(t *testing.T, b bed) {
	t.Helper()
	rt := workertest.NewTestRuntime(t)
	rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) { return noopBehaviour, nil }
	w, err := worker.New(b.connect(t), worker.Config{
		ID: "bench-noop", Runtime: rt, Concurrency: noopConcurrency, Profiles: profiles(t),
		StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
		// A round submits all its runs at once, more than a pool holds
		// by default (worker.DefaultRunsMaxPerPool).
		Provision: worker.ProvisionConfig{Replicas: b.replicas, RunsMaxPerPool: -1},
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
}

// processCPU returns the CPU time (user and system) the test process has
// used so far: the embedded server, the worker and the loop's own clients
// together. On a shared machine, CPU per run is steadier than runs per
// second; the logs show both.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// blockProfileEnv, set to a duration (e.g. 10us), makes cpuProfile also
// write a block profile beside each CPU profile (path with ".cpu." replaced
// by ".block."), sampling one blocking event per that much time blocked.
// Off by default: sampling slows the loop it measures.
const blockProfileEnv = "JETCREW_BENCH_BLOCKPROFILE"

// cpuProfile starts a CPU profile into path (and a block profile, see
// blockProfileEnv) and returns the function that stops it; an empty path
// profiles nothing.
func cpuProfile(t *testing.T, path string) func() {
	t.Helper()
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, pprof.StartCPUProfile(f))
	stopBlock := blockProfile(t, strings.Replace(path, ".cpu.", ".block.", 1))
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		stopBlock()
	}
}

// blockProfile starts sampling blocking events when blockProfileEnv is set
// and returns the function that writes them to path and stops sampling.
func blockProfile(t *testing.T, path string) func() {
	t.Helper()
	v := os.Getenv(blockProfileEnv)
	if v == "" {
		return func() {}
	}
	rate, err := time.ParseDuration(v)
	require.NoError(t, err, "%s", blockProfileEnv)
	runtime.SetBlockProfileRate(int(rate.Nanoseconds()))
	return func() {
		runtime.SetBlockProfileRate(0)
		f, err := os.Create(path)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, pprof.Lookup("block").WriteTo(f, 0))
	}
}

// noopRunLoop subscribes to finished events and submits warm-up runs of
// profile, and returns a function that submits n runs of profile from
// noopSubmitters goroutines and returns runs per second from its first
// submit to its last finished event, with a CPU profile into prof unless
// prof is empty.
func noopRunLoop(t *testing.T, b bed, profile string, n int) func(prof string) float64 {
	t.Helper()
	d, err := dispatcher.New(b.connect(t))
	require.NoError(t, err)
	watch := b.connect(t)
	var finished, failed atomic.Int64
	done := make(chan struct{}, 1)
	var target atomic.Int64
	count := func(ok bool) {
		if !ok {
			failed.Add(1)
		}
		if finished.Add(1) == target.Load() {
			done <- struct{}{}
		}
	}
	// The runs are submitted as `jetcrew submit` does by default, with the
	// id left to the dispatcher (an id the caller chooses costs a state
	// read per submit, which the message count leaves out as well); the
	// loop learns each id when Submit returns, and a run can finish before
	// that.
	mine := newRunTracker(count)
	// The subscription lives as long as the test's connection. It counts
	// only this loop's runs: another loop's may finish meanwhile.
	sub, err := watch.Subscribe(messages.SubjectEventsPrefix+".*."+string(messages.EventFinished), func(m *nats.Msg) {
		// Only the state is read: the harness should not spend the CPU of
		// decoding a whole event per run on the machine it measures.
		var ev struct {
			State messages.State `json:"state"`
		}
		ok := json.Unmarshal(m.Data, &ev) == nil && ev.State == messages.StateSucceeded
		mine.finished(strings.Split(m.Subject, ".")[2], ok)
	})
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(-1, -1))
	require.NoError(t, watch.Flush())

	round1 := func(count int) time.Duration {
		mine.reset()
		finished.Store(0)
		target.Store(int64(count))
		start := time.Now()
		submitAll(t, count, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			id, err := d.Submit(ctx, messages.RunRequest{Profile: profile, Prompt: "noop"})
			if err == nil {
				mine.submitted(id)
			}
			return err
		})
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: only %d of %d runs finished", profile, finished.Load(), count)
		}
		require.Zero(t, failed.Load(), "%s: runs that did not succeed", profile)
		return time.Since(start)
	}
	return timedLoop(t, b.label+" "+profile, "run", n, round1)
}

// rawJetStreamLoop creates a WorkQueue stream with noopConcurrency pullers
// that fetch one message at a time and double-ack it, publishes warm-up
// messages, and returns a function that publishes n messages from
// noopSubmitters goroutines and returns messages per second from its first
// publish to its last ack, with a CPU profile into prof unless prof is
// empty. The pullers stop when the test ends.
func rawJetStreamLoop(t *testing.T, b bed, n int) func(prof string) float64 {
	t.Helper()
	ctx := context.Background()
	pubJS, err := jetstream.New(b.connect(t))
	require.NoError(t, err)
	subJS, err := jetstream.New(b.connect(t))
	require.NoError(t, err)
	_, err = pubJS.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BENCH_RAW", Subjects: []string{"bench.raw"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: b.replicas,
	})
	require.NoError(t, err)
	cons, err := subJS.CreateOrUpdateConsumer(ctx, "BENCH_RAW", jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: 1024, Replicas: b.replicas,
	})
	require.NoError(t, err)
	// About the size of a run request.
	payload := []byte(`{"v":1,"id":"01JABCDEFGHJKMNPQRSTVWXYZ0","profile":"shell","prompt":"noop","pool":"default","labels":{"bench":"raw"},"env":{"A":"1"},"timeout":"1h0m0s","padding":"xxxxxxxxxxxxxxxxxxxx"}`)

	return pulledLoop(t, b.label+" raw", "message", n, cons,
		func() error {
			_, err := pubJS.Publish(ctx, "bench.raw", payload)
			return err
		},
		func(ctx context.Context, m jetstream.Msg) error { return m.DoubleAck(ctx) }, nil)
}

// runTracker matches finished events with the runs a loop submitted, in
// whichever order Submit's return and the event arrive, and calls count
// once for each of the loop's runs with whether it succeeded.
type runTracker struct {
	count   func(ok bool)
	mu      sync.Mutex
	pending map[string]bool // submitted, finished event not seen yet
	early   map[string]bool // finished events of ids not (yet) submitted: succeeded?
}

func newRunTracker(count func(ok bool)) *runTracker {
	return &runTracker{count: count, pending: map[string]bool{}, early: map[string]bool{}}
}

// reset forgets the events of ids no submit returned: other loops' runs.
func (rt *runTracker) reset() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	clear(rt.early)
}

// submitted records that Submit returned id.
func (rt *runTracker) submitted(id string) {
	rt.mu.Lock()
	ok, seen := rt.early[id]
	if seen {
		delete(rt.early, id)
	} else {
		rt.pending[id] = true
	}
	rt.mu.Unlock()
	if seen {
		rt.count(ok)
	}
}

// finished records the finished event of run id.
func (rt *runTracker) finished(id string, ok bool) {
	rt.mu.Lock()
	mine := rt.pending[id]
	if mine {
		delete(rt.pending, id)
	} else {
		rt.early[id] = ok
	}
	rt.mu.Unlock()
	if mine {
		rt.count(ok)
	}
}
