package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// upstreamProfile is a metered profile with three injected hosts:
// inj.provider.test (the stand-in whose certificate the worker trusts, by
// an --egress-ca file), untrusted.provider.test (a second stand-in, whose
// certificate it does not) and closed.provider.test:8443 (the second
// stand-in's address, on a port nothing listens on).
func upstreamProfile(image string) string {
	return fmt.Sprintf(`[profiles.upstream]
image = %q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443", "untrusted.provider.test:443", "closed.provider.test:8443"]
egress_inject = [
  { host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" },
  { host = "untrusted.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" },
  { host = "closed.provider.test:8443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" },
]
`, image)
}

// upstreamScript sends one model request to each host of upstreamProfile
// and exits 0 whatever the answers, as an agent CLI that takes a failed
// request for an answer would; each line is "<host> <what happened>".
func upstreamScript() string {
	return fmt.Sprintf(`m='%s'
echo "trusted $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "untrusted $(egress-fixture post https://untrusted.provider.test/v1/messages "$m")"
echo "closed $(egress-fixture post https://closed.provider.test:8443/v1/messages "$m")"
`, messagesBody(false))
}

// TestEgressUpstreamFailure runs a run of upstreamProfile on real Docker.
// The host the worker trusts through its --egress-ca file answers (200,
// the worker's key). The proxy answers the two others itself, instead of
// closing the run's connection: 502 in Anthropic's error shape (api_error)
// naming the cause, "upstream certificate not trusted: …" and "upstream
// refused the connection". The run's record counts both upstream
// failures, and `jetcrew watch` prints a line for each, though the run
// itself exited 0.
func TestEgressUpstreamFailure(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	image := egressFixtureImage(t)
	untrusted := startProviderNet(t, image, true)
	e := startEgressWorkerOpts(t, egressOptions{profiles: upstreamProfile, publicNet: true,
		resolve: fixedResolver{"untrusted.provider.test": {untrusted.addr}, "closed.provider.test": {untrusted.addr}}})
	id := "eg-upstream-" + opsSuffix(t)
	e.submit(t, id, "upstream", upstreamScript())

	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	eventsToFinished(t, e.js, id)
	out, events := egressRunOutput(t, e.js, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	res := scriptLines(out)
	require.True(t, strings.HasPrefix(res["trusted"], "status=200 "+keyTag(providerKey)), "trusted: %s", res["trusted"])
	const shape = `status=502 key=- body={"type":"error","error":{"type":"api_error","message":"jetcrew egress: `
	require.True(t, strings.HasPrefix(res["untrusted"], shape+"untrusted.provider.test:443: upstream certificate not trusted: x509: "),
		"untrusted: %s", res["untrusted"])
	require.True(t, strings.HasPrefix(res["closed"], shape+"closed.provider.test:8443: upstream refused the connection"),
		"closed: %s", res["closed"])

	require.NotNil(t, st.Egress)
	require.EqualValues(t, 2, st.Egress.UpstreamFailed, "%+v", st.Egress)
	var failed []string
	for _, ev := range events {
		if ev.UpstreamFailed() {
			failed = append(failed, fmt.Sprintf("%s:%d %s", ev.Host, ev.Port, ev.Reason))
		}
	}
	require.Len(t, failed, 2, "egress events: %+v", events)

	w := run(t, e.url, jetcrewBin, "watch", id)
	require.Equal(t, 0, w.code, w.stderr)
	require.Contains(t, w.stderr, "--- egress upstream failed: POST untrusted.provider.test:443: upstream certificate not trusted: x509: ")
	require.Contains(t, w.stderr, "--- egress upstream failed: POST closed.provider.test:8443: upstream refused the connection")
	require.NotContains(t, w.stderr+w.stdout, providerKey)
}
