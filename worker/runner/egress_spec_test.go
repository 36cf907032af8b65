package runner

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/proxy"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
)

// The spec of a run of an egress profile: network none, the launcher with
// the egress relay, the proxy variables (and, with egress_inject, the trust
// variables); a profile without egress gets none of them.
func TestEgressSpec(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		egress, inject bool
	}{{"plain", false, false}, {"egress", true, false}, {"inject", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := profile.Profile{Name: "p", JailConfig: profile.JailConfig{Image: "img"}, AgentConfig: profile.AgentConfig{Command: []string{"/bin/sh", "-c", "{prompt}"}},
				CoordinationConfig: profile.CoordinationConfig{Coordination: new(bool)}}
			if tc.egress {
				p.Egress = []string{"api.example.com:443"}
			}
			if tc.inject {
				p.EgressInject = []profile.EgressInject{{Host: "api.example.com:443", Header: "x-api-key", FromEnv: "K"}}
			}
			p, err := p.Resolve()
			require.NoError(t, err)
			plan, err := p.Plan("echo hi", false)
			require.NoError(t, err)
			spec := BuildSpec(SpecInput{Profile: &p, Request: messages.RunRequest{ID: "r1", Prompt: "echo hi"}, Seq: 1, Attempt: 1,
				Now: time.Now(), Plan: plan})
			require.NoError(t, err)
			// The run's list has the egress stage exactly when the profile
			// has egress; it adds the proxy's variables.
			e := &Runner{cfg: Config{Stages: Stages{Proxies: &proxy.Proxies{}, RunDirs: &rundir.Dirs{}, Bridges: &bridge.Bridges{}}}}
			list := e.stagesFor(&stage.Run{Profile: &p, Plan: plan})
			require.Equal(t, tc.egress, slices.ContainsFunc(list, func(s stage.Stage) bool { _, ok := s.(*proxy.Stage); return ok }))
			if tc.egress {
				merge(&spec, &receiptAdds{}, &stage.PrestartResponse{Env: proxy.Env(&p)})
			}
			require.Equal(t, "none", spec.Network)
			hasEnv := func(kv string) bool { return slices.Contains(spec.Env, kv) }
			require.Equal(t, tc.egress, hasEnv("HTTPS_PROXY=http://127.0.0.1:3128"))
			require.Equal(t, tc.egress, hasEnv("https_proxy=http://127.0.0.1:3128"))
			require.Equal(t, tc.egress, hasEnv("NO_PROXY=localhost,127.0.0.1,::1"))
			require.Equal(t, tc.inject, hasEnv("SSL_CERT_FILE=/run/jetcrew/ca-bundle.pem"))
			require.Equal(t, tc.inject, hasEnv("NODE_EXTRA_CA_CERTS=/run/jetcrew/egress-ca.pem"))
			require.Equal(t, tc.egress, strings.Contains(strings.Join(spec.Cmd, " "), "--egress-relay 127.0.0.1:3128=/run/jetcrew/egress.sock --"))
			for _, kv := range spec.Env {
				require.False(t, strings.HasPrefix(kv, "K="), "the injected key's variable never enters the container")
			}
		})
	}
}
