package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// proofTimeout bounds the start-up proof's container.
const proofTimeout = 90 * time.Second

// proofScript runs in the proof container, network none, behind the egress
// relay. It needs busybox's wget, nc and nslookup. Each line says what it
// found; it exits 0 only when the proxy answered (a 403 for an unlisted
// name), no target was reachable directly and DNS answered nothing.
const proofScript = `fail=0
out=$(wget -q -O- http://jetcrew-proof.invalid/ 2>&1)
case "$out" in
*403*) echo "proof: the egress proxy is reachable (and refused an unlisted name)" ;;
*) echo "proof: FAIL: the egress proxy is not reachable: $out"; fail=1 ;;
esac
for t in "$@"; do
	if nc -w 2 "${t%:*}" "${t##*:}" </dev/null >/dev/null 2>&1; then
		echo "proof: FAIL: $t is reachable directly"; fail=1
	else
		echo "proof: $t is not reachable directly"
	fi
done
if nslookup example.com >/dev/null 2>&1; then echo "proof: FAIL: DNS answers outside names"; fail=1; fi
exit $fail
`

// ProofConfig configures the start-up proof.
type ProofConfig struct {
	// Runtime runs the proof's container.
	Runtime jail.Runtime
	// Image is the proof container's image; it needs busybox's sh, wget,
	// nc and nslookup.
	Image string
	// Outside is an outside address ("host:port") the proof must not
	// reach directly.
	Outside string
	// Ports are the host's service ports (NATS, metrics) the proof must
	// not reach on any of the host's addresses.
	Ports []int
	// Bridge stages the bridge binary (launcher and relay) and returns its
	// host path.
	Bridge func() (path, digest string, err error)
	// Dir returns the host directory of a proof of the given id (made and
	// removed by the proof).
	Dir func(id string) string
}

// prove proves the jail of egress profiles as the worker will build
// it: a probe container with network none and the egress relay must reach
// its proxy, and must not reach the outside address, the metadata address
// or the host's service ports directly, nor resolve names. Transient
// runtime failures are tried again, three times in all.
func (p *Proxies) prove(ctx context.Context) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = p.proveOnce(ctx); err == nil || errors.Is(err, jail.ErrPermanent) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try+1) * time.Second):
		}
	}
	return err
}

func (p *Proxies) proveOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, proofTimeout)
	defer cancel()
	pc := p.cfg.Proof
	bridge, _, err := pc.Bridge()
	if err != nil {
		return fmt.Errorf("%w: %w", err, jail.ErrPermanent)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "egress-proof-" + hex.EncodeToString(b)
	dir := pc.Dir(id)
	if err := coordination.StageRunDir(dir); err != nil {
		return fmt.Errorf("stage the proof's directory: %w", err)
	}
	defer os.RemoveAll(dir)
	sess, err := egress.Open(egress.Config{Resolver: p.cfg.Resolver, Logger: p.cfg.Log}, id, policy.Policy{}, filepath.Join(dir, profile.EgressSocketName))
	if err != nil {
		return err
	}
	defer sess.Close()

	spec := p.proofSpec(id, dir, bridge)
	var mu sync.Mutex
	var out bytes.Buffer
	c, err := pc.Runtime.Start(ctx, spec, func(_ string, p []byte) {
		mu.Lock()
		if out.Len() < 64<<10 {
			out.Write(p)
		}
		mu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("start the proof container: %w: %w", errNoDocker, err)
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = c.Remove(rctx)
		rcancel()
	}()
	st, err := c.Wait(ctx)
	mu.Lock()
	lines := strings.TrimSpace(out.String())
	mu.Unlock()
	if err != nil {
		return fmt.Errorf("the proof container did not finish: %w (output: %s)", err, lines)
	}
	if st.Code != 0 || sess.Totals().Refused == 0 {
		return fmt.Errorf("the jail of egress profiles does not hold (exit %d): %s: %w", st.Code, strings.ReplaceAll(lines, "\n", "; "), jail.ErrPermanent)
	}
	p.cfg.Log.Debug().Str("output", lines).Msg("egress proof output")
	return nil
}

// proofSpec is the proof container: the probe image, network none, the
// bridge as launcher and relay, the run directory with the proxy socket.
func (p *Proxies) proofSpec(id, dir, bridge string) jail.ContainerSpec {
	uid, gid := profile.ShellProfile().Owner() // resolved when built
	cmd := []string{profile.LaunchPath, "launch", "--egress-relay", profile.EgressProxyAddr + "=" + profile.EgressSocketPath, "--",
		"/bin/sh", "-c", proofScript, "proof"}
	cmd = append(cmd, p.probeTargets()...)
	return jail.ContainerSpec{
		Name:       "jetcrew-" + id + "-" + p.cfg.WorkerID,
		Image:      p.cfg.Proof.Image,
		Cmd:        cmd,
		Env:        append([]string{"HOME=" + profile.DefaultHome, "PATH=/bin:/usr/bin"}, profile.ProxyEnv()...),
		User:       profile.DefaultUser,
		WorkingDir: profile.DefaultHome,
		Labels: map[string]string{
			jail.LabelManaged: "true", jail.LabelRunID: id, jail.LabelWorker: p.cfg.WorkerID, jail.LabelAttempt: "1",
			jail.LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), jail.LabelProfile: "egress-proof", jail.LabelInstall: p.cfg.Install,
			jail.LabelRole: jail.RoleEgressProof,
		},
		Network:     "none",
		MemoryBytes: 64 << 20,
		NanoCPUs:    5e8,
		PidsLimit:   64,
		Tmpfs: jail.TmpfsMounts{
			{Target: "/tmp", SizeBytes: 4 << 20, Mode: 0o1777},
			{Target: profile.DefaultHome, SizeBytes: 4 << 20, Mode: 0o700, UID: uid, GID: gid},
		},
		Mounts: []jail.Mount{
			{Source: dir, Target: messages.ContainerRunDir, ReadOnly: true},
			{Source: bridge, Target: messages.ContainerBridgePath, ReadOnly: true},
		},
	}
}
