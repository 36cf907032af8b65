package worker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// A worker whose egress proof fails (here: the fake runtime's probe never
// reaches the proxy) is never ready and refuses runs of egress profiles with
// the reason, never running them open; other profiles still run.
func TestEgressProofFailureRefusesRuns(t *testing.T) {
	t.Parallel()
	profiles, err := profile.ParseProfiles("t", []byte(`[profiles.eg]
image = "img"
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["api.example.com:443"]
`))
	require.NoError(t, err)
	b := setup(t, func(c *worker.Config) { c.Profiles = profiles })
	b.submit(t, messages.RunRequest{ID: "eg1", Profile: "eg", Prompt: "out hi"})
	st := b.waitFinal(t, "eg1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Contains(t, st.Reason, "egress proof failed")
	require.False(t, b.w.Ready(), "/readyz must not be ready with a failed egress proof")
	b.submit(t, messages.RunRequest{ID: "sh1", Profile: "shell", Prompt: "out hi"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "sh1").State)
	for _, s := range b.rt.Starts() {
		if s.Labels[jail.LabelRunID] == "eg1" {
			t.Fatalf("a run of an egress profile was started despite the failed proof: %+v", s)
		}
	}
}

// Profiles with egress keep network none and refuse any other network.
func TestEgressProfileValidation(t *testing.T) {
	t.Parallel()
	_, err := profile.ParseProfiles("t", []byte(`[profiles.eg]
image = "img"
command = ["x"]
network = "bridge"
egress = ["api.example.com:443"]
`))
	require.ErrorContains(t, err, "network none")
	_, err = profile.ParseProfiles("t", []byte(`[profiles.eg]
image = "img"
command = ["x"]
egress = ["api.example.com"]
`))
	require.ErrorContains(t, err, "egress entry")
}

// egress_inject must name an exact egress entry, a header that does not
// frame the request, and a variable that does not also enter the container.
func TestEgressInjectValidation(t *testing.T) {
	t.Parallel()
	base := `[profiles.eg]
image = "img"
command = ["x"]
egress = ["api.example.com:443", "*.example.org:443"]
`
	for _, tc := range []struct{ inject, want string }{
		{`egress_inject = [{ host = "other.example.com:443", header = "x-api-key", from_env = "K" }]`, "one of the profile's egress entries"},
		{`egress_inject = [{ host = "*.example.org:443", header = "x-api-key", from_env = "K" }]`, "without wildcard"},
		{`egress_inject = [{ host = "api.example.com:443", header = "Host", from_env = "K" }]`, "not a header"},
		{`egress_inject = [{ host = "api.example.com:443", header = "bad header", from_env = "K" }]`, "not a header"},
		{`egress_inject = [{ host = "api.example.com:443", header = "x-api-key", from_env = "1K" }]`, "from_env"},
		{"env_from_host = [\"K\"]\n" + `egress_inject = [{ host = "api.example.com:443", header = "x-api-key", from_env = "K" }]`, "env_from_host"},
	} {
		_, err := profile.ParseProfiles("t", []byte(base+tc.inject+"\n"))
		require.ErrorContains(t, err, tc.want, tc.inject)
	}
	_, err := profile.ParseProfiles("t", []byte(base+`egress_inject = [{ host = "api.example.com:443", header = "Authorization", from_env = "K", prefix = "Bearer " }]`+"\n"))
	require.NoError(t, err)
}
