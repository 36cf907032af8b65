package tests

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/docker"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// The egress tests run real runs of profiles with an egress allowlist on
// real Docker, against a stand-in provider (tests/fixtures/egress) in a
// container on a network the test creates (there is no internet here). The
// worker resolves the provider's test names to that container's address.

// egressFixtureImage builds the fixture image (the sandbox's busybox plus
// /bin/egress-fixture) tagged by a hash of its source, and returns the tag.
func egressFixtureImage(t *testing.T) string {
	t.Helper()
	root := repoRoot()
	src, err := os.ReadFile(filepath.Join(root, "tests/fixtures/egress/main.go"))
	require.NoError(t, err)
	sum := sha256.Sum256(src)
	tag := "jetcrew-egress-fixture:" + hex.EncodeToString(sum[:6])
	if exec.Command("docker", "image", "inspect", tag).Run() == nil {
		return tag
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "egress-fixture"), "./tests/fixtures/egress")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "Dockerfile"),
		[]byte("FROM jetcrew-sandbox:latest\nCOPY egress-fixture /bin/egress-fixture\n"), 0o644))
	cmd := exec.Command("docker", "build", "--quiet", "--tag", tag, dir)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return tag
}

// docker runs the docker CLI and returns its trimmed output.
func dockerCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// startProvider starts the stand-in provider on a network of its own and
// returns its address, that network's gateway (a host address) and a pool
// holding the provider's certificate.
func startProvider(t *testing.T, image string) (provider, gateway netip.Addr, roots *x509.CertPool) {
	t.Helper()
	p := startProviderOn(t, image)
	return p.addr, p.gateway, p.roots
}

// providerOn is a running stand-in provider (startProviderOn).
type providerOn struct {
	// network is the Docker network it is on, made for it; name is its
	// container's name, which the engine's DNS resolves there.
	network, name string
	addr, gateway netip.Addr
	// certPEM is its certificate; roots holds it.
	certPEM string
	roots   *x509.CertPool
}

// startProviderOn starts the stand-in provider (HTTP on :80, HTTPS on :443
// for *.provider.test) on a network of its own, both removed when the test
// ends.
func startProviderOn(t *testing.T, image string) providerOn {
	t.Helper()
	return startProviderNet(t, image, false)
}

// startProviderNet is startProviderOn; with public, the provider's network
// takes a free /28 of TEST-NET-2 (198.51.100.0/24), an address range the
// egress proxy treats as public (as a real provider's), so that a profile
// reaches the provider's names without listing its address, and a CONNECT
// to the address itself is refused as it would be in production.
func startProviderNet(t *testing.T, image string, public bool) providerOn {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	netName, name := "jetcrew-egtest-"+suffix, "jetcrew-egprov-"+suffix
	if public {
		createPublicNetwork(t, netName)
	} else {
		dockerCLI(t, "network", "create", netName)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "network", "rm", netName).Run() })
	dockerCLI(t, "run", "-d", "--name", name, "--network", netName, "--user", "0:0", image, "/bin/egress-fixture", "serve")
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	ip := dockerCLI(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name)
	gw := dockerCLI(t, "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", netName)
	p := providerOn{network: netName, name: name, addr: netip.MustParseAddr(ip), gateway: netip.MustParseAddr(gw), roots: x509.NewCertPool()}
	require.Eventually(t, func() bool {
		p.certPEM = dockerCLI(t, "logs", name)
		return p.roots.AppendCertsFromPEM([]byte(p.certPEM))
	}, 20*time.Second, 50*time.Millisecond, "the provider never printed its certificate")
	return p
}

// createPublicNetwork creates Docker network name on a /28 of TEST-NET-2
// that no other network uses (tests running at once each take their own).
func createPublicNetwork(t *testing.T, name string) {
	t.Helper()
	var out []byte
	for i := 0; i < 16; i++ {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		base := b[0] & 0xf0
		subnet, gateway := fmt.Sprintf("198.51.100.%d/28", base), fmt.Sprintf("198.51.100.%d", base+1)
		var err error
		out, err = exec.Command("docker", "network", "create", "--subnet", subnet, "--gateway", gateway, name).CombinedOutput()
		if err == nil {
			return
		}
		if !strings.Contains(string(out), "overlap") {
			break
		}
	}
	t.Fatalf("docker network create %s on TEST-NET-2: %s", name, out)
}

type fixedResolver map[string][]netip.Addr

func (r fixedResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

// egressScript checks, from inside a run, what it can reach; each check
// prints "RESULT <name> ok" or "RESULT <name> fail ...".
func egressScript(providerIP, hostIP netip.Addr, natsPort int) string {
	return fmt.Sprintf(`check() { n=$1; shift; if "$@" >/tmp/o 2>&1; then echo "RESULT $n ok"; else echo "RESULT $n fail $(head -c 200 /tmp/o | tr '\n' ' ')"; fi; }
check api-https egress-fixture get https://api.provider.test/
check api-http egress-fixture get http://api.provider.test/
check other-https egress-fixture get https://other.provider.test/
check other-http egress-fixture get http://other.provider.test/
check direct-tcp nc -w 2 %[1]s 443
check dns-provider nslookup api.provider.test
check dns-outside nslookup example.com
check metadata-direct nc -w 2 169.254.169.254 80
check metadata-proxy egress-fixture get http://169.254.169.254/
check host-nats nc -w 2 %[2]s %[3]d
check sni-mismatch egress-fixture sni api.provider.test:443 evil.example
check sni-match-other egress-fixture sni other.provider.test:443 other.provider.test
check only-loopback sh -c '[ "$(ls /sys/class/net)" = "lo" ]'
`, providerIP, hostIP, natsPort)
}

// runOutput returns the stdout of a run from its output events.
func egressRunOutput(t *testing.T, js jetstream.JetStream, id string) (string, []messages.EgressEvent) {
	var out strings.Builder
	var egress []messages.EgressEvent
	for _, m := range workertest.Events(t, js, id) {
		switch {
		case strings.HasSuffix(m.Subject(), "."+string(messages.EventOutput)) && m.Headers().Get(messages.HeaderStream) == messages.StreamStdout:
			out.Write(m.Data())
		case strings.HasSuffix(m.Subject(), "."+string(messages.EventEgress)):
			var ev messages.EgressEvent
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			egress = append(egress, ev)
		}
	}
	return out.String(), egress
}

func egressResults(out string) map[string]string {
	res := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			name, v, _ := strings.Cut(rest, " ")
			res[name] = v
		}
	}
	return res
}

// egressEnv is a worker with egress profiles (api, other, inj) on real
// Docker and its own NATS server, against the stand-in provider.
type egressEnv struct {
	w        *worker.Worker
	js       jetstream.JetStream
	url      string
	provider netip.Addr
	gateway  netip.Addr
	natsPort int
	// certPEM is the provider's certificate.
	certPEM string
	// cfg is w's configuration and nc its connection, for a successor
	// (startSuccessor).
	cfg worker.Config
	nc  *nats.Conn
}

// startEgressWorker starts the provider, a NATS server and a worker whose
// profiles api, other and inj each allow their own provider name (inj with
// the key injected), and waits for its egress proof.
func startEgressWorker(t *testing.T) egressEnv {
	t.Helper()
	return startEgressWorkerWith(t, "")
}

// startEgressWorkerWith is startEgressWorker with extra TOML keys (one per
// line) in every profile, such as an OCI runtime.
func startEgressWorkerWith(t *testing.T, extra string) egressEnv {
	t.Helper()
	return startEgressWorkerImage(t, "", extra)
}

// startEgressWorkerImage is startEgressWorkerWith with the profiles' image
// ("": the fixture's, which has the egress-fixture client).
func startEgressWorkerImage(t *testing.T, runImage, extra string) egressEnv {
	t.Helper()
	return startEgressWorkerOpts(t, egressOptions{runImage: runImage, extra: extra})
}

// egressOptions are what startEgressWorkerOpts may add to the worker of
// startEgressWorker.
type egressOptions struct {
	// runImage is the profiles' image ("": the fixture's, which has the
	// egress-fixture client).
	runImage string
	// extra are TOML keys (one per line) added to the profiles api, other
	// and inj, such as an OCI runtime.
	extra string
	// profiles, when set, returns more profiles' TOML, given the profiles'
	// image.
	profiles func(image string) string
	// prices is the worker's price table (worker.Config.Prices).
	prices *usage.Prices
	// publicNet puts the provider on a public-looking address range
	// (startProviderNet), which profiles need not list.
	publicNet bool
	// resolve are more names the worker resolves, to addresses of their
	// own (another provider's).
	resolve fixedResolver
}

// startEgressWorkerOpts is startEgressWorker with o's additions.
func startEgressWorkerOpts(t *testing.T, o egressOptions) egressEnv {
	t.Helper()
	image := egressFixtureImage(t)
	p := startProviderNet(t, image, o.publicNet)
	provider, gateway := p.addr, p.gateway
	// The worker trusts the provider's certificate as --egress-ca makes it:
	// the system's roots plus a PEM file holding it.
	caFile := filepath.Join(t.TempDir(), "provider-ca.pem")
	require.NoError(t, os.WriteFile(caFile, []byte(p.certPEM), 0o644))
	roots, err := egress.UpstreamRoots(caFile)
	require.NoError(t, err)
	resolver := fixedResolver{"api.provider.test": {provider}, "other.provider.test": {provider}, "inj.provider.test": {provider}}
	for name, addrs := range o.resolve {
		resolver[name] = addrs
	}
	runImage, extra := o.runImage, o.extra
	if runImage == "" {
		runImage = image
	}
	srv := workertest.StartServer(t)
	nc := workertest.Connect(t, srv)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	port := srv.Addr().(*net.TCPAddr).Port
	prof := func(own string) string {
		return fmt.Sprintf(`[profiles.%[1]s]
image = %[2]q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["%[1]s.provider.test:443", "%[1]s.provider.test:80", "%[3]s:443", "%[3]s:80"]
%[4]s
`, own, runImage, provider, extra)
	}
	inj := prof("inj") + `egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
`
	more := ""
	if o.profiles != nil {
		more = o.profiles(runImage)
	}
	profiles, err := profile.ParseProfiles("egress-test", []byte(prof("api")+prof("other")+inj+more))
	require.NoError(t, err)
	rt, err := docker.New(context.Background(), docker.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rt.Close() })
	cfg := worker.Config{
		ID: "egress-" + hex.EncodeToString([]byte(t.Name()))[:8], Runtime: rt, Profiles: profiles, Concurrency: 4,
		BridgePath:          filepath.Join(filepath.Dir(jetcrewBin), "jetcrew-bridge"),
		FetchWait:           2 * time.Second,
		EgressRestartDelay:  time.Second,
		EgressCADir:         t.TempDir(),
		EgressUpstreamRoots: roots,
		LookupEnv: func(k string) (string, bool) {
			if k == "JETCREW_TEST_PROVIDER_KEY" {
				return providerKey, true
			}
			return "", false
		},
		EgressResolver:     resolver,
		EgressProbeOutside: provider.String() + ":443",
		EgressProbePorts:   []int{port},
		Prices:             o.prices,
	}
	e := egressEnv{js: js, url: srv.ClientURL(), provider: provider, gateway: gateway, natsPort: port, certPEM: p.certPEM, cfg: cfg, nc: nc}
	e.w = e.startSuccessor(t, cfg.ID)
	return e
}

// startSuccessor starts worker id with e's configuration (its egress CA
// included) and another state directory, as a worker restarted on e's
// engine, and waits for its egress proof.
func (e egressEnv) startSuccessor(t *testing.T, id string) *worker.Worker {
	t.Helper()
	cfg := e.cfg
	cfg.ID, cfg.StateDir = id, workertest.StateDir(t)
	w, err := worker.New(e.nc, cfg)
	require.NoError(t, err)
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = w.Stop(ctx)
	})
	require.Eventually(t, w.Ready, 60*time.Second, 50*time.Millisecond, "the egress proof never passed")
	return w
}

// submit publishes a run request.
func (e egressEnv) submit(t *testing.T, id, profile, prompt string) {
	t.Helper()
	data, err := json.Marshal(messages.RunRequest{ID: id, Profile: profile, Prompt: prompt})
	require.NoError(t, err)
	_, err = e.js.Publish(context.Background(), messages.SubjectRuns(messages.DefaultPool), data)
	require.NoError(t, err)
}

// TestEgressAllowlist: two runs of two egress profiles at once each reach
// their own provider name through the proxy and nothing else: not the
// other's name (403 and an egress event), not the provider's address
// directly, not DNS, not the metadata address, not the host's NATS port,
// not a tunnel whose SNI differs from its CONNECT name. A run of the shell
// profile (network none) has loopback only. /readyz waits for the proof.
// Meanwhile a run's proxy is killed mid-run (nothing gets out while it is
// down: new connections wait for it; then it comes back) and a run of the
// inj profile gets its key added by the proxy.
func TestEgressAllowlist(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	e := startEgressWorker(t)
	script := egressScript(e.provider, e.gateway, e.natsPort)
	ids := map[string]string{"api": "eg-api-" + opsSuffix(t), "other": "eg-other-" + opsSuffix(t), "shell": "eg-shell-" + opsSuffix(t)}
	for p, id := range ids {
		prompt := script
		if p == "shell" {
			prompt = `ls /sys/class/net`
		}
		e.submit(t, id, p, prompt)
	}
	injected := "eg-inj-" + opsSuffix(t)
	e.submit(t, injected, "inj", injectScript)
	killed := "eg-kill-" + opsSuffix(t)
	e.submit(t, killed, "api", killScript)
	requireEgressKillFailsClosed(t, e.w, e.js, e.url, killed)
	requireKeyInjected(t, e.js, e.url, injected)
	for p, id := range ids {
		requireEgressRun(t, e, p, id)
	}
	mfs, err := e.w.Registry().Gather()
	require.NoError(t, err)
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "jetcrew_egress_attempts_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" {
						counted[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	require.Positive(t, counted["allowed"], "metrics: %v", counted)
	require.Positive(t, counted["refused"], "metrics: %v", counted)
}

// requireEgressRun checks the outcome of run id of profile p (api, other:
// the egress script; shell: loopback only).
func requireEgressRun(t *testing.T, e egressEnv, p, id string) {
	t.Helper()
	st := waitState(t, e.url, id, func(s messages.RunState) bool { return s.State.Final() })
	require.Equal(t, messages.StateSucceeded, st.State, "%s: %s", p, st.Reason)
	out, events := egressRunOutput(t, e.js, id)
	if p == "shell" {
		require.Equal(t, "lo\n", out)
		require.Nil(t, st.Egress)
		return
	}
	other := map[string]string{"api": "other", "other": "api"}[p]
	res := egressResults(out)
	want := map[string]bool{p + "-https": true, p + "-http": true, other + "-https": false, other + "-http": false,
		"direct-tcp": false, "dns-provider": false, "dns-outside": false, "metadata-direct": false,
		"metadata-proxy": false, "host-nats": false, "sni-mismatch": false, "only-loopback": true}
	if p == "other" {
		want["sni-match-other"] = true
	}
	for name, ok := range want {
		got, seen := res[name]
		require.True(t, seen, "%s: check %s did not run:\n%s", p, name, out)
		require.Equal(t, ok, strings.HasPrefix(got, "ok"), "%s: check %s: %s", p, name, got)
	}
	var refusedOther, refusedMeta, refusedSNI, allowedOwn bool
	for _, ev := range events {
		switch {
		case ev.Allowed && ev.Host == p+".provider.test" && ev.BytesDown > 0:
			allowedOwn = true
		case !ev.Allowed && ev.Host == other+".provider.test" && strings.Contains(ev.Reason, "allowlist"):
			refusedOther = true
		case !ev.Allowed && ev.Host == "169.254.169.254":
			refusedMeta = true
		case !ev.Allowed && strings.Contains(ev.Reason, "SNI"):
			refusedSNI = true
		}
	}
	require.True(t, allowedOwn && refusedOther && refusedMeta, "%s: egress events %+v", p, events)
	if p == "api" {
		require.True(t, refusedSNI, "api: no SNI refusal in %+v", events)
	}
	require.NotNil(t, st.Egress)
	require.GreaterOrEqual(t, st.Egress.Allowed, int64(2))
	require.GreaterOrEqual(t, st.Egress.Refused, int64(2))
}

// killScript fetches through the proxy every 50ms, 200 times, printing OK
// or FAIL, and exits 0 when its last fetch succeeded. While its proxy is
// killed, a new connection waits for the proxy's socket (the in-jail
// egress relay's reconnect window) rather than failing; one in flight at
// the kill fails.
const killScript = `n=0; r=FAIL
while [ $n -lt 200 ]; do
	if egress-fixture get http://api.provider.test/ >/dev/null 2>&1; then r=OK; else r=FAIL; fi
	echo $r
	n=$((n+1)); sleep 0.05
done
[ $r = OK ]
`

// requireEgressKillFailsClosed kills run id's egress proxy once the run
// has reached its provider, and requires that nothing of the run got out
// while it was down (every fetch that succeeded is an allowed connection
// of its proxy: the relay waited for the proxy's socket, never went
// around it) and that the restarted proxy served it again.
func requireEgressKillFailsClosed(t *testing.T, w *worker.Worker, js jetstream.JetStream, url, id string) {
	t.Helper()
	var before []messages.EgressEvent
	require.Eventually(t, func() bool {
		var out string
		out, before = egressRunOutput(t, js, id)
		return strings.Contains(out, "OK\n")
	}, 60*time.Second, 50*time.Millisecond, "the kill run never reached its provider")
	require.True(t, w.KillEgress(id))
	st := waitState(t, url, id, func(s messages.RunState) bool { return s.State.Final() })
	out, events := egressRunOutput(t, js, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	allowed := 0
	for _, ev := range events {
		if ev.Allowed && ev.Host == "api.provider.test" {
			allowed++
		}
	}
	require.GreaterOrEqual(t, allowed, strings.Count(out, "OK\n"), "every fetch that succeeded went through the proxy")
	require.Greater(t, len(events)-len(before), 5, "the restarted proxy served the run again")
}

// providerKey is the secret the proxy adds for the inj profile; the run must
// never see it.
var providerKey = "sk-test-" + hex.EncodeToString(func() []byte { b := make([]byte, 16); _, _ = rand.Read(b); return b }())

// injectScript fetches from the injected host, verifying its certificate
// (the run trusts the egress CA through SSL_CERT_FILE) and sending a key of
// its own, then dumps every environment in /proc and every file it can
// read in its run directory, home and /tmp, so the test can look for the
// key and the CA's private key there.
const injectScript = `egress-fixture getv https://inj.provider.test/ x-api-key=sk-fake-from-the-agent
echo "--- environ"
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
echo "--- cmdline"
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '
echo "--- files"
find /run/jetcrew /home/agent /tmp -type f 2>/dev/null | while read f; do echo "== $f"; cat "$f"; done
`

// requireKeyInjected: the provider saw exactly the worker's key (the
// agent's own was replaced, not duplicated), while nothing the run could
// read held the key or the CA's private key, and neither the run's events
// nor its state hold the key.
func requireKeyInjected(t *testing.T, js jetstream.JetStream, url, id string) {
	t.Helper()
	st := waitState(t, url, id, func(s messages.RunState) bool { return s.State.Final() })
	out, _ := egressRunOutput(t, js, id)
	require.Equal(t, messages.StateSucceeded, st.State, "%s\n%s", st.Reason, out)
	sum := sha256.Sum256([]byte(providerKey))
	require.Contains(t, out, "200 provider ok host=inj.provider.test key="+hex.EncodeToString(sum[:8])+" n=1\n")
	require.Contains(t, out, "== /run/jetcrew/egress-ca.pem", "the dump must have read the run directory")
	require.Contains(t, out, "SSL_CERT_FILE=/run/jetcrew/ca-bundle.pem")
	require.NotContains(t, out, providerKey)
	require.NotContains(t, out, "PRIVATE KEY")
	for _, m := range workertest.Events(t, js, id) {
		require.NotContains(t, string(m.Data()), providerKey)
	}
	b, err := json.Marshal(st)
	require.NoError(t, err)
	require.NotContains(t, string(b), providerKey)
}
