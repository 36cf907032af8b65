// Package msgcount counts the messages a run costs: it starts a real
// worker on the fake runtime of worker/workertest and an embedded server,
// and traces what the server routes from each submit to the run's ack. It
// composes a whole worker, so it lives beside workertest (whose fakes
// import only the runtime contract), not in it.
package msgcount

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// subjectCounter counts every message the server routes, as a subscriber to
// ">" sees them, by subject class.
type subjectCounter struct {
	mu    sync.Mutex
	by    map[string]int
	n     int
	trace []string // every subject, when not nil
}

func (c *subjectCounter) add(m *nats.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.trace != nil {
		c.trace = append(c.trace, fmt.Sprintf("%s reply=%s %d B", m.Subject, m.Reply, len(m.Data)))
	}
	c.n++
	c.by[classify(m.Subject)]++
}

// replies is the class of every reply to a request: PubAcks, KV and
// JetStream API answers.
const replies = "_INBOX (replies)"

// classify folds run ids and inbox tokens out of a subject.
func classify(subj string) string {
	parts := strings.Split(subj, ".")
	switch {
	case strings.HasPrefix(subj, "_INBOX."):
		return replies
	case len(parts) > 2 && parts[0] == "$KV":
		return strings.Join(parts[:2], ".") + ".*"
	case len(parts) > 2 && parts[0] == "jetcrew":
		return strings.Join(parts[:2], ".") + ".*" + "." + parts[len(parts)-1]
	case parts[0] == "$JS" && len(parts) > 4:
		return strings.Join(parts[:4], ".")
	}
	return subj
}

func (c *subjectCounter) snapshot() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.by))
	for k, v := range c.by {
		m[k] = v
	}
	return c.n, m
}

// SubmitFunc submits the i-th run of profile and returns its run id.
type SubmitFunc func(ctx context.Context, profile string, i int) (string, error)

// MessageCount is what MessagesPerRun counted: publishes and requests per
// run (PerRun), replies to them per run (RepliesPerRun: PubAcks, KV and
// JetStream API answers on _INBOX subjects), and the total by subject class.
type MessageCount struct {
	PerRun        float64
	RepliesPerRun float64
	BySubject     map[string]int
}

// MessagesPerRun starts a server and a worker whose containers exit at once
// (the built-in profiles plus "nocoord", coordination off), submits runs of
// profile one after another through the submitter newSubmit makes on its
// own connection, and counts every message the server routes from each
// submit to the run's ack, as a subscriber to ">" sees them. The
// worker heartbeat (per worker, not per run) is left out.
func MessagesPerRun(t testing.TB, profileName string, runs int, newSubmit func(nc *nats.Conn) SubmitFunc) MessageCount {
	t.Helper()
	s := workertest.StartServer(t)
	rt := workertest.NewTestRuntime(t)
	rt.Behave = func(jail.ContainerSpec) (workertest.Behaviour, error) {
		return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
			return jail.ExitStatus{}
		}, nil
	}
	ps, err := profile.ParseProfiles("count.toml", []byte(`[profiles.nocoord]
image        = "jetcrew-sandbox:latest"
command      = ["/bin/sh", "-c", "{prompt}"]
coordination = false
`))
	require.NoError(t, err)
	w, err := worker.New(workertest.Connect(t, s), worker.Config{
		ID: "count", Runtime: rt, Concurrency: 1, Profiles: ps,
		StateDir: workertest.StateDir(t), BridgePath: workertest.BridgeFile(t),
		FetchWait: 30 * time.Second,
	})
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	submit := newSubmit(workertest.Connect(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The spy's subscriptions cost no messages of their own: it waits for
	// each run's finished event as a plain subscriber.
	spy := workertest.Connect(t, s)
	finished := make(chan string, 1)
	_, err = spy.Subscribe(messages.SubjectEventsPrefix+".*."+string(messages.EventFinished), func(m *nats.Msg) {
		finished <- strings.Split(m.Subject, ".")[2]
	})
	require.NoError(t, err)
	run := func(i int) {
		// The id is generated, as most submitters leave it: a chosen one
		// costs a state read (the id-in-use check).
		id, err := submit(ctx, profileName, i)
		require.NoError(t, err)
		select {
		case got := <-finished:
			require.Equal(t, id, got)
		case <-ctx.Done():
			t.Fatalf("run %s did not finish", id)
		}
		time.Sleep(100 * time.Millisecond) // the ack and what follows the finished event
	}
	// One run first, so that what is set up once (the dispatcher's
	// handles, the worker's first pull) is not counted.
	run(-1)

	c := &subjectCounter{by: map[string]int{}, trace: []string{}}
	sub, err := spy.Subscribe(">", c.add)
	require.NoError(t, err)
	require.NoError(t, spy.Flush())
	for i := range runs {
		run(i)
	}
	require.NoError(t, sub.Unsubscribe())
	n, by := c.snapshot()
	if testing.Verbose() {
		for _, l := range c.trace[:len(c.trace)/runs] {
			t.Log(l)
		}
	}
	// The heartbeat is per worker, not per run, and so is the check before
	// each beat (worker.missingResource: two STREAM.INFO, one
	// CONSUMER.INFO), seen more often by a run slowed down by load. Only as
	// many INFO requests as the beats explain are taken off: any a run makes
	// still counts. Replies (on _INBOX subjects) are counted apart.
	beats := by["$KV.jetcrew-workers.*"]
	periodic := beats + min(by["$JS.API.STREAM.INFO"], 2*beats) + min(by["$JS.API.CONSUMER.INFO"], beats)
	n -= periodic + by[replies]
	return MessageCount{PerRun: float64(n) / float64(runs), RepliesPerRun: float64(by[replies]) / float64(runs), BySubject: by}
}
