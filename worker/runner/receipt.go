package runner

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// receiptAdds is what the stages' Prestart responses added to the
// receipt so far, in list order.
type receiptAdds struct {
	// Mounts are the mounts the stages added, by role and digest.
	Mounts []messages.ReceiptMount
	// Files are the files the stages staged (stage.PrestartResponse.Files).
	Files []messages.ReceiptFile
	// LaunchEnv names the variables the launcher sets at start.
	LaunchEnv []string
}

// buildReceipt describes what a run uses: profile p (whose digest is
// digest, computed once per profile), its plan, its container's spec and
// what the stages added (adds): mounts by role and digest, never by host
// path (receipts go to every reader of the runs bucket), the files they
// staged, the names of the variables the launcher sets at start; its
// timeout. It takes no environment values and no file contents; the
// prompt shows as "<prompt>".
func buildReceipt(p *profile.Profile, digest string, plan profile.Plan, spec jail.ContainerSpec, adds receiptAdds, timeout time.Duration, prompt string) *messages.Receipt {
	rc := &messages.Receipt{
		Profile:       p.Name,
		ProfileDigest: digest,
		Backend:       p.Backend,
		Image:         p.Image,
		User:          p.User,
		Runtime:       p.Runtime,
		Network:       p.Network,
		Egress:        p.Egress,
		Limits:        messages.ReceiptLimits{MemoryBytes: p.MemoryMiB << 20, CPUs: p.CPUs, Pids: p.Pids},
		Tmpfs:         spec.Tmpfs.Options(),
		MCPServers:    append([]string{}, plan.MCPServers...),
		Files:         []messages.ReceiptFile{},
		Unsupported:   plan.Unsupported,
	}
	for _, a := range spec.Cmd {
		if prompt != "" && strings.Contains(a, prompt) {
			a = strings.ReplaceAll(a, prompt, "<prompt>")
		}
		rc.Argv = append(rc.Argv, a)
	}
	if timeout > 0 {
		rc.Timeout = timeout.String()
	}
	if d := p.StallTimeoutDuration(); d > 0 {
		rc.StallTimeout = d.String()
	}
	if p.BridgeRequired() && len(plan.MCPServers) > 0 {
		rc.BridgeDeadline = p.BridgeDeadlineDuration().String()
	}
	rc.Mounts = adds.Mounts
	if rc.Mounts == nil {
		rc.Mounts = []messages.ReceiptMount{}
	}
	rc.Files = append(rc.Files, adds.Files...)
	for _, f := range plan.Files {
		rc.Files = append(rc.Files, messages.ReceiptFile{Path: f.Path, Mode: fmt.Sprintf("%04o", f.Mode.Perm())})
	}
	if plan.EnvFile {
		rc.Files = append(rc.Files, messages.ReceiptFile{Path: profile.LaunchEnvPath, Mode: "0444"})
	}
	names := map[string]bool{}
	for _, kv := range spec.Env {
		k, _, _ := strings.Cut(kv, "=")
		names[k] = true
	}
	for _, k := range adds.LaunchEnv {
		names[k] = true
	}
	for k := range names {
		rc.EnvNames = append(rc.EnvNames, k)
	}
	sort.Strings(rc.EnvNames)
	return rc
}
