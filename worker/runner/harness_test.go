package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/live"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runner"
	"github.com/jetcrew/jetcrew/worker/runstate"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// engine is a Runner on the fake runtime and a fresh embedded NATS server
// with jetcrew's streams, buckets and pool consumer (worker.Provision) and
// coordination's (coordination.Provision), whose runs' stage lists are the
// test's (runner.SetStages).
type engine struct {
	js       jetstream.JetStream
	rt       *workertest.Runtime
	e        *runner.Runner
	cons     jetstream.Consumer
	kv       jetstream.KeyValue
	profiles *profile.Set // the shell profile, unless the test stores others
}

// newEngine returns an engine whose every run gets the stages list
// returns.
func newEngine(t *testing.T, list func(*stage.Run) []stage.Stage) *engine {
	t.Helper()
	ctx := t.Context()
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cons, err := worker.Provision(ctx, js, worker.ProvisionConfig{})
	require.NoError(t, err)
	require.NoError(t, coordination.Provision(ctx, js, 1))
	kv, err := js.KeyValue(ctx, messages.BucketRuns)
	require.NoError(t, err)
	rt := workertest.NewTestRuntime(t)
	log := workertest.Logger(t)
	profiles := profile.NewSet(profile.DefaultProfiles())
	e := runner.New(runner.Config{
		WorkerID: "w1", Pool: messages.DefaultPool, Install: "test", Profiles: profiles,
		Runtime: rt, NC: nc, JS: js, Store: runstate.NewStore(kv, js, "w1", log), Groups: coordination.NewGroups(js),
		Live: &live.Registry{}, DefaultTimeout: 30 * time.Second, StopGrace: time.Second, InProgressInterval: 10 * time.Second,
		MaxDeliver: 5, Metrics: runner.NewMetrics(prometheus.NewRegistry(), "w1", messages.DefaultPool), Log: log,
	})
	runner.SetStages(e, list)
	t.Cleanup(e.Wait)
	return &engine{js: js, rt: rt, e: e, cons: cons, kv: kv, profiles: profiles}
}

// run submits a request for the shell profile running script (the fake
// runtime's ScriptBehaviour, unless the test set rt.Behave), has the
// engine handle its one delivery and returns every revision of the run's
// record written, oldest first (the bucket keeps 5).
func (g *engine) run(t *testing.T, id, script string) []messages.RunState {
	t.Helper()
	ctx := t.Context()
	body, err := json.Marshal(messages.RunRequest{ID: id, Profile: "shell", Prompt: script})
	require.NoError(t, err)
	_, err = g.js.Publish(ctx, messages.SubjectRuns(messages.DefaultPool), body)
	require.NoError(t, err)
	batch, err := g.cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg, "no delivery of %s", id)
	g.e.Handle(ctx, msg)
	hist, err := g.kv.History(ctx, id)
	require.NoError(t, err)
	out := make([]messages.RunState, len(hist))
	for i, e := range hist {
		require.NoError(t, json.Unmarshal(e.Value(), &out[i]))
	}
	return out
}

// calls records the hook calls of a run's stub stages, in order, as
// "<stage> <hook>".
type calls struct {
	mu   sync.Mutex
	list []string
}

func (c *calls) add(s *stub, hook string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.list = append(c.list, s.name+" "+hook)
}

func (c *calls) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.list...)
}

// stub is a stage implementing every hook: each call is recorded in
// calls, then does what the stub's function for it says (nothing when
// nil).
type stub struct {
	name  string
	calls *calls

	prestart  func(req *stage.PrestartRequest, resp *stage.PrestartResponse) error
	poststart func(req *stage.PoststartRequest) error
	// every is CheckEvery (default 10ms); check is called with the
	// stub's check round, from 1.
	every  time.Duration
	check  func(round int) (*stage.Stop, bool)
	exited func(req *stage.ExitedRequest, resp *stage.ExitedResponse)
	note   func(st *messages.RunState)

	mu       sync.Mutex
	rounds   int
	released []stage.ReleaseRequest
}

var (
	_ stage.Prestarter     = (*stub)(nil)
	_ stage.Poststarter    = (*stub)(nil)
	_ stage.Checker        = (*stub)(nil)
	_ stage.MCPObserver    = (*stub)(nil)
	_ stage.AnswerObserver = (*stub)(nil)
	_ stage.Exiter         = (*stub)(nil)
	_ stage.Noter          = (*stub)(nil)
	_ stage.Releaser       = (*stub)(nil)
)

func (s *stub) Name() string { return s.name }

func (s *stub) Prestart(_ context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	s.calls.add(s, "prestart")
	if s.prestart != nil {
		return s.prestart(req, resp)
	}
	return nil
}

func (s *stub) Poststart(_ context.Context, req *stage.PoststartRequest) error {
	s.calls.add(s, "poststart")
	if s.poststart != nil {
		return s.poststart(req)
	}
	return nil
}

func (s *stub) CheckEvery() time.Duration {
	if s.every == 0 {
		return 10 * time.Millisecond
	}
	return s.every
}

func (s *stub) Check(time.Time) (*stage.Stop, bool) {
	s.calls.add(s, "check")
	s.mu.Lock()
	s.rounds++
	round := s.rounds
	s.mu.Unlock()
	if s.check != nil {
		return s.check(round)
	}
	return nil, false
}

func (s *stub) MCPStatus(string) *stage.Stop {
	s.calls.add(s, "mcp")
	return nil
}

func (s *stub) FirstAnswer(profile.Answer) *stage.Stop {
	s.calls.add(s, "answer")
	return nil
}

func (s *stub) Exited(_ context.Context, req *stage.ExitedRequest, resp *stage.ExitedResponse) {
	s.calls.add(s, "exited")
	if s.exited != nil {
		s.exited(req, resp)
	}
}

func (s *stub) Note(st *messages.RunState) {
	s.calls.add(s, "note")
	if s.note != nil {
		s.note(st)
	}
}

func (s *stub) Release(req *stage.ReleaseRequest) {
	s.calls.add(s, "release")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, *req)
}

// releases returns the ReleaseRequests the stub was given.
func (s *stub) releases() []stage.ReleaseRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stage.ReleaseRequest(nil), s.released...)
}

// named is a stage implementing no hook: it is in the list, and never
// called.
type named string

func (n named) Name() string { return string(n) }

// stubs returns stub stages named names, recording into one calls.
func stubs(names ...string) ([]*stub, *calls) {
	c := &calls{}
	out := make([]*stub, len(names))
	for i, n := range names {
		out[i] = &stub{name: n, calls: c}
	}
	return out, c
}

// list returns a stage list function giving every run ss.
func list(ss ...stage.Stage) func(*stage.Run) []stage.Stage {
	return func(*stage.Run) []stage.Stage { return ss }
}

// noted returns a Note function that writes its call count into the
// record's budget field ("note 1", "note 2", ...).
func noted() func(st *messages.RunState) {
	n := 0
	return func(st *messages.RunState) {
		n++
		st.Budget = fmt.Sprintf("note %d", n)
	}
}
