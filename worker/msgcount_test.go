package worker_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
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

// messagesPerRun submits runs of profile one after another and returns the
// messages the server routed per run, end to end (submit to ack), and the
// per-class breakdown of the total.
func messagesPerRun(t *testing.T, profile string, runs int) (float64, map[string]int) {
	t.Helper()
	s := workertest.StartServer(t)
	rt := workertest.NewRuntime()
	rt.Behave = func(worker.ContainerSpec) (workertest.Behaviour, error) {
		return func(context.Context, worker.ContainerSpec, worker.OutputFunc) worker.ExitStatus {
			return worker.ExitStatus{}
		}, nil
	}
	ps, err := worker.ParseProfiles("count.toml", []byte(`[profiles.nocoord]
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
	d, err := dispatcher.New(workertest.Connect(t, s))
	require.NoError(t, err)
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
		id, err := d.Submit(ctx, messages.RunRequest{Profile: profile, Prompt: "true", Labels: map[string]string{"i": fmt.Sprint(i)}})
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
	// The worker's heartbeat is per worker, not per run; replies (the
	// PubAcks, KV and API answers on _INBOX subjects) are counted apart.
	n -= by["$KV.jetcrew-workers.*"] + by[replies]
	return float64(n) / float64(runs), by
}

// budget is the most messages (publishes and requests) a no-op run may
// cost, coordination on or off (issue 16; the peer job queue's task costs 10).
const budget = 10.0

// TestMessagesPerNoopRun counts the messages a no-op run costs on the
// server end to end, as a subscriber to ">" sees them: publishes and
// requests (issue 16's budget: at most 10, coordination on or off), and the
// replies to them besides (logged).
func TestMessagesPerNoopRun(t *testing.T) {
	t.Parallel()
	for _, profile := range []string{"shell", "nocoord"} {
		t.Run(profile, func(t *testing.T) {
			t.Parallel()
			per, by := messagesPerRun(t, profile, 10)
			keys := make([]string, 0, len(by))
			for k := range by {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				t.Logf("%-40s %5.1f per run", k, float64(by[k])/10)
			}
			t.Logf("profile %s: %.1f messages per run, %.1f with replies", profile, per, per+float64(by[replies])/10)
			require.LessOrEqual(t, per, budget, "messages per no-op run (profile %s)", profile)
		})
	}
}
