package tree

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// ErrRunNotFound is what Deps.RunState returns, wrapped, for a run without
// a recorded state.
var ErrRunNotFound = errors.New("run not found")

// errFromRefused wraps every reason an earlier run cannot be a run's
// workspace (workspace.from): retrying cannot help, the run fails.
var errFromRefused = errors.New("workspace from refused")

// FromTimeout bounds building one snapshot from an earlier run's result
// (reading its state, its snapshot and bundle, building and storing).
const FromTimeout = 5 * time.Minute

// fromCacheName returns the name, in the workspace bucket, of the cache
// object of the snapshot built from run runID's result, its snapshot
// snapshot and its bundle of hex SHA-256 bundleSum: "from/<hex SHA-256 of
// the three, newline-separated>". A replay of the run (another bundle)
// has another name.
func fromCacheName(runID, snapshot, bundleSum string) string {
	sum := sha256.Sum256([]byte(runID + "\n" + snapshot + "\n" + bundleSum))
	return "from/" + hex.EncodeToString(sum[:])
}

// refuseFrom returns an error wrapping errFromRefused.
func refuseFrom(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFromRefused, fmt.Sprintf(format, args...))
}

// fromResolution is the snapshot built from an earlier run's result.
type fromResolution struct {
	ref    messages.WorkspaceRef
	commit string
	built  bool
}

// resolveFromWorkspace turns a request's earlier run (workspace.from) into
// the snapshot the run stages (docs/workspaces.md, "Start from a result").
// The earlier run must have a recorded state, be final, in the run's pool,
// with a workspace result that is complete (no error) and records its
// snapshot; the profiles must allow it (profile.CheckFrom: the run's
// from_profiles, the earlier run's feeds). The snapshot is its snapshot
// when it changed nothing, else one built by workspace.DeriveSnapshot from
// its snapshot (downloaded and checked like any) and its bundle (checked
// against the size and SHA-256 its state records), stored in the
// workspace bucket under its digest with a cache object naming it
// (fromCacheName), so the next run from the same result reuses it. Runs
// from the same result at the same time share one build. A refusal fails
// the run (errFromRefused, or a refused snapshot or bundle); a store that
// cannot be reached is transient.
func (s *Stage) resolveFromWorkspace(ctx context.Context, prof *profile.Profile, srcID string) (messages.WorkspaceRef, error) {
	if s.t.runState == nil {
		return messages.WorkspaceRef{}, refuseFrom("this worker cannot read run states")
	}
	ctx, cancel := context.WithTimeout(ctx, FromTimeout)
	defer cancel()
	src, err := s.t.runState(ctx, srcID)
	switch {
	case errors.Is(err, ErrRunNotFound):
		return messages.WorkspaceRef{}, refuseFrom("run %s not found", srcID)
	case err != nil:
		return messages.WorkspaceRef{}, stage.Transient(fmt.Errorf("read the state of run %s: %w", srcID, err))
	}
	req := s.run.Request
	s.fromState = &src
	var srcProf *profile.Profile
	if p, ok := s.t.profiles.Load()[src.Profile]; ok {
		srcProf = &p
	}
	res := src.WorkspaceResult
	switch {
	case srcID == req.ID:
		return messages.WorkspaceRef{}, refuseFrom("a run cannot start from itself")
	case !src.State.Final():
		return messages.WorkspaceRef{}, refuseFrom("run %s is %s: a run starts only from a finished run's result", srcID, src.State)
	case src.Pool != req.Pool:
		return messages.WorkspaceRef{}, refuseFrom("run %s ran in pool %q, not %q: a run starts only from runs of its own pool", srcID, src.Pool, req.Pool)
	}
	if err := prof.CheckFrom(src.Profile, srcProf); err != nil {
		return messages.WorkspaceRef{}, fmt.Errorf("%w: %w", errFromRefused, err)
	}
	switch {
	case res == nil:
		return messages.WorkspaceRef{}, refuseFrom("run %s has no workspace result (its request named no workspace, or it failed before its workspace was staged)", srcID)
	case res.Error != "":
		return messages.WorkspaceRef{}, refuseFrom("run %s's workspace result is partial or missing: %s", srcID, res.Error)
	case res.Snapshot == "":
		return messages.WorkspaceRef{}, refuseFrom("run %s's result does not record its snapshot (captured by an older worker)", srcID)
	case res.Base == "":
		return messages.WorkspaceRef{}, refuseFrom("run %s: %v", srcID, workspace.ErrNotGitSource)
	}
	baseRef := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(res.Snapshot), Digest: res.Snapshot}
	if baseRef.Validate() != nil {
		return messages.WorkspaceRef{}, refuseFrom("run %s's result records snapshot %q", srcID, res.Snapshot)
	}
	var bundle *messages.ResultObject
	for i, o := range res.Objects {
		if strings.HasSuffix(o.Name, "/"+messages.ResultBundle) {
			bundle = &res.Objects[i]
		}
	}
	start := time.Now()
	var r fromResolution
	if bundle == nil {
		// The run changed nothing: its tree at its end is its snapshot.
		r = fromResolution{ref: baseRef, commit: res.Head}
	} else {
		v, err, _ := s.t.from.Do(fromCacheName(srcID, res.Snapshot, bundle.SHA256), func() (any, error) {
			return s.buildFrom(ctx, srcID, baseRef, *bundle)
		})
		if err != nil {
			if errors.Is(err, errFromRefused) || isSnapshotRefused(err) || errors.Is(err, workspace.ErrNotGitSource) {
				return messages.WorkspaceRef{}, err
			}
			return messages.WorkspaceRef{}, stage.Transient(fmt.Errorf("build the workspace from run %s: %w", srcID, err))
		}
		r = v.(fromResolution)
	}
	s.from = &messages.FromSource{Run: srcID, Commit: r.commit, Digest: r.ref.Digest}
	s.run.Log.Info().Str("from_run", srcID).Str("commit", r.commit).Str("snapshot", r.ref.Digest).
		Bool("built", r.built).Dur("resolved_in", time.Since(start)).Msg("workspace from an earlier run resolved")
	return r.ref, nil
}

// buildFrom returns the snapshot built from run srcID's snapshot baseRef
// and bundle: the one its cache object names when the workspace bucket
// holds its bytes, else built and stored (with the cache object).
func (s *Stage) buildFrom(ctx context.Context, srcID string, baseRef messages.WorkspaceRef, bundle messages.ResultObject) (fromResolution, error) {
	t := s.t
	ws, results, err := t.stores(ctx)
	if err != nil {
		return fromResolution{}, err
	}
	cacheName := fromCacheName(srcID, baseRef.Digest, bundle.SHA256)
	if ent, ok := readGitCache(ctx, ws, cacheName); ok {
		ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(ent.Digest), Digest: ent.Digest}
		if workspace.Stored(ctx, ws, ref) {
			return fromResolution{ref: ref, commit: ent.Commit}, nil
		}
	}
	base, err := s.cachedSnapshot(ctx, baseRef) // digest checked, scanned, held by the run
	if err != nil {
		return fromResolution{}, err
	}
	dir, done, err := t.scratchDir("from-")
	if err != nil {
		return fromResolution{}, err
	}
	defer done()
	bundlePath := filepath.Join(dir, "bundle")
	if err := saveResultObject(ctx, results, bundle, 2*t.cfg.MaxBytes+1<<20, bundlePath); err != nil {
		return fromResolution{}, err
	}
	// A build takes one of the worker's git fetch slots: its memory is
	// that of a fetch's snapshot (the derived .git's pack, compressed).
	f, done, err := t.snapshotFile(ctx, dir)
	if err != nil {
		return fromResolution{}, err
	}
	defer done()
	info, err := deriveFrom(base, bundlePath, srcID, f, workspace.FromOptions{MaxBytes: t.cfg.MaxBytes, MaxFiles: t.cfg.MaxFiles, TempDir: dir})
	if err != nil {
		return fromResolution{}, fmt.Errorf("%w: the result of run %s: %w", errFromRefused, srcID, err)
	}
	up, err := workspace.StoreSnapshot(ctx, ws, f, info)
	if err != nil {
		return fromResolution{}, err
	}
	if info.Head != "" {
		ent, _ := json.Marshal(gitCacheEntry{Digest: info.Digest, Commit: info.Head})
		if _, err := ws.PutBytes(ctx, cacheName, ent); err != nil {
			// Only the cache is lost: the next run from this result builds again.
			t.log.Warn().Err(err).Str("from_run", srcID).Msg("store the cache object of a workspace built from a run")
		}
	}
	return fromResolution{ref: up.Ref, commit: info.Head, built: true}, nil
}

// deriveFrom is workspace.DeriveSnapshot of the snapshot file base and
// the bundle file bundle into f.
func deriveFrom(base, bundle, srcID string, f io.Writer, o workspace.FromOptions) (workspace.Info, error) {
	bf, err := os.Open(base)
	if err != nil {
		return workspace.Info{}, err
	}
	defer bf.Close()
	bu, err := os.Open(bundle)
	if err != nil {
		return workspace.Info{}, err
	}
	defer bu.Close()
	return workspace.DeriveSnapshot(bf, bu, srcID, f, o)
}

// readResultObject reads result object o from the result bucket, at most
// max bytes, and checks it against the size and SHA-256 its run's state
// records. A missing object (expired) or one that does not match refuses
// the source.
func readResultObject(ctx context.Context, results jetstream.ObjectStore, o messages.ResultObject, max int64) ([]byte, error) {
	var b bytes.Buffer
	if err := copyResultObject(ctx, results, o, max, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// saveResultObject is readResultObject into a new file at path, streamed:
// a bundle is never held in memory whole.
func saveResultObject(ctx context.Context, results jetstream.ObjectStore, o messages.ResultObject, max int64, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copyResultObject(ctx, results, o, max, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyResultObject copies result object o to w (readResultObject).
func copyResultObject(ctx context.Context, results jetstream.ObjectStore, o messages.ResultObject, max int64, w io.Writer) error {
	if o.Size > max {
		return refuseFrom("result object %s is %d bytes, over %d", o.Name, o.Size, max)
	}
	r, err := results.Get(ctx, o.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return refuseFrom("result object %s is gone (expired?)", o.Name)
	}
	if err != nil {
		return err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, o.Size+1))
	if err != nil {
		return err
	}
	if n != o.Size || hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
		return refuseFrom("result object %s does not match its run's record (%d bytes, want %d)", o.Name, n, o.Size)
	}
	return nil
}
