package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// hotProfile is profile hot (hotProfiles) keeping one warm container,
// with extra lines.
func hotProfile(t *testing.T, extra string) profile.Profiles {
	t.Helper()
	return hotProfiles(t, "warm = 1\n"+extra)
}

// Profiles reloaded: the warm pool of a changed profile is drained and
// refilled with containers of the new definition; a run admitted before
// the reload keeps the profile it started with (its receipt's digest, its
// jail), a run after it gets the new one, warm; a reload that needs a
// restart (an egress allowlist where none was) is refused and changes
// nothing; an unchanged profile's pool is kept.
func TestReloadProfilesReplacesPool(t *testing.T) {
	t.Parallel()
	before := hotProfile(t, "pids = 77")
	after := hotProfile(t, "pids = 99")
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := setup(t, func(c *worker.Config) {
		c.Profiles = before
		c.Failpoint = func(name string) {
			if name == stage.FailpointRunning {
				once.Do(func() { close(held); <-release })
			}
		}
	})
	unblock := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unblock) // before the worker's Stop, should the test fail
	warmReady(t, b.w, 1)
	b.submit(t, messages.RunRequest{ID: "inflight", Profile: "hot", Prompt: "out old"})
	<-held // running, in the pool's first container; the pool refills
	warmReady(t, b.w, 1)
	require.Len(t, b.rt.Starts(), 2)
	require.EqualValues(t, 77, b.rt.Starts()[1].PidsLimit)

	changed, err := b.w.ReloadProfiles(context.Background(), after)
	require.NoError(t, err)
	require.Equal(t, []string{"hot"}, changed)
	require.Eventually(t, func() bool { return counter(t, b.w, "jetcrew_warm_replaced_total") == 1 }, 10*time.Second, 10*time.Millisecond)
	warmReady(t, b.w, 1)
	require.Len(t, b.rt.Starts(), 3, "the old definition's ready container was replaced")
	require.EqualValues(t, 99, b.rt.Starts()[2].PidsLimit)

	unblock()
	old := b.waitFinal(t, "inflight")
	require.Equal(t, messages.StateSucceeded, old.State, old.Reason)
	require.True(t, old.Warm)
	require.Equal(t, before["hot"].Digest(), old.Receipt.ProfileDigest, "the run kept the profile it started with")

	b.submit(t, messages.RunRequest{ID: "after", Profile: "hot", Prompt: "out new"})
	st := b.waitFinal(t, "after")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.True(t, st.Warm)
	require.Equal(t, after["hot"].Digest(), st.Receipt.ProfileDigest)
	hs := b.rt.Handoffs()
	require.EqualValues(t, 99, hs[len(hs)-1].PidsLimit, "it ran in a container of the new definition")

	// Refused: the profiles in use stay.
	egress := hotProfile(t, "pids = 99\nnetwork = \"none\"\negress = [\"api.example.com:443\"]")
	_, err = b.w.ReloadProfiles(context.Background(), egress)
	require.ErrorContains(t, err, "restart the worker")
	warmReady(t, b.w, 1)
	starts := len(b.rt.Starts())
	// Unchanged: the pool is kept.
	changed, err = b.w.ReloadProfiles(context.Background(), hotProfile(t, "pids = 99"))
	require.NoError(t, err)
	require.Empty(t, changed)
	b.submit(t, messages.RunRequest{ID: "after-refused", Profile: "hot", Prompt: "out new"})
	st = b.waitFinal(t, "after-refused")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, after["hot"].Digest(), st.Receipt.ProfileDigest)
	require.True(t, st.Warm)
	require.Equal(t, jail.RoleWarm, b.rt.Handoffs()[len(b.rt.Handoffs())-1].Labels[jail.LabelRole])
	require.Len(t, b.rt.Starts(), starts+1, "no container replaced but the claimed one's refill")
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_replaced_total"))
}
