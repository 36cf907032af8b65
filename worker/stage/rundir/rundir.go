// Package rundir is the stage that stages a run's directory on the
// worker's host, StateDir/r/<hash>, mounted read-only at /run/jetcrew
// (messages.ContainerRunDir): mcp.json, the backend's files (prompt,
// CLI settings, files to seed HOME with) and, put there by later stages,
// the coordination and egress sockets. Directories of finished runs that
// held nothing but mcp.json go back to a pool (pool.go) for later runs.
package rundir

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// holdPrefix prefixes a run directory's path in the runs' holds.
const holdPrefix = "dir:"

// Dirs makes one worker's run directories under root (StateDir/r) and
// pools finished ones under poolRoot (StateDir/p). Both must exist, mode
// 0700 (the worker's state directory check makes them so). Safe for
// concurrent use.
type Dirs struct {
	root  string
	pool  *pool
	holds *stage.Holds
	log   zerolog.Logger
}

// New returns the Dirs of a worker: run directories under root, at most
// poolMax idle ones pooled under poolRoot (0: none), holds the worker's
// registry of what live runs hold.
func New(root, poolRoot string, poolMax int, holds *stage.Holds, log zerolog.Logger) *Dirs {
	d := &Dirs{root: root, holds: holds, log: log}
	if poolMax > 0 {
		d.pool = newPool(poolRoot, poolMax)
	}
	return d
}

// Path returns the host directory named key under root: a run's is
// root/<stage.Run.Key>, short enough for a unix socket path. Every
// delivery (attempt) has its own, so an attempt winding down never removes
// what the next one staged.
func (d *Dirs) Path(key string) string { return filepath.Join(d.root, key) }

// Sweep removes the run directories (and their sockets) no live run holds
// and older than grace: left over by a crash of this worker's process.
func (d *Dirs) Sweep(grace time.Duration) {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(d.root, e.Name())
		info, err := e.Info()
		if err != nil || d.holds.Held(holdPrefix+dir) || time.Since(info.ModTime()) < grace {
			continue
		}
		d.log.Info().Str("dir", dir).Msg("removing a stale run directory")
		if err := os.RemoveAll(dir); err != nil {
			d.log.Warn().Err(err).Str("dir", dir).Msg("remove stale run directory")
		}
	}
}

// Drain removes every pooled directory, and the pool's root and run
// directories' root when they are then empty (the worker stops).
func (d *Dirs) Drain() {
	d.pool.drain()
	_ = os.Remove(d.root)
}

// Warm stages a new run directory named key (one per warm container, see
// worker/warm) holding mcp.json, held until the returned release is
// called, which also removes it when remove is set; a run that claims the
// container takes the directory over (stage.Placement.Dir), moving it.
func (d *Dirs) Warm(key string) (path string, release func(remove bool), err error) {
	path = d.Path(key)
	unhold := d.holds.Hold(holdPrefix + path)
	if err := coordination.StageRunDir(path); err != nil {
		unhold()
		return "", nil, fmt.Errorf("warm container's run directory: %w", err)
	}
	release = func(remove bool) {
		if remove {
			if err := os.RemoveAll(path); err != nil {
				d.log.Warn().Err(err).Str("dir", path).Msg("remove warm container's directory")
			}
		}
		unhold()
	}
	return path, release, nil
}

// For returns the stage of one run.
func (d *Dirs) For(run *stage.Run) *Stage {
	return &Stage{d: d, path: d.Path(run.Key())}
}

// Stage is one run's directory. It is the run's stage.Dir.
type Stage struct {
	d    *Dirs
	path string
	// sock is what a pooled directory kept open (the coordination
	// stage's socket, bound in it), until that stage takes it (Kept) or
	// gives it back (Keep).
	sock io.Closer
	// poolable is set while the directory holds nothing the worker staged
	// but mcp.json (and the coordination socket): it may then go back to
	// the pool when the run ends.
	poolable bool
	release  func()
}

// The hooks Stage implements, declared so that a signature drifting from
// the contract fails to build (worker/runner's TestStageHooksImplemented
// holds this list to exactly the hooks implemented).
var (
	_ stage.Prestarter = (*Stage)(nil)
	_ stage.Adopter    = (*Stage)(nil)
	_ stage.Releaser   = (*Stage)(nil)
	_ stage.Dir        = (*Stage)(nil) // not a hook: the directory later stages use
)

// Name returns "run-dir".
func (s *Stage) Name() string { return "run-dir" }

// Path returns the directory's host path.
func (s *Stage) Path() string { return s.path }

// Kept returns, once, what a pooled directory kept open: the coordination
// stage's socket; nil when none.
func (s *Stage) Kept() io.Closer {
	k := s.sock
	s.sock = nil
	return k
}

// Keep hands back what is still open in the directory (the coordination
// stage's socket), for the pool.
func (s *Stage) Keep(k io.Closer) { s.sock = k }

// Taint keeps the directory out of the pool.
func (s *Stage) Taint() { s.poolable = false }

// Prestart stages the run's directory: a pooled one renamed into place, or
// a new one with mcp.json (coordination.StageRunDir), then the backend's
// files, every file 0444 in directories 0755. It mounts the directory
// read-only at messages.ContainerRunDir (receipt role "run-dir", the
// digest of the staged files). A run that claimed a warm container takes
// that container's directory instead (stage.Placement.Dir), renamed to
// the run's path. A directory that cannot be staged refuses the run.
func (s *Stage) Prestart(_ context.Context, req *stage.PrestartRequest, resp *stage.PrestartResponse) error {
	run := req.Run
	s.release = run.Holds.Hold(holdPrefix + s.path)
	if pl := run.Placement; pl.Warm() {
		// A warm container's directory, which it mounts: moved to the
		// run's path (the mount follows it), never pooled afterwards.
		if err := rename(pl.Dir, s.path); err != nil {
			return fmt.Errorf("run directory cannot be taken from its warm container: %w", err)
		}
		if err := stageFiles(s.path, run.Plan.Files); err != nil {
			return err
		}
		resp.Dir = s
		resp.Mounts = append(resp.Mounts, Mount(s.path, run.Plan))
		return nil
	}
	took, sock := s.d.pool.take(s.path)
	if !took {
		if err := coordination.StageRunDir(s.path); err != nil {
			return fmt.Errorf("run directory cannot be staged: %w", err)
		}
	}
	s.sock = sock
	if sock != nil && !run.Profile.CoordinationOn() {
		// A socket kept for coordination runs has no use here.
		_ = s.Kept().Close()
		_ = os.Remove(filepath.Join(s.path, messages.SocketName))
	}
	s.poolable = len(run.Plan.Files) == 0
	if err := stageFiles(s.path, run.Plan.Files); err != nil {
		return err
	}
	resp.Dir = s
	resp.Mounts = append(resp.Mounts, Mount(s.path, run.Plan))
	return nil
}

// Adopt takes over the directory the run's container mounts
// (stage.AdoptRequest.RunDir), staged by the worker that started the run
// (in its state directory, which may be another than this worker's): held
// until Release, which removes it, never pools it. It must be a real
// directory (not a link) of the worker's user.
func (s *Stage) Adopt(_ context.Context, req *stage.AdoptRequest, resp *stage.PrestartResponse) error {
	if req.RunDir == "" {
		return fmt.Errorf("the container mounts no run directory at %s", messages.ContainerRunDir)
	}
	fi, err := os.Lstat(req.RunDir)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("run directory %s is not a directory", req.RunDir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("run directory %s belongs to user %d, not this worker's", req.RunDir, st.Uid)
	}
	s.path = req.RunDir
	s.release = req.Run.Holds.Hold(holdPrefix + s.path)
	resp.Dir = s
	return nil
}

// Mount is the mount of the run directory at path staged for plan:
// read-only at messages.ContainerRunDir, receipt role "run-dir", the
// digest of its files.
func Mount(path string, plan profile.Plan) stage.Mount {
	return stage.Mount{
		Mount: jail.Mount{Source: path, Target: messages.ContainerRunDir, ReadOnly: true},
		Role:  messages.MountRoleRunDir, Digest: Digest(plan),
	}
}

// stageFiles writes the plan's files into dir: each 0444 (then its own
// mode), in directories 0755 whatever the worker's umask.
func stageFiles(dir string, files []profile.StagedFile) error {
	for _, f := range files {
		rel, ok := strings.CutPrefix(f.Path, messages.ContainerRunDir+"/")
		if !ok {
			return fmt.Errorf("backend file %s is outside %s", f.Path, messages.ContainerRunDir)
		}
		host := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
		// MkdirAll's mode passes through the worker's umask (a hardened
		// service may run with 077): set every new directory's mode so the
		// run's non-root user can read the file.
		for d := filepath.Dir(host); d != dir && strings.HasPrefix(d, dir); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				return fmt.Errorf("stage %s: %w", f.Path, err)
			}
		}
		_ = os.Remove(host) // a leftover 0444 file from an earlier delivery
		if err := os.WriteFile(host, f.Data, 0o444); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
		if err := os.Chmod(host, f.Mode); err != nil {
			return fmt.Errorf("stage %s: %w", f.Path, err)
		}
	}
	return nil
}

// Release removes the directory: into the pool, with the socket
// coordination gave back, when nothing of the run can reach it any more
// (its container was removed) and it holds only mcp.json and that socket;
// else for good.
func (s *Stage) Release(req *stage.ReleaseRequest) {
	defer func() {
		if s.release != nil {
			s.release()
		}
	}()
	if s.release == nil {
		return // never staged
	}
	if req.Leave {
		// The container mounts it, and the successor adopts it.
		if sock := s.Kept(); sock != nil {
			_ = sock.Close()
		}
		return
	}
	sock := s.Kept()
	if s.poolable && req.ContainerGone && s.d.pool.put(s.path, sock) {
		return
	}
	if sock != nil {
		_ = sock.Close()
	}
	if err := coordination.RemoveRunDir(s.path); err != nil {
		req.Run.Log.Warn().Err(err).Msg("remove run directory; the reconciler will retry")
	}
}

// Digest returns "sha256:<hex>" over the files the plan stages in the run
// directory (path, mode, length and bytes of each, by path) and the MCP
// servers its mcp.json names: the run directory's digest in a receipt.
func Digest(plan profile.Plan) string {
	h := sha256.New()
	files := slices.Clone(plan.Files)
	slices.SortFunc(files, func(a, b profile.StagedFile) int { return strings.Compare(a.Path, b.Path) })
	var n [8]byte
	for _, f := range files {
		io.WriteString(h, f.Path+"\x00"+f.Mode.String()+"\x00")
		binary.BigEndian.PutUint64(n[:], uint64(len(f.Data)))
		h.Write(n[:])
		h.Write(f.Data)
	}
	io.WriteString(h, strings.Join(plan.MCPServers, "\x00"))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
