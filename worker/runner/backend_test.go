package runner

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/coord"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
	"github.com/stretchr/testify/require"
)

// backendGolden is what a backend makes of the reference profile and run:
// the argv, the environment names and the files written.
type backendGolden struct {
	Argv        []string          `json:"argv"`
	EnvNames    []string          `json:"env_names"`
	BackendEnv  []string          `json:"backend_env"`
	Files       map[string]string `json:"files"`
	FileModes   map[string]string `json:"file_modes"`
	Mounts      []jail.Mount      `json:"mounts"`
	MCPServers  []string          `json:"mcp_servers"`
	Unsupported []string          `json:"unsupported,omitempty"`
}

func TestBackendGolden(t *testing.T) {
	t.Parallel()
	for _, b := range profile.Backends() {
		t.Run(b, func(t *testing.T) {
			t.Parallel()
			p := profile.Profile{Name: "ref", JailConfig: profile.JailConfig{Image: "agents:ref"}, AgentConfig: profile.AgentConfig{Backend: b, EnvFromHost: []string{"API_KEY"}}}
			if b == profile.BackendCommand {
				p.Command = []string{"/bin/sh", "-c", "{prompt}"}
			}
			p, err := p.Resolve()
			require.NoError(t, err)
			plan, err := p.Plan("fix the bug", true)
			require.NoError(t, err)
			spec := BuildSpec(SpecInput{
				Profile: &p, Plan: plan,
				Request: messages.RunRequest{ID: "r1", Profile: "ref", Prompt: "fix the bug", Group: "g"}.WithDefaults(),
				Attempt: 1, WorkerID: "w", Now: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
			})
			// What the run-directory, bridge and coordination stages add.
			var adds receiptAdds
			merge(&spec, &adds, &stage.PrestartResponse{Mounts: []stage.Mount{rundir.Mount("/state/r/x", plan)}})
			merge(&spec, &adds, &stage.PrestartResponse{Mounts: []stage.Mount{bridge.Mount("/usr/local/bin/jetcrew-bridge", "00")}})
			merge(&spec, &adds, &stage.PrestartResponse{Env: coord.Env(), Files: []messages.ReceiptFile{coord.File()}})
			adds.LaunchEnv = p.EnvFromHost
			g := backendGolden{Argv: spec.Cmd, BackendEnv: plan.Env, Files: map[string]string{}, FileModes: map[string]string{},
				Mounts: spec.Mounts, MCPServers: plan.MCPServers, Unsupported: plan.Unsupported}
			for _, kv := range spec.Env {
				k, _, _ := strings.Cut(kv, "=")
				g.EnvNames = append(g.EnvNames, k)
				require.NotContains(t, kv, "fix the bug", "the prompt never travels in the environment")
			}
			sort.Strings(g.EnvNames)
			for _, f := range plan.Files {
				g.Files[f.Path] = string(f.Data)
				g.FileModes[f.Path] = f.Mode.String()
				// Every file lives in the jail-visible, read-only run dir.
				require.True(t, strings.HasPrefix(f.Path, "/run/jetcrew/"), f.Path)
			}
			requireGolden(t, "backend-"+b+".json", g)
			// The secret reaches the container by name only in receipts.
			rc := buildReceipt(&p, p.Digest(), plan, spec, adds, time.Hour, "fix the bug")
			rb, _ := json.Marshal(rc)
			require.NotContains(t, string(rb), "sk-secret")
			require.NotContains(t, string(rb), "fix the bug")
			require.Contains(t, rc.EnvNames, "API_KEY")
			// The secret's variable is bound by the launcher at start: it
			// is in no part of the container's configuration.
			sb, _ := json.Marshal(spec)
			require.NotContains(t, string(sb), "API_KEY")
			require.Contains(t, strings.Join(spec.Cmd, " "), "launch --env-file "+profile.LaunchEnvPath)
			if b != profile.BackendCommand {
				require.Contains(t, strings.Join(spec.Cmd, " "), "--stdin /run/jetcrew/prompt", "agent CLIs read the prompt on stdin")
				require.NotContains(t, spec.Cmd, "fix the bug", "the prompt is never an argument of an agent CLI")
			}
		})
	}
}
