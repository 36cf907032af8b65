// Package bridge is the stage that stages the jetcrew bridge binary a run
// executes (its MCP server and its launcher) and mounts it read-only at
// messages.ContainerBridgePath: a content-addressed copy, so a rebuild while
// runs are live changes nothing they execute and the receipt names what
// they ran by its digest.
package bridge

import (
	"context"
	"os"
	"strings"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/worker/stage/internal/staged"
)

// holdPrefix prefixes a staged copy's digest in the runs' holds.
const holdPrefix = "bridge:"

// Bridges stages one worker's bridge binary: the file at src, copied under
// dir. Safe for concurrent use.
type Bridges struct {
	src    string
	stager *staged.Stager
	holds  *stage.Holds
}

// New returns the Bridges staging the binary at src (the jetcrew binary,
// which runs as the bridge under the name "bridge", or a separate
// jetcrew-bridge) into dir (mode 0755, created when first needed); holds
// is the worker's registry of what live runs hold.
func New(src, dir string, holds *stage.Holds) *Bridges {
	return &Bridges{src: src, stager: staged.New(dir, ""), holds: holds}
}

// Stage returns the staged copy's host path and its SHA-256 (hex), staging
// it when the source changed. It refuses a source that is missing, not a
// regular file or dynamically linked, saying how to fix it.
func (b *Bridges) Stage() (path, digest string, err error) { return b.stager.Stage(b.src) }

// Hold holds the staged copy with digest (hex) until the returned release
// is called, as a run's bridge stage does: GC spares it. A warm container
// (worker/warm) holds the copy it mounts.
func (b *Bridges) Hold(digest string) (release func()) { return b.holds.Hold(holdPrefix + digest) }

// GC removes the staged copies no live run holds (the current one stays).
func (b *Bridges) GC() error { return b.stager.GC(b.holds.Keys(holdPrefix)) }

// Drain removes every staged copy and their directory when it is then
// empty (the worker stops; no run holds any).
func (b *Bridges) Drain() {
	_ = b.stager.GC(nil)
	_ = os.Remove(b.stager.Dir())
}

// For returns the stage of one run.
func (b *Bridges) For(*stage.Run) *Stage { return &Stage{b: b} }

// Stage mounts the staged bridge in one run's container.
type Stage struct {
	b       *Bridges
	digest  string
	release func()
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter = (*Stage)(nil)
	_ stage.Adopter    = (*Stage)(nil)
	_ stage.Noter      = (*Stage)(nil)
	_ stage.Releaser   = (*Stage)(nil)
)

// Name returns "bridge".
func (s *Stage) Name() string { return "bridge" }

// Prestart stages the bridge and mounts it read-only at
// messages.ContainerBridgePath (receipt role "bridge", its digest). A bridge
// that cannot be staged fails the run with that reason.
func (s *Stage) Prestart(_ context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	path, digest, err := s.b.Stage()
	if err != nil {
		return err
	}
	s.digest = digest
	s.release = req.Run.Holds.Hold(holdPrefix + digest)
	resp.Mounts = append(resp.Mounts, Mount(path, digest))
	return nil
}

// Adopt keeps the receipt's bridge digest of the adopted run. The
// container mounts the copy the worker that started it staged (a file
// mount keeps it whatever becomes of that worker's state directory):
// nothing is staged or held here.
func (s *Stage) Adopt(_ context.Context, req *stage.AdoptRequest, _ *stage.PrestartResponse) error {
	if r := req.State.Receipt; r != nil {
		s.digest = strings.TrimPrefix(r.BridgeDigest, "sha256:")
	}
	return nil
}

// Mount is the mount of the bridge staged at path with SHA-256 digest
// (hex): read-only at messages.ContainerBridgePath, receipt role "bridge".
func Mount(path, digest string) stage.Mount {
	return stage.Mount{
		Mount: jail.Mount{Source: path, Target: messages.ContainerBridgePath, ReadOnly: true},
		Role:  messages.MountRoleBridge, Digest: "sha256:" + digest,
	}
}

// Note names the staged bridge in the receipt (BridgeDigest).
func (s *Stage) Note(st *messages.RunState) {
	if s.digest != "" && st.Receipt != nil {
		st.Receipt.BridgeDigest = "sha256:" + s.digest
	}
}

// Release gives up the run's hold on its copy (GC may then remove it).
func (s *Stage) Release(*stage.ReleaseRequest) {
	if s.release != nil {
		s.release()
	}
}
