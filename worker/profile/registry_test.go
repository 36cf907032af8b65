package profile

import (
	"os"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBackendsDocumented: docs/backends.md's backend table lists exactly
// the registered backends, and each registered backend plans a run.
func TestBackendsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/backends.md")
	require.NoError(t, err)
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z0-9_-]+)` \\|").FindAllStringSubmatch(string(doc), -1) {
		documented = append(documented, m[1])
	}
	sort.Strings(documented)
	require.Equal(t, Backends(), documented, "docs/backends.md's table and the registry differ")
	_, err = lookupBackend("nope")
	require.EqualError(t, err, "backend \"nope\" is not supported (supported: claude, codex, command, gemini, kimi, opencode, pi)")
}

// TestCommandMCPConfigNeedsCoordination: {mcp_config} with coordination
// off is refused (there is no config to point at).
func TestCommandMCPConfigNeedsCoordination(t *testing.T) {
	t.Parallel()
	p, err := Profile{Name: "p", JailConfig: JailConfig{Image: "i"}, AgentConfig: AgentConfig{Backend: BackendCommand, Command: []string{"agent", "{mcp_config}"}}}.Resolve()
	require.NoError(t, err)
	plan, err := p.Plan("x", true)
	require.NoError(t, err)
	require.Equal(t, []string{"agent", "/run/jetcrew/mcp.json"}, plan.Argv)
	_, err = p.Plan("x", false)
	require.ErrorContains(t, err, "command uses {mcp_config} but the profile has coordination off")
}
