package runner

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// TestReceiptHasNoHostPaths proves issue 13 item 10: a receipt describes
// each mount by its role and a content digest; neither the state dir, nor
// the bridge's build path, nor the worker id appear in it.
func TestReceiptHasNoHostPaths(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	stateDir := filepath.Join(host, "state-of-worker-w-secret-id")
	bridge := filepath.Join(host, "build-output", "jetcrew-bridge")
	require.NoError(t, os.MkdirAll(filepath.Dir(bridge), 0o755))
	require.NoError(t, os.WriteFile(bridge, []byte("bridge binary"), 0o555))

	p, err := Profile{Name: "ref", Backend: BackendClaude, Image: "agents:ref"}.withDefaults()
	require.NoError(t, err)
	plan, err := planAgent(p, "fix the bug", true)
	require.NoError(t, err)
	spec, err := BuildSpec(SpecInput{
		Profile: p, Plan: plan, Coordination: true,
		Request: messages.RunRequest{ID: "r1", Profile: "ref", Prompt: "fix the bug"}.WithDefaults(),
		Attempt: 1, WorkerID: "w-secret-id", Now: time.Now(),
		RunDir: filepath.Join(stateDir, "r", "abc"), BridgePath: bridge,
		LookupEnv: func(string) (string, bool) { return "", false },
	})
	require.NoError(t, err)
	rc := buildReceipt(p, plan, spec, time.Minute, "fix the bug")
	b, err := json.Marshal(rc)
	require.NoError(t, err)
	require.NotContains(t, string(b), host)
	require.NotContains(t, string(b), "w-secret-id")
	require.NotContains(t, string(b), `"source"`)

	byTarget := map[string]messages.ReceiptMount{}
	for _, m := range rc.Mounts {
		byTarget[m.Target] = m
	}
	require.Equal(t, messages.ReceiptMount{Target: coordination.BridgePath, Role: MountRoleBridge,
		Digest: fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("bridge binary"))), ReadOnly: true}, byTarget[coordination.BridgePath])
	rd := byTarget[coordination.ContainerRunDir]
	require.Equal(t, MountRoleRunDir, rd.Role)
	require.Equal(t, runDirDigest(plan), rd.Digest)
	other, err := planAgent(p, "another prompt", true)
	require.NoError(t, err)
	require.NotEqual(t, rd.Digest, runDirDigest(other), "the digest covers the staged files' contents")
}
