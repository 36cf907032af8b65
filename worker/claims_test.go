package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// A run's claim holds while it runs, quiet or not, and is gone the moment
// it is cancelled: the worker removes it when it closes the run's
// coordination session. A peer of the group is refused meanwhile, told who
// holds it.
func TestClaimsLiveAsLongAsTheRun(t *testing.T) {
	t.Parallel()
	claimed := make(chan error, 1)
	refused := make(chan string, 1)
	b := setup(t, func(c *worker.Config) {
		rt := workertest.NewTestRuntime(t)
		rt.Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(ctx context.Context, spec jail.ContainerSpec, out jail.OutputFunc) jail.ExitStatus {
				cl := relay.NewClient(filepath.Join(runDirOf(spec), messages.SocketName))
				defer cl.Close()
				switch spec.Labels[jail.LabelRunID] {
				case "holder":
					_, err := cl.Claim(ctx, relay.ClaimRequest{Paths: []string{"src/**"}, Reason: "rewriting src"})
					claimed <- err
					<-ctx.Done() // quiet until cancelled
					return jail.ExitStatus{Code: 137}
				default:
					_, err := cl.Claim(ctx, relay.ClaimRequest{Paths: []string{"src/main.go"}})
					var re *relay.Error
					if errors.As(err, &re) && re.Code == relay.CodeConflict {
						refused <- re.Message
					} else {
						refused <- "not refused"
					}
					return jail.ExitStatus{}
				}
			}, nil
		}
		c.Runtime = rt
	})
	b.submit(t, messages.RunRequest{ID: "holder", Profile: "shell", Group: "team"})
	require.NoError(t, <-claimed)
	b.submit(t, messages.RunRequest{ID: "peer", Profile: "shell", Group: "team"})
	require.Contains(t, <-refused, "claimed by run holder since ")
	require.Len(t, claimDoc(t, b.js, "team").Claims, 1)

	require.Equal(t, messages.CancelStopping, b.cancel(t, "holder").Result)
	require.Equal(t, messages.StateCancelled, b.waitFinal(t, "holder").State)
	// The finished event comes after the run's session is closed: by then
	// its claims are gone from the bucket, and its released event says so.
	var released []messages.CoordEvent
	require.Eventually(t, func() bool {
		released = released[:0]
		finished := false
		for _, m := range b.events(t, "holder") {
			switch m.Subject() {
			case messages.SubjectEvents("holder", messages.EventFinished):
				finished = true
			case messages.SubjectEvents("holder", messages.EventCoord):
				var ev messages.CoordEvent
				if json.Unmarshal(m.Data(), &ev) == nil && ev.Kind == messages.CoordReleased {
					released = append(released, ev)
				}
			}
		}
		return finished
	}, 10*time.Second, 20*time.Millisecond)
	require.Nil(t, claimDoc(t, b.js, "team"), "the cancelled run's claims are gone")
	require.Len(t, released, 1)
	require.Equal(t, []string{"src/**"}, released[0].Paths)
	require.Equal(t, "run ended", released[0].Reason)
}

// claimDoc returns group's claims document, nil when it has no key.
func claimDoc(t *testing.T, js jetstream.JetStream, group string) *messages.CoordClaims {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, coordination.BucketClaims)
	require.NoError(t, err)
	e, err := kv.Get(ctx, coordination.ClaimKey(coordtest.Group(group)))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	require.NoError(t, err)
	var doc messages.CoordClaims
	require.NoError(t, json.Unmarshal(e.Value(), &doc))
	return &doc
}
