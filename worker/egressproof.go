package worker

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

// proveEgress proves the jail of egress profiles as the worker will build
// it: a probe container with network none and the egress relay must reach
// its proxy, and must not reach the outside address, the metadata address
// or the host's service ports directly, nor resolve names. Transient
// runtime failures are tried again, three times in all.
func (w *Worker) proveEgress(ctx context.Context) error {
	var err error
	for try := 0; try < 3; try++ {
		if err = w.proveEgressOnce(ctx); err == nil || errors.Is(err, ErrPermanent) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, time.Duration(try+1)*time.Second)
	}
	return err
}

func (w *Worker) proveEgressOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, proofTimeout)
	defer cancel()
	bridge, _, err := w.bridges.stage(w.cfg.BridgePath)
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrPermanent)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "egress-proof-" + hex.EncodeToString(b)
	dir := w.runDir(id, 0, 0) // a proof, not a delivery: its random id is its own
	if err := coordination.StageRunDir(dir); err != nil {
		return fmt.Errorf("stage the proof's directory: %w", err)
	}
	defer os.RemoveAll(dir)
	sess, err := egress.Open(egress.Config{Resolver: w.cfg.EgressResolver, Logger: w.log}, id, egress.Policy{}, filepath.Join(dir, EgressSocketName))
	if err != nil {
		return err
	}
	defer sess.Close()

	spec := w.proofSpec(id, dir, bridge)
	var mu sync.Mutex
	var out bytes.Buffer
	c, err := w.cfg.Runtime.Start(ctx, spec, func(_ string, p []byte) {
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
		return fmt.Errorf("the jail of egress profiles does not hold (exit %d): %s: %w", st.Code, oneLine(lines), ErrPermanent)
	}
	w.log.Debug().Str("output", lines).Msg("egress proof output")
	return nil
}

// proofSpec is the proof container: the probe image, network none, the
// bridge as launcher and relay, the run directory with the proxy socket.
func (w *Worker) proofSpec(id, dir, bridge string) ContainerSpec {
	uid, gid, _ := parseUser(DefaultUser)
	cmd := []string{LaunchPath, "launch", "--egress-relay", EgressProxyAddr + "=" + EgressSocketPath, "--",
		"/bin/sh", "-c", proofScript, "proof"}
	cmd = append(cmd, w.probeTargets()...)
	return ContainerSpec{
		Name:       "jetcrew-" + id + "-" + w.cfg.ID,
		Image:      w.cfg.EgressProbeImage,
		Cmd:        cmd,
		Env:        append([]string{"HOME=" + DefaultHome, "PATH=/bin:/usr/bin"}, egressEnv()...),
		User:       DefaultUser,
		WorkingDir: DefaultHome,
		Labels: map[string]string{
			LabelManaged: "true", LabelRunID: id, LabelWorker: w.cfg.ID, LabelAttempt: "1",
			LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), LabelProfile: "egress-proof", LabelInstall: w.install,
			LabelRole: RoleEgressProof,
		},
		Network:     "none",
		MemoryBytes: 64 << 20,
		NanoCPUs:    5e8,
		PidsLimit:   64,
		Tmpfs: map[string]string{
			"/tmp":      "size=4m,mode=1777",
			DefaultHome: fmt.Sprintf("size=4m,mode=0700,uid=%d,gid=%d", uid, gid),
		},
		Mounts: []Mount{
			{Source: dir, Target: coordination.ContainerRunDir, ReadOnly: true},
			{Source: bridge, Target: coordination.BridgePath, ReadOnly: true},
		},
	}
}
