package runner

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/bridge"
	"github.com/jetcrew/jetcrew/worker/stage/rundir"
)

// TestReceiptHasNoHostPaths: a receipt describes
// each mount by its role and a content digest; neither the state dir, nor
// the bridge's build path, nor the worker id appear in it.
func TestReceiptHasNoHostPaths(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	stateDir := filepath.Join(host, "state-of-worker-w-secret-id")
	bridgeSrc := filepath.Join(host, "build-output", "jetcrew-bridge")
	require.NoError(t, os.MkdirAll(filepath.Dir(bridgeSrc), 0o755))
	require.NoError(t, os.WriteFile(bridgeSrc, []byte("bridge binary"), 0o555))

	p, err := profile.Profile{Name: "ref", AgentConfig: profile.AgentConfig{Backend: profile.BackendClaude}, JailConfig: profile.JailConfig{Image: "agents:ref"}}.Resolve()
	require.NoError(t, err)
	plan, err := p.Plan("fix the bug", true)
	require.NoError(t, err)
	spec := BuildSpec(SpecInput{
		Profile: &p, Plan: plan,
		Request: messages.RunRequest{ID: "r1", Profile: "ref", Prompt: "fix the bug"}.WithDefaults(),
		Attempt: 1, WorkerID: "w-secret-id", Now: time.Now(),
	})
	require.NoError(t, err)
	// The run-directory and bridge stages stage for real, under stateDir.
	for _, d := range []string{stateDir, filepath.Join(stateDir, "r")} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	holds := &stage.Holds{}
	run := &stage.Run{Request: messages.RunRequest{ID: "r1"}, Profile: &p, Plan: plan, Attempt: 1, Holds: holds, Log: zerolog.Nop()}
	var adds receiptAdds
	for _, s := range []stage.Prestarter{
		rundir.New(filepath.Join(stateDir, "r"), "", 0, holds, zerolog.Nop()).For(run),
		bridge.New(bridgeSrc, filepath.Join(stateDir, "bin"), holds).For(run),
	} {
		var resp stage.PrestartResponse
		require.NoError(t, s.Prestart(t.Context(), &stage.PrestartRequest{Run: run, Spec: &spec}, &resp))
		merge(&spec, &adds, &resp)
	}
	require.Len(t, spec.Mounts, 2)
	rc := buildReceipt(&p, p.Digest(), plan, spec, adds, time.Minute, "fix the bug")
	b, err := json.Marshal(rc)
	require.NoError(t, err)
	require.NotContains(t, string(b), host)
	require.NotContains(t, string(b), "w-secret-id")
	require.NotContains(t, string(b), `"source"`)

	byTarget := map[string]messages.ReceiptMount{}
	for _, m := range rc.Mounts {
		byTarget[m.Target] = m
	}
	require.Equal(t, messages.ReceiptMount{Target: messages.ContainerBridgePath, Role: messages.MountRoleBridge,
		Digest: fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("bridge binary"))), ReadOnly: true}, byTarget[messages.ContainerBridgePath])
	rd := byTarget[messages.ContainerRunDir]
	require.Equal(t, messages.MountRoleRunDir, rd.Role)
	require.Equal(t, rundir.Digest(plan), rd.Digest)
	other, err := p.Plan("another prompt", true)
	require.NoError(t, err)
	require.NotEqual(t, rd.Digest, rundir.Digest(other), "the digest covers the staged files' contents")
}
