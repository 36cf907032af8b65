package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// warmProfiles is one profile keeping n warm containers, with a secret
// from the worker's environment.
func warmProfiles(t *testing.T, n int) profile.Profiles {
	t.Helper()
	return hotProfiles(t, fmt.Sprintf("env_from_host = [\"WARM_SECRET\"]\nwarm = %d\n", n))
}

// hotProfiles is profile hot, a shell in the sandbox image without a
// bridge, with the lines extra.
func hotProfiles(t *testing.T, extra string) profile.Profiles {
	t.Helper()
	ps, err := profile.ParseProfiles("warm.toml", fmt.Appendf(nil, `
[profiles.hot]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
%s
`, extra))
	require.NoError(t, err)
	return ps
}

// warmReady waits until the worker's pool of profile hot holds n ready
// containers (the jetcrew_warm_ready gauge).
func warmReady(t *testing.T, w *worker.Worker, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		mfs, err := w.Registry().Gather()
		if err != nil {
			return false
		}
		for _, mf := range mfs {
			if mf.GetName() == "jetcrew_warm_ready" {
				for _, m := range mf.GetMetric() {
					if m.GetGauge().GetValue() == float64(n) {
						return true
					}
				}
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the warm pool never held %d ready containers", n)
}

// counter reads the sum of a counter's series.
func counter(t *testing.T, w *worker.Worker, name string) float64 {
	t.Helper()
	mfs, err := w.Registry().Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A run of a profile that keeps warm containers starts in one: it is
// handed the run's command, environment and working directory (the
// secret through the launcher's env file, never in any container's
// configuration), its state, receipt and started event say warm, and
// ten runs on a pool of two use ten different containers, each removed
// after its run; the pool refills; Stop removes the pool.
func TestWarmRuns(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 2)
		c.LookupEnv = func(k string) (string, bool) {
			if k == "WARM_SECRET" {
				return "s3cret-value", true
			}
			return "", false
		}
	})
	warmReady(t, b.w, 2)
	require.Len(t, b.rt.Starts(), 2, "the pool starts its containers before any run")

	ids := map[string]bool{}
	for i := range 10 {
		id := fmt.Sprintf("warm-%d", i)
		warmReady(t, b.w, 2)
		b.submit(t, messages.RunRequest{ID: id, Profile: "hot", Prompt: "out hello " + id})
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.True(t, st.Warm, "run %s started warm", id)
		require.True(t, st.Receipt.Warm)
		require.False(t, ids[st.ContainerID], "one container, one run")
		ids[st.ContainerID] = true
		evs := b.events(t, id)
		require.Equal(t, "hello "+id+"\n", output(evs, "stdout"))
		for _, m := range evs {
			if strings.HasSuffix(m.Subject(), ".started") {
				require.Contains(t, string(m.Data()), `"warm":true`)
			}
		}
	}
	require.EqualValues(t, 10, counter(t, b.w, "jetcrew_warm_claimed_total"))

	hs := b.rt.Handoffs()
	require.Len(t, hs, 10)
	for _, h := range hs {
		require.Equal(t, jail.RoleWarm, h.Labels[jail.LabelRole])
		require.Contains(t, h.Env, "JETCREW_PROFILE=hot")
		require.True(t, strings.HasPrefix(h.Cmd[0], messages.ContainerBridgePath), "the secret comes through the launcher: %v", h.Cmd)
		require.Contains(t, h.Cmd, "--env-file")
	}
	for _, s := range b.rt.Starts() {
		require.NotContains(t, strings.Join(s.Env, " "), "s3cret-value", "no secret in a container's configuration")
		require.NotContains(t, strings.Join(s.Cmd, " "), "s3cret-value")
		require.Equal(t, jail.RoleWarm, s.Labels[jail.LabelRole], "every run started warm")
	}
	warmReady(t, b.w, 2)
	require.Equal(t, 2, b.rt.Live(), "each run's container went with its run; the pool holds two")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.w.Stop(ctx))
	require.Zero(t, b.rt.Live(), "Stop removes the pool")
}

// A run that finds no warm container ready starts cold and is counted
// missed: here the engine refuses every warm container, and the pool backs
// off and says why.
func TestWarmMissStartsCold(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 1)
		c.LookupEnv = func(string) (string, bool) { return "v", true }
		rt := c.Runtime.(*workertest.Runtime)
		rt.StartErr = func(spec jail.ContainerSpec) error {
			if spec.Labels[jail.LabelRole] == jail.RoleWarm {
				return errors.New("engine says no")
			}
			return nil
		}
	})
	b.submit(t, messages.RunRequest{ID: "cold-1", Profile: "hot", Prompt: "out cold"})
	st := b.waitFinal(t, "cold-1")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.Warm)
	require.False(t, st.Receipt.Warm)
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_missed_total"))
	require.Equal(t, jail.RoleRun, b.rt.Starts()[0].Labels[jail.LabelRole])
	require.Eventually(t, func() bool {
		ws := b.w.WarmStatus()
		return len(ws) == 1 && strings.Contains(ws[0].Error, "engine says no")
	}, 5*time.Second, 10*time.Millisecond)
}

// A warm container that dies while it waits is replaced and never handed
// a run.
func TestWarmContainerDiedIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 1)
		c.LookupEnv = func(string) (string, bool) { return "v", true }
	})
	warmReady(t, b.w, 1)
	first := b.rt.Starts()[0].Name
	cs, err := b.rt.ListManaged(context.Background())
	require.NoError(t, err)
	require.Len(t, cs, 1)
	require.NoError(t, b.rt.Remove(context.Background(), cs[0].ID)) // killed from outside
	require.Eventually(t, func() bool { return counter(t, b.w, "jetcrew_warm_replaced_total") == 1 }, 10*time.Second, 10*time.Millisecond)
	warmReady(t, b.w, 1)

	b.submit(t, messages.RunRequest{ID: "after-death", Profile: "hot", Prompt: "out ok"})
	st := b.waitFinal(t, "after-death")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.True(t, st.Warm)
	hs := b.rt.Handoffs()
	require.Len(t, hs, 1)
	require.NotEqual(t, first, hs[0].Name, "the dead container was never handed a run")
}

// A run names the warm container it claims in its state before the
// hand-off: the container carries no run id label, so a worker that dies
// between the hand-off and the running state leaves a record by which the
// next delivery finds and removes it.
func TestWarmContainerRecordedBeforeHandoff(t *testing.T) {
	t.Parallel()
	var b *testBundle
	recorded := make(chan messages.RunState, 1)
	b = setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 1)
		c.LookupEnv = func(string) (string, bool) { return "v", true }
		c.Failpoint = func(name string) {
			if name != stage.FailpointAfterStart {
				return
			}
			// The agent runs; the record still says queued.
			kv, err := b.js.KeyValue(context.Background(), messages.BucketRuns)
			if err != nil {
				close(recorded)
				return
			}
			e, err := kv.Get(context.Background(), "named")
			if err != nil {
				close(recorded)
				return
			}
			var st messages.RunState
			_ = json.Unmarshal(e.Value(), &st)
			recorded <- st
		}
	})
	warmReady(t, b.w, 1)
	cs, err := b.rt.ListManaged(context.Background())
	require.NoError(t, err)
	require.Len(t, cs, 1)
	warmID := cs[0].ID

	b.submit(t, messages.RunRequest{ID: "named", Profile: "hot", Prompt: "out ok"})
	var st messages.RunState
	select {
	case s, ok := <-recorded:
		require.True(t, ok, "the run's state could not be read at the hand-off")
		st = s
	case <-time.After(10 * time.Second):
		t.Fatal("the run never started")
	}
	require.Equal(t, messages.StateQueued, st.State)
	require.Equal(t, warmID, st.ContainerID, "the warm container is recorded before the hand-off")
	final := b.waitFinal(t, "named")
	require.Equal(t, messages.StateSucceeded, final.State, final.Reason)
	require.True(t, final.Warm)
	require.Equal(t, warmID, final.ContainerID)
}

// A run whose claimed warm container died before its hand-off starts cold
// and is counted as a miss, the container as replaced (exited), never as
// claimed.
func TestWarmClaimedDeadCountsMissed(t *testing.T) {
	t.Parallel()
	var b *testBundle
	b = setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 1)
		c.LookupEnv = func(string) (string, bool) { return "v", true }
		c.Failpoint = func(name string) {
			if name != stage.FailpointBeforeStart {
				return
			}
			// Claimed, not yet handed off: the warm container (the first
			// the pool made; its refill is left alone) is killed from
			// outside.
			cs, err := b.rt.ListManaged(context.Background())
			if err != nil {
				return
			}
			for _, m := range cs {
				if m.Name == b.rt.Starts()[0].Name {
					_ = b.rt.Remove(context.Background(), m.ID)
				}
			}
		}
	})
	warmReady(t, b.w, 1)
	b.submit(t, messages.RunRequest{ID: "dead-claim", Profile: "hot", Prompt: "out ok"})
	st := b.waitFinal(t, "dead-claim")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.Warm, "it started cold")
	require.Empty(t, b.rt.Handoffs())
	require.EqualValues(t, 0, counter(t, b.w, "jetcrew_warm_claimed_total"))
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_missed_total"), "a claim given back is a miss")
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_replaced_total"))
}

// A workspace run of a profile that keeps warm containers for workspace
// runs (warm_workspace) starts in one made with its own empty workspace
// volume: the launcher unpacks the snapshot linked in at the claim, the
// capture container records the result, and the receipt is the one of a
// cold run of the same profile (here the claimed container was killed
// before its hand-off: the run started cold on the workspace it had
// taken over) but for warm. A run without a workspace never takes one of
// these; Stop removes the pool's volumes.
func TestWarmWorkspaceRun(t *testing.T) {
	t.Parallel()
	var b *testBundle
	var kill atomic.Bool
	seen := make(chan string, 4)
	b = setup(t, func(c *worker.Config) {
		ps, err := profile.ParseProfiles("warm.toml", []byte(`
[profiles.hotws]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
warm_workspace = 1
`))
		require.NoError(t, err)
		c.Profiles = ps
		// Set before the worker starts: the pool starts containers at once.
		c.Runtime.(*workertest.Runtime).Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
				for _, m := range spec.Mounts {
					if m.Target == messages.WorkspaceDir {
						data, _ := os.ReadFile(filepath.Join(m.Source, "a.txt"))
						seen <- string(data)
						_ = os.WriteFile(filepath.Join(m.Source, "b.txt"), []byte("new\n"), 0o644)
					}
				}
				return jail.ExitStatus{}
			}, nil
		}
		c.Failpoint = func(name string) {
			if name != stage.FailpointBeforeStart || !kill.Load() {
				return
			}
			cs, _ := b.rt.ListManaged(context.Background())
			for _, m := range cs {
				if m.Labels[jail.LabelRole] == jail.RoleWarm {
					_ = b.rt.Remove(context.Background(), m.ID) // its launcher's connection ends with it
				}
			}
		}
	})
	ref := uploadDir(t, b)
	warmReady(t, b.w, 1)
	require.Len(t, b.rt.Volumes(), 1, "the warm container's empty workspace volume")
	require.Equal(t, []messages.WarmPool{{Profile: "hotws", Workspace: true, Target: 1, Ready: 1}}, b.w.WarmStatus())

	var receipts []*messages.Receipt
	for i, id := range []string{"ws-warm", "ws-cold"} {
		kill.Store(i == 1)
		warmReady(t, b.w, 1)
		b.submit(t, messages.RunRequest{ID: id, Profile: "hotws", Prompt: "x", Workspace: &ref})
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, i == 0, st.Warm, id)
		require.Equal(t, "one\n", <-seen, "the agent saw the unpacked tree")
		require.NotNil(t, st.WorkspaceResult)
		require.Empty(t, st.WorkspaceResult.Error)
		require.Equal(t, 1, st.WorkspaceResult.FilesChanged)
		require.Len(t, st.WorkspaceResult.Objects, 2, "patch and bundle")
		receipts = append(receipts, st.Receipt)
	}
	require.True(t, receipts[0].Warm)
	warmReceipt := *receipts[0]
	warmReceipt.Warm = false
	require.Equal(t, *receipts[1], warmReceipt, "a warm workspace run's receipt is the cold one's but for warm")
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_claimed_total"))
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_missed_total"))

	// A run without a workspace starts cold.
	b.submit(t, messages.RunRequest{ID: "no-ws", Profile: "hotws", Prompt: "x"})
	st := b.waitFinal(t, "no-ws")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.Warm)
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_missed_total"), "a pool of another kind is no miss")

	warmReady(t, b.w, 1)
	require.Eventually(t, func() bool { return len(b.rt.Volumes()) == 1 }, 10*time.Second, 10*time.Millisecond,
		"each run's volume went with it; the pool holds one")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.w.Stop(ctx))
	require.Zero(t, b.rt.Live())
	require.Empty(t, b.rt.Volumes(), "Stop removes the pool's volumes")
}

// A warm container made for workspace runs is made with its capture
// container, started and waiting, so a claiming run starts no container;
// one whose capture container exited while it waited is never handed to a
// run (the run starts cold, and succeeds), it is counted replaced and the
// pool makes another, which the next run gets.
func TestWarmWorkspaceCaptureDied(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		ps, err := profile.ParseProfiles("warm.toml", []byte(`
[profiles.hotws]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
warm_workspace = 1
`))
		require.NoError(t, err)
		c.Profiles = ps
	})
	ref := uploadDir(t, b)
	warmReady(t, b.w, 1)
	captures := func() []jail.ManagedContainer {
		cs, err := b.rt.ListManaged(context.Background())
		require.NoError(t, err)
		return slices.DeleteFunc(cs, func(c jail.ManagedContainer) bool {
			return c.Labels[jail.LabelRole] != jail.RoleCapture || c.Labels[jail.LabelRunID] != ""
		})
	}
	require.Len(t, captures(), 1, "the warm container's capture container runs beside it")

	// A warm run starts no container of its own.
	starts := len(b.rt.Starts())
	b.submit(t, messages.RunRequest{ID: "cap-warm", Profile: "hotws", Prompt: "true", Workspace: &ref})
	st := b.waitFinal(t, "cap-warm")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.True(t, st.Warm)
	require.NotNil(t, st.WorkspaceResult)
	require.Empty(t, st.WorkspaceResult.Error, "captured by the capture container made with the warm one")
	warmReady(t, b.w, 1)
	require.Equal(t, starts+2, len(b.rt.Starts()), "the refill's two containers only")

	// Its capture container dies while it waits.
	cs := captures()
	require.Len(t, cs, 1)
	require.NoError(t, b.rt.Remove(context.Background(), cs[0].ID))
	// The worker sees the exit when its wait on the capture container
	// returns, after the removal: the pool then counts the warm container
	// not ready (it failed so in CI, claimed before that).
	warmReady(t, b.w, 0)
	b.submit(t, messages.RunRequest{ID: "cap-dead", Profile: "hotws", Prompt: "true", Workspace: &ref})
	st = b.waitFinal(t, "cap-dead")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.Warm, "never handed a warm container whose capture container exited")
	require.Empty(t, st.WorkspaceResult.Error)
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_replaced_total"))

	warmReady(t, b.w, 1)
	b.submit(t, messages.RunRequest{ID: "cap-again", Profile: "hotws", Prompt: "true", Workspace: &ref})
	st = b.waitFinal(t, "cap-again")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.True(t, st.Warm, "the replacement is handed out")
}

// A reload that changes only fields a run reads from its own profile
// (warm.Late: here env_from_host, env, timeout and max_output_mib) keeps
// the warm pool, and the next run starts warm in the container made
// before the reload with the new values: the new secret in its
// launcher's env file, the new environment in its hand-off, the new
// definition in its receipt. The old secret reaches it nowhere.
func TestWarmReloadLateFieldsBindLate(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	b := setup(t, func(c *worker.Config) {
		c.Profiles = hotProfiles(t, "warm = 1\nenv_from_host = [\"OLD_SECRET\"]\nenv = { X = \"1\" }\ntimeout = \"5m\"")
		c.LookupEnv = func(k string) (string, bool) {
			return map[string]string{"OLD_SECRET": "old-value", "NEW_SECRET": "new-value"}[k], strings.HasSuffix(k, "_SECRET")
		}
		c.Runtime.(*workertest.Runtime).Behave = func(spec jail.ContainerSpec) (workertest.Behaviour, error) {
			return func(context.Context, jail.ContainerSpec, jail.OutputFunc) jail.ExitStatus {
				for _, m := range spec.Mounts {
					if m.Target == messages.ContainerRunDir {
						data, _ := os.ReadFile(filepath.Join(m.Source, filepath.Base(profile.LaunchEnvPath)))
						seen <- string(data) + " " + strings.Join(spec.Env, " ")
					}
				}
				return jail.ExitStatus{}
			}, nil
		}
	})
	warmReady(t, b.w, 1)
	made := b.rt.Starts()[0].Name

	after := hotProfiles(t, "warm = 1\nenv_from_host = [\"NEW_SECRET\"]\nenv = { X = \"2\" }\ntimeout = \"7m\"\nmax_output_mib = 8")
	changed, err := b.w.ReloadProfiles(context.Background(), after)
	require.NoError(t, err)
	require.Equal(t, []string{"hot"}, changed)
	b.submit(t, messages.RunRequest{ID: "late", Profile: "hot", Prompt: "x"})
	st := b.waitFinal(t, "late")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.True(t, st.Warm)
	hs := b.rt.Handoffs()
	require.Len(t, hs, 1)
	require.Equal(t, made, hs[0].Name, "the container made before the reload took the run: the pool was kept")
	got := <-seen
	require.Contains(t, got, `"NEW_SECRET=new-value"`, "the new secret, in the launcher's env file")
	require.NotContains(t, got, "old-value")
	require.Contains(t, hs[0].Env, "X=2")
	require.NotContains(t, hs[0].Env, "X=1")
	require.Equal(t, after["hot"].Digest(), st.Receipt.ProfileDigest)
	require.Equal(t, "7m0s", st.Receipt.Timeout)
	require.Zero(t, counter(t, b.w, "jetcrew_warm_replaced_total"), "nothing replaced")
}

// An image re-tagged just before a burst of 20 runs (the engine's id of
// the profile's reference changes) never runs one of them in a warm
// container of the old image: the first claim finds the change, the
// pool's other containers of the old image are removed at once
// (replaced_total, reason image), and every run starts cold or warm in a
// container of the new image (agent-sandbox#764).
func TestWarmImageRetaggedBeforeBurst(t *testing.T) {
	t.Parallel()
	var image atomic.Value
	image.Store("sha256:old")
	b := setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 4)
		c.Concurrency = 8
		c.LookupEnv = func(string) (string, bool) { return "v", true }
		c.Runtime.(*workertest.Runtime).Images = func(string) string { return image.Load().(string) }
	})
	warmReady(t, b.w, 4)
	image.Store("sha256:new") // `docker tag` of another image under the profile's reference
	for i := range 20 {
		b.submit(t, messages.RunRequest{ID: fmt.Sprintf("burst-%d", i), Profile: "hot", Prompt: "out ok"})
	}
	for i := range 20 {
		st := b.waitFinal(t, fmt.Sprintf("burst-%d", i))
		require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
		require.Equal(t, "sha256:new", st.Receipt.ImageID, "run %d started in a container of the old image (warm %t)", i, st.Warm)
	}
	for _, h := range b.rt.Handoffs() {
		require.NotEqual(t, b.rt.Starts()[0].Name, h.Name)
	}
	require.GreaterOrEqual(t, counter(t, b.w, "jetcrew_warm_replaced_total"), 4.0, "the old image's four containers are replaced")
	warmReady(t, b.w, 4)
}

// A warm container that is paused (or whose launcher is stopped) answers
// no probe: it is never handed a run, which starts cold within two
// seconds of its submit; the container is counted replaced (reason
// unresponsive) and removed.
func TestWarmPausedNeverHandedRun(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *worker.Config) {
		c.Profiles = warmProfiles(t, 1)
		c.LookupEnv = func(string) (string, bool) { return "v", true }
	})
	warmReady(t, b.w, 1)
	cs, err := b.rt.ListManaged(context.Background())
	require.NoError(t, err)
	require.Len(t, cs, 1)
	paused := cs[0].ID
	b.rt.Pause(paused)

	submitted := time.Now()
	b.submit(t, messages.RunRequest{ID: "paused", Profile: "hot", Prompt: "out ok"})
	st := b.waitFinal(t, "paused")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.False(t, st.Warm, "started cold")
	require.NotEqual(t, paused, st.ContainerID)
	require.Less(t, st.StartedAt.Sub(submitted), 2*time.Second, "the cold start began within 2 s of the submit")
	require.Empty(t, b.rt.Handoffs(), "the paused container was never handed the run")
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_replaced_total"))
	require.EqualValues(t, 1, counter(t, b.w, "jetcrew_warm_missed_total"))
	require.Eventually(t, func() bool {
		cs, err := b.rt.ListManaged(context.Background())
		return err == nil && !slices.ContainsFunc(cs, func(m jail.ManagedContainer) bool { return m.ID == paused })
	}, 10*time.Second, 10*time.Millisecond, "the paused container is removed")
}
