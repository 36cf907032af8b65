package layers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/jetcrew/jetcrew/"

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
}

// rule forbids packages matching from (a path under the module, "x/..."
// for x and everything below it) to depend, directly or through others,
// on packages matching any of to, except those matching one of unless.
type rule struct {
	why        string
	from       string
	to, unless []string
}

// rules are the arrows of the layout. Paths are relative to the module.
var rules = []rule{
	{why: "messages is the wire format: the standard library only", from: "messages", to: []string{"..."}},
	{why: "the runtime contract imports nothing of the engine", from: "worker/jail", to: []string{"..."}, unless: []string{"messages"}},
	{why: "drivers import the runtime contract, never the engine (Nomad's plugins/drivers)", from: "worker/docker",
		to: []string{"worker/...", "coordination/...", "egress/...", "workspace/...", "dispatcher/..."}, unless: []string{"worker/jail"}},
	{why: "the fake runtime imports the runtime contract, never the engine", from: "worker/workertest",
		to: []string{"worker/..."}, unless: []string{"worker/jail", "worker/workertest"}},
	{why: "profiles sit below the stages and the engine", from: "worker/profile/...",
		to: []string{"worker/...", "dispatcher/...", "console/..."}, unless: []string{"worker/profile/...", "worker/jail"}},
	{why: "profiles read the egress policy, never the proxy: only its leaf", from: "worker/profile/...",
		to: []string{"egress/..."}, unless: []string{"egress/policy"}},
	{why: "the stage contract reads the egress policy, never the proxy: only its leaf", from: "worker/stage",
		to: []string{"egress/..."}, unless: []string{"egress/policy"}},
	{why: "profiles name the container's layout from messages, never the coordination host", from: "worker/profile/...",
		to: []string{"coordination/..."}},
	{why: "the stage contract knows no coordination host: sockets pass as io.Closer, the layout is messages'", from: "worker/stage",
		to: []string{"coordination/..."}},
	{why: "the egress policy is a leaf: the wire format and the standard library only", from: "egress/policy", to: []string{"..."}, unless: []string{"messages"}},
	{why: "the run record's store sits below the engine and the stages", from: "worker/runstate",
		to: []string{"worker/...", "dispatcher/..."}, unless: []string{"worker/runstate"}},
	{why: "the registry of what is live imports nothing of the module", from: "worker/live", to: []string{"..."}},
	{why: "the stage contract knows no stage and no engine", from: "worker/stage",
		to: []string{"worker/..."}, unless: []string{"worker/stage", "worker/profile/...", "worker/jail", "worker/live"}},
	{why: "a stage imports no other stage, no engine and no driver", from: "worker/stage/*",
		to: []string{"worker/..."}, unless: []string{"worker/stage", "worker/stage/internal/...", "worker/profile/...", "worker/jail", "worker/internal/...", "worker/live"}},
	{why: "the warm pool sits below the engine and knows no stage: the engine hands it what a warm container mounts (a make function)", from: "worker/warm",
		to: []string{"worker", "worker/runner", "worker/stage", "worker/stage/...", "worker/docker", "worker/workertest/...", "dispatcher/...", "console/..."}},
	{why: "the run engine is composed by the worker, never the other way", from: "worker/runner",
		to: []string{"worker", "worker/docker", "worker/workertest/...", "dispatcher/...", "console/..."}},
	{why: "roles name subjects and buckets: no engine", from: "roles", to: []string{"worker/...", "dispatcher/..."}},
	{why: "the client library and the worker never import each other", from: "dispatcher/...", to: []string{"worker/..."}},
	{why: "the client library and the worker never import each other", from: "worker/...", to: []string{"dispatcher/...", "console/..."}},
	{why: "the libraries below the stages know no worker", from: "coordination/...", to: []string{"worker/...", "dispatcher/...", "console/..."}},
	{why: "the libraries below the stages know no worker", from: "workspace/...", to: []string{"worker/...", "dispatcher/...", "console/..."}},
	{why: "the libraries below the stages know no worker", from: "egress/...", to: []string{"worker/...", "dispatcher/...", "console/..."}},
	{why: "nothing imports a command or the end-to-end tests", from: "...", to: []string{"cmd/...", "tests/..."}, unless: []string{"cmd/...", "tests/..."}},
}

// match reports whether path (relative to the module) matches pattern:
// "..." matches everything, "x/..." x and below it, "x/*" the packages
// directly below x, anything else exactly.
func match(pattern, path string) bool {
	switch {
	case pattern == "...":
		return true
	case strings.HasSuffix(pattern, "/..."):
		base := strings.TrimSuffix(pattern, "/...")
		return path == base || strings.HasPrefix(path, base+"/")
	case strings.HasSuffix(pattern, "/*"):
		base := strings.TrimSuffix(pattern, "/*")
		rest, ok := strings.CutPrefix(path, base+"/")
		return ok && rest != "" && !strings.Contains(rest, "/") && rest != "internal"
	}
	return pattern == path
}

func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, path) })
}

// listPackages returns the module's packages (their production code, not
// their tests) and their direct imports within the module.
func listPackages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,GoFiles,Imports", module+"...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	graph := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		require.NoError(t, dec.Decode(&p))
		// Stat each file, so that go test's cache knows the result depends
		// on them (it cannot see what go list read).
		for _, f := range p.GoFiles {
			_, _ = os.Stat(filepath.Join(p.Dir, f))
		}
		_, _ = os.ReadDir(p.Dir)
		from := strings.TrimPrefix(p.ImportPath, module)
		graph[from] = nil
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				graph[from] = append(graph[from], rel)
			}
		}
	}
	return graph
}

// violations checks every rule on graph and returns one line per package
// that reaches what a rule forbids, with the chain of imports that does.
func violations(graph map[string][]string) []string {
	var out []string
	for _, r := range rules {
		for from := range graph {
			if !match(r.from, from) {
				continue
			}
			// Breadth-first over the imports, keeping the path to each.
			prev := map[string]string{from: ""}
			queue := []string{from}
			for len(queue) > 0 {
				at := queue[0]
				queue = queue[1:]
				for _, next := range graph[at] {
					if _, seen := prev[next]; seen {
						continue
					}
					prev[next] = at
					if next != from && matchAny(r.to, next) && !matchAny(r.unless, next) {
						chain := []string{next}
						for p := at; p != ""; p = prev[p] {
							chain = append([]string{p}, chain...)
						}
						out = append(out, fmt.Sprintf("%s depends on %s (%s): %s", from, next, strings.Join(chain, " → "), r.why))
						continue
					}
					queue = append(queue, next)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLayers fails when a package reaches past its layer: the runtime
// contract, drivers, profiles, stages, the run engine and the worker each
// depend only on the layers below them, no stage on another, roles on no
// engine, and the client library and the worker on neither.
func TestLayers(t *testing.T) {
	t.Parallel()
	graph := listPackages(t)
	for _, must := range []string{"worker", "worker/jail", "worker/profile", "worker/runner", "worker/stage", "worker/stage/coord", "worker/docker", "roles", "messages", "egress/policy"} {
		require.Contains(t, graph, must, "the layout this test guards has changed: update its rules")
	}
	require.Empty(t, violations(graph), "packages reaching past their layer")
}

// TestLayersCatch proves the check can fail: a stage importing another
// stage, the Docker driver importing the engine, roles importing the
// worker, a profile importing the egress proxy (its policy leaf is
// allowed), a profile or the stage contract importing the coordination
// host, and a chain through a third package are each reported.
func TestLayersCatch(t *testing.T) {
	t.Parallel()
	graph := map[string][]string{
		"worker/stage/tree":   {"worker/stage", "worker/stage/rundir"},
		"worker/stage/rundir": {"worker/stage"},
		"worker/stage":        {"coordination"},
		"worker/docker":       {"worker/jail", "worker/profile"},
		"worker/jail":         nil,
		"worker/profile":      {"egress/policy", "egress", "coordination"},
		"coordination":        {"messages"},
		"egress/policy":       nil,
		"egress":              nil,
		"roles":               {"messages", "worker"},
		"messages":            nil,
		"worker":              nil,
		"dispatcher":          {"console"},
		"console":             {"worker/jail"},
	}
	got := violations(graph)
	require.Len(t, got, 7, "%q", got)
	require.Contains(t, got[0], "dispatcher depends on worker/jail (dispatcher → console → worker/jail)")
	require.Contains(t, got[1], "roles depends on worker (roles → worker)")
	require.Contains(t, got[2], "worker/docker depends on worker/profile")
	require.Contains(t, got[3], "worker/profile depends on coordination (worker/profile → coordination)")
	require.Contains(t, got[4], "worker/profile depends on egress (worker/profile → egress)")
	require.Contains(t, got[5], "worker/stage depends on coordination (worker/stage → coordination)")
	require.Contains(t, got[6], "worker/stage/tree depends on worker/stage/rundir")
}
