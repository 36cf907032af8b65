package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// The sandbox image's HTTP client, the first thing users reach for: curl
// (busybox's wget cannot be one, deploy/sandbox/build.sh says why), run
// through the real worker in the sandbox image against a server the test
// starts.

// sandboxCA is a shell line writing pem to /tmp/ca.pem inside a run.
func sandboxCA(pem string) string {
	return "cat >/tmp/ca.pem <<'PEM'\n" + strings.TrimSpace(pem) + "\nPEM\n"
}

// TestSandboxHTTPClient: a run of the sandbox image on a network the test
// creates fetches over HTTP, and over HTTPS verifying the server's
// certificate (refusing it without the CA), from the stand-in provider on
// that network, by address and by the name the engine's DNS gives it.
func TestSandboxHTTPClient(t *testing.T) {
	t.Parallel()
	p := startProviderOn(t, egressFixtureImage(t))
	b := startJail(t, fmt.Sprintf("[profiles.net]\nimage = %q\ncommand = [\"/bin/sh\", \"-c\", \"{prompt}\"]\nrequire_bridge = false\nnetwork = %q\n",
		profile.SandboxImage, p.network), nil)
	script := sandboxCA(p.certPEM) + fmt.Sprintf(`check() { n=$1; shift; if out=$("$@" 2>&1); then echo "RESULT $n ok $out"; else echo "RESULT $n fail $? $out"; fi; }
check http curl -fsS -m 10 http://%[1]s/
check https curl -fsS -m 10 --cacert /tmp/ca.pem --resolve api.provider.test:443:%[1]s https://api.provider.test/
check https-unverified curl -fsS -m 10 --resolve api.provider.test:443:%[1]s https://api.provider.test/
check http-by-name curl -fsS -m 10 http://%[2]s/
`, p.addr, p.name)
	st, out := b.runScript(t, "sbhttp", "net", script)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s%s", st.Reason, out.stdout, out.stderr)
	res := egressResults(string(out.stdout))
	t.Logf("results: %v", res)
	require.Equal(t, "ok provider ok host="+p.addr.String()+" key= n=0", res["http"])
	require.Equal(t, "ok provider ok host=api.provider.test key= n=0", res["https"])
	require.True(t, strings.HasPrefix(res["https-unverified"], "fail 60 "), "a certificate it cannot verify is refused: %s", res["https-unverified"])
	require.Equal(t, "ok provider ok host="+p.name+" key= n=0", res["http-by-name"], "the name resolves through the engine's DNS")
}

// TestSandboxHTTPClientEgress: the docs' egress examples with the sandbox
// image's client. A run of a profile with an egress allowlist fetches its
// listed name over HTTPS (CONNECT through the proxy the environment names,
// the provider's certificate verified) and over HTTP, and is refused an
// unlisted name; a run of a profile with egress_inject fetches from its
// host with no flag at all (curl trusts the egress CA through
// CURL_CA_BUNDLE), and the provider sees the worker's key.
func TestSandboxHTTPClientEgress(t *testing.T) {
	t.Parallel()
	e := startEgressWorkerImage(t, profile.SandboxImage, "")
	api := "sbeg-api-" + opsSuffix(t)
	e.submit(t, api, "api", sandboxCA(e.certPEM)+`check() { n=$1; shift; if out=$("$@" 2>&1); then echo "RESULT $n ok $out"; else echo "RESULT $n fail $? $out"; fi; }
check api-https curl -fsS -m 10 --cacert /tmp/ca.pem https://api.provider.test/
check api-http curl -fsS -m 10 http://api.provider.test/
check other-https curl -fsS -m 10 --cacert /tmp/ca.pem https://other.provider.test/
`)
	inj := "sbeg-inj-" + opsSuffix(t)
	e.submit(t, inj, "inj", `curl -fsS -m 10 https://inj.provider.test/`)

	st := waitState(t, e.url, api, func(s messages.RunState) bool { return s.State.Final() })
	out, events := egressRunOutput(t, e.js, api)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	res := egressResults(out)
	t.Logf("results: %v", res)
	require.Equal(t, "ok provider ok host=api.provider.test key= n=0", res["api-https"])
	require.Equal(t, "ok provider ok host=api.provider.test key= n=0", res["api-http"])
	require.True(t, strings.HasPrefix(res["other-https"], "fail "), res["other-https"])
	require.Contains(t, res["other-https"], "403", "the proxy's refusal")
	var tunnel, refused bool
	for _, ev := range events {
		tunnel = tunnel || ev.Allowed && ev.Method == "CONNECT" && ev.Host == "api.provider.test" && ev.Port == 443 && ev.BytesDown > 0
		refused = refused || !ev.Allowed && ev.Method == "CONNECT" && ev.Host == "other.provider.test"
	}
	require.True(t, tunnel && refused, "HTTPS goes through a CONNECT tunnel: %+v", events)

	st = waitState(t, e.url, inj, func(s messages.RunState) bool { return s.State.Final() })
	out, _ = egressRunOutput(t, e.js, inj)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	sum := sha256.Sum256([]byte(providerKey))
	require.Equal(t, "provider ok host=inj.provider.test key="+hex.EncodeToString(sum[:8])+" n=1", out)
}
