//go:build bench

package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/policy"
)

// benchDocker runs the docker CLI and returns its trimmed output.
func benchDocker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// benchGoBuild builds a static binary of pkg into dir.
func benchGoBuild(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

// parseP50 reads "p50_ms=X" from the fixture's ttfb output.
func parseP50(t *testing.T, out string) float64 {
	t.Helper()
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "p50_ms="); ok {
			x, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return x
		}
	}
	t.Fatalf("no p50 in %q", out)
	return 0
}

// TestEgressProxyDocker measures the whole path a run's request takes:
// from a container with network none, through the launcher's relay on
// 127.0.0.1:3128, the run's unix socket and the egress proxy, to the
// stand-in provider in a container on a network the test creates; against
// a container on that network connecting directly, in the same run. Time
// to first byte of a 1 KiB response on a fresh TLS connection, p50 of 300.
func TestEgressProxyDocker(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("../tests/fixtures/egress/main.go")
	require.NoError(t, err)
	sum := sha256.Sum256(src)
	image := "jetcrew-egress-fixture:" + hex.EncodeToString(sum[:6])
	if exec.Command("docker", "image", "inspect", image).Run() != nil {
		benchGoBuild(t, dir, "egress-fixture", "./tests/fixtures/egress")
		require.NoError(t, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM jetcrew-sandbox:latest\nCOPY egress-fixture /bin/egress-fixture\n"), 0o644))
		cmd := exec.Command("docker", "build", "--quiet", "--tag", image, dir)
		cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	bridge := benchGoBuild(t, dir, "jetcrew-bridge", "./cmd/jetcrew-bridge")
	require.NoError(t, os.Chmod(bridge, 0o555))

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	netName, prov := "jetcrew-egbench-"+suffix, "jetcrew-egbprov-"+suffix
	benchDocker(t, "network", "create", netName)
	defer exec.Command("docker", "network", "rm", netName).Run()
	benchDocker(t, "run", "-d", "--name", prov, "--network", netName, "--user", "0:0", image, "/bin/egress-fixture", "serve")
	defer exec.Command("docker", "rm", "-f", prov).Run()
	ip := netip.MustParseAddr(benchDocker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", prov))

	runDir, err := os.MkdirTemp("", "jcegb")
	require.NoError(t, err)
	defer os.RemoveAll(runDir)
	require.NoError(t, os.Chmod(runDir, 0o755))
	sess, err := egress.Open(egress.Config{Resolver: fixedNames{"api.bench.test": ip}, MaxEvents: 1},
		"bench", policy.Must("api.bench.test:443", ip.String()+":443"), filepath.Join(runDir, "egress.sock"))
	require.NoError(t, err)
	defer sess.Close()

	// Warm the provider (its first TLS handshakes), then measure in
	// alternating rounds, so load on the machine hits both alike.
	benchDocker(t, "run", "--rm", "--network", netName, "--user", "65532:65532", image, "egress-fixture", "ttfb", "https://"+ip.String()+"/1k", "20")
	const rounds, n = 5, "100"
	var ds, ps []float64
	for r := 0; r < rounds; r++ {
		ds = append(ds, parseP50(t, benchDocker(t, "run", "--rm", "--network", netName, "--user", "65532:65532", image,
			"egress-fixture", "ttfb", "https://"+ip.String()+"/1k", n)))
		ps = append(ps, parseP50(t, benchDocker(t, "run", "--rm", "--network", "none", "--user", "65532:65532",
			"-v", runDir+":/run/jetcrew:ro", "-v", bridge+":/opt/jetcrew/bridge:ro",
			"-e", "HTTPS_PROXY=http://127.0.0.1:3128", image,
			"/opt/jetcrew/bridge", "launch", "--egress-relay", "127.0.0.1:3128=/run/jetcrew/egress.sock", "--",
			"egress-fixture", "ttfb", "https://api.bench.test/1k", n)))
	}
	d50, p50 := median(ds), median(ps)
	record(t, "egress_docker_ttfb_direct_p50", Figure{Value: d50, Unit: "ms", Samples: 500, Repeats: ds,
		What: "TTFB, 1 KiB over a fresh TLS connection, container to the stand-in provider on a Docker network, direct (median of 5 rounds' p50 of 100)"})
	record(t, "egress_docker_ttfb_proxied_p50", Figure{Value: p50, Unit: "ms", Samples: 500, Repeats: ps, Baseline: "egress_docker_ttfb_direct_p50", Ratio: p50 / d50,
		What: "the same from a network-none container through the relay, the run's socket and the egress proxy (rounds alternating with direct)"})
	require.EqualValues(t, 500, sess.Totals().Allowed, fmt.Sprintf("%+v", sess.Totals()))
}

type fixedNames map[string]netip.Addr

func (f fixedNames) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}
