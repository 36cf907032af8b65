package warm_test

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/warm"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// bindingBase is the profile every field change starts from: one warm
// container, an egress allowlist with an injection, so that each egress
// and budget key can change alone.
const bindingBase = `
[profiles.a]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
warm = 1
egress = ["api.example.com:443"]
egress_inject = [{ host = "api.example.com:443", header = "x-api-key", from_env = "KEY" }]
`

// fieldChanges changes one profile field each, by key: every field of
// profile.Profile has one (TestEveryProfileFieldClassified), so every
// field has its own case in TestProfileFieldChange. Each builds new
// slices, maps and pointers: the base profile is shared.
var fieldChanges = map[string]func(p *profile.Profile){
	"name":               func(p *profile.Profile) { p.Name = "b" },
	"backend":            func(p *profile.Profile) { p.Backend = profile.BackendClaude },
	"image":              func(p *profile.Profile) { p.Image = "img2" },
	"command":            func(p *profile.Profile) { p.Command = []string{"/bin/echo", "{prompt}"} },
	"args":               func(p *profile.Profile) { p.Args = []string{"-x"} },
	"prompt_stdin":       func(p *profile.Profile) { p.PromptStdin = true },
	"permission_mode":    func(p *profile.Profile) { p.PermissionMode = "plan" },
	"approval_mode":      func(p *profile.Profile) { p.ApprovalMode = "default" },
	"stall_timeout":      func(p *profile.Profile) { p.StallTimeout = "5m" },
	"bridge_deadline":    func(p *profile.Profile) { p.BridgeDeadline = "1m" },
	"require_bridge":     func(p *profile.Profile) { p.RequireBridge = new(bool) },
	"user":               func(p *profile.Profile) { p.User = "1000:1000" },
	"home":               func(p *profile.Profile) { p.Home = "/home/other" },
	"workdir":            func(p *profile.Profile) { p.WorkDir = "/srv" },
	"network":            func(p *profile.Profile) { p.Network = "bridge" },
	"egress":             func(p *profile.Profile) { p.Egress = []string{"api.example.com:443", "b.example.com:443"} },
	"egress_ask":         func(p *profile.Profile) { p.EgressAsk = []string{"ask.example.com:443"} },
	"egress_ask_timeout": func(p *profile.Profile) { p.EgressAskTimeout = "30s" },
	"egress_inject": func(p *profile.Profile) {
		p.EgressInject = []profile.EgressInject{{Host: "api.example.com:443", Header: "authorization", FromEnv: "KEY", Prefix: "Bearer "}}
	},
	"egress_unmetered_paths": func(p *profile.Profile) { p.EgressUnmeteredPaths = []string{"POST /v1/embeddings"} },
	"egress_rate":            func(p *profile.Profile) { p.EgressRate = &profile.EgressRate{RequestsPerMinute: 60} },
	"runtime":                func(p *profile.Profile) { p.Runtime = "runsc" },
	"memory_mib":             func(p *profile.Profile) { p.MemoryMiB = 1024 },
	"cpus":                   func(p *profile.Profile) { p.CPUs = 2 },
	"pids":                   func(p *profile.Profile) { p.Pids = 512 },
	"tmp_mib":                func(p *profile.Profile) { p.TmpMiB = 32 },
	"home_mib":               func(p *profile.Profile) { p.HomeMiB = 32 },
	"workspace_mib":          func(p *profile.Profile) { p.WorkspaceMiB = 100 },
	"git_remotes":            func(p *profile.Profile) { p.GitRemotes = []string{"https://git.example.com/*"} },
	"from_profiles":          func(p *profile.Profile) { p.FromProfiles = &[]string{"*"} },
	"feeds":                  func(p *profile.Profile) { p.Feeds = &[]string{} },
	"timeout":                func(p *profile.Profile) { p.Timeout = "1h" },
	"env":                    func(p *profile.Profile) { p.Env = map[string]string{"A": "1"} },
	"retries":                func(p *profile.Profile) { p.Retries = 2 },
	"max_cost_usd":           func(p *profile.Profile) { p.MaxCostUSD = 1.5 },
	"max_output_tokens":      func(p *profile.Profile) { p.MaxOutputTokens = 1000 },
	"max_model_requests":     func(p *profile.Profile) { p.MaxModelRequests = 10 },
	"group_budget":           func(p *profile.Profile) { p.GroupBudget = &profile.SharedBudget{MaxModelRequests: 5} },
	"pool_budget":            func(p *profile.Profile) { p.PoolBudget = &profile.SharedBudget{MaxModelRequests: 50} },
	"on_budget":              func(p *profile.Profile) { p.OnBudget = profile.OnBudgetPause },
	"budget_pause":           func(p *profile.Profile) { p.BudgetPause = "1m" },
	"warm":                   func(p *profile.Profile) { p.Warm = 2 },
	"warm_workspace":         func(p *profile.Profile) { p.WarmWorkspace = 1 },
	"coordination":           func(p *profile.Profile) { p.Coordination = new(bool) },
	"max_output_mib":         func(p *profile.Profile) { p.MaxOutputMiB = 8 },
	"env_from_host":          func(p *profile.Profile) { p.EnvFromHost = []string{"SECRET"} },
	"signed_by":              func(p *profile.Profile) { p.SignedBy = []string{"UOTHER"} },
	"request_env":            func(p *profile.Profile) { p.RequestEnv = []string{"APP_*"} },
}

// profileKeys returns the key of every exported field of profile.Profile,
// the fields of embedded structs in their place (as the TOML format
// flattens them).
func profileKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct:
			keys = append(keys, profileKeys(f.Type)...)
		case f.IsExported():
			keys = append(keys, warm.FieldKey(f))
		}
	}
	return keys
}

// Every field of a profile says when a warm container takes its value
// (warm.Bindings: fixed, late or irrelevant) and has a change of its own
// in TestProfileFieldChange: a field added to profile.Profile fails this
// test until it is classified, and so does a classification of a field
// that no longer exists.
func TestEveryProfileFieldClassified(t *testing.T) {
	t.Parallel()
	keys := profileKeys(reflect.TypeFor[profile.Profile]())
	require.NotEmpty(t, keys)
	bindings := warm.Bindings()
	for _, k := range keys {
		b, ok := bindings[k]
		require.True(t, ok, "profile field %q has no warm.Binding: say whether a warm container is made with it (fixed), the run reads it from its own profile (late) or no run's container depends on it (irrelevant)", k)
		require.Contains(t, []warm.Binding{warm.Fixed, warm.Late, warm.Irrelevant}, b, k)
		require.Contains(t, fieldChanges, k, "profile field %q has no change in TestProfileFieldChange", k)
	}
	for k := range bindings {
		require.Contains(t, keys, k, "warm.Bindings classifies %q, which is no profile field", k)
	}
	for k := range fieldChanges {
		require.Contains(t, keys, k, "fieldChanges changes %q, which is no profile field", k)
	}
}

// full waits until profile name's pool holds its target of ready
// containers, and returns the names of the containers started so far.
func full(t *testing.T, p *warm.Pool, rt *workertest.Runtime, name string) []string {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, st := range p.Status() {
			if st.Profile == name {
				return st.Target > 0 && st.Ready == st.Target
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "pool %s never full: %+v", name, p.Status())
	var names []string
	for _, s := range rt.Starts() {
		names = append(names, s.Name)
	}
	return names
}

// A profile field changed, one at a time, never gives a run a warm
// container of the old value, fixed or not:
//   - before the pool learns of the change (a reload sets the runs'
//     profiles first, then the pool's), a run of the new definition claims:
//     a container made with another fixed value is not handed to it (it
//     starts cold); one made with another late or irrelevant value is
//     (its run reads that value from its own profile);
//   - once the pool reloads, a fixed field's change replaces the pool:
//     the old container is removed, a run admitted before the reload gets
//     none of the new ones, a run of the new definition a new one; a late
//     or irrelevant field's change keeps the pool, and the run of the new
//     definition gets the container made before.
func TestProfileFieldChange(t *testing.T) {
	t.Parallel()
	base, err := profile.ParseProfiles("p.toml", []byte(bindingBase))
	require.NoError(t, err)
	bindings := warm.Bindings()
	for key, change := range fieldChanges {
		t.Run(key, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			v1 := base["a"]
			v2 := v1
			change(&v2)
			require.NotEqual(t, v1.Digest(), v2.Digest(), "the change changes the profile")
			fixed := bindings[key] == warm.Fixed
			require.Equal(t, fixed, slices.Contains(warm.FixedDiff(&v1, &v2), key), "FixedDiff names a fixed field's change alone")

			rt := workertest.NewTestRuntime(t)
			var set *profile.Set
			p := newPoolOf(t, rt, profile.Profiles{"a": v1}, func(c *warm.Config) { c.Max, set = 4, c.Profiles })
			made := full(t, p, rt, "a")[0]

			c := p.Claim(&v2, false)
			if fixed {
				require.True(t, c == nil, "a container made with the old %s is handed a run of the new", key)
				require.True(t, p.Owns(made), "it still serves runs of the definition it was made for")
			} else {
				require.NotNil(t, c, "a container made with the old %s (%s) serves a run of the new", key, bindings[key])
				require.Equal(t, made, c.Name())
				c.Discard(ctx)
				made = full(t, p, rt, "a")[1]
			}

			set.Store(profile.Profiles{v2.Name: v2})
			p.Reload(ctx)
			names := full(t, p, rt, v2.Name)
			if fixed {
				require.Eventually(t, func() bool { return !p.Owns(made) }, 10*time.Second, 5*time.Millisecond, "the old container is removed")
				require.True(t, p.Claim(&v1, false) == nil, "a run admitted before the reload gets no container of the new %s", key)
				c = p.Claim(&v2, false)
				require.NotNil(t, c)
				require.NotEqual(t, made, c.Name(), "a run of the new definition gets a new container")
				require.Equal(t, jail.RoleWarm, rt.Starts()[len(names)-1].Labels[jail.LabelRole])
			} else {
				require.True(t, p.Owns(made), "the pool keeps the container made before the reload")
				if key != "warm" {
					require.Len(t, names, 2, "no container is made for a change of %s", key)
					c = p.Claim(&v2, false)
					require.NotNil(t, c)
					require.Equal(t, made, c.Name(), "a run of the new definition gets the container made before the reload")
				} else {
					require.Len(t, names, 3, "the pool grew by one")
					c = p.Claim(&v2, false)
					require.NotNil(t, c)
				}
			}
			c.Discard(ctx)
		})
	}
}
