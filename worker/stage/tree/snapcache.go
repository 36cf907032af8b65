package tree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/internal/privdir"
	"github.com/jetcrew/jetcrew/workspace"
)

// snapshotCacheDir is the cache of downloaded snapshots, StateDir/snap:
// one file per digest, "<64 hex>.tar", mode 0444, checked (digest, caps,
// header scan) before it is renamed into place. Ten runs on one snapshot
// download it once; the reconciler removes a file no delivery uses once
// it is OrphanGrace old (each use renews its time).
func (t *Trees) snapshotCacheDir() string { return filepath.Join(t.stateDir, "snap") }

// cachedSnapshot returns the cached file of ref's snapshot, downloading it
// when absent: into a temporary file, its digest checked (workspace.
// Download) and its headers scanned (workspace.Scan, nothing written from
// the archive), then renamed into place read-only. The run holds the file
// until its Release. A cached file serves a delivery only
// while the object is still stored with ref's digest (one info request).
// A refused snapshot's errors wrap
// workspace's ErrSnapshotMissing, ErrDigestMismatch, ErrTooLarge or
// ErrBadArchive.
func (s *Stage) cachedSnapshot(ctx context.Context, ref messages.WorkspaceRef) (string, error) {
	t, cfg := s.t, s.t.cfg
	hexDigest, ok := strings.CutPrefix(ref.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 || strings.Trim(hexDigest, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%w: digest %q is not sha256:<64 hex digits>", workspace.ErrDigestMismatch, ref.Digest)
	}
	dir := t.snapshotCacheDir()
	path := filepath.Join(dir, hexDigest+".tar")
	// Held before its time is renewed: a sweep that finds it unheld
	// removes it under the registry's lock, before this hold.
	s.hold(holdSnapshot + path)
	now := time.Now()
	if err := os.Chtimes(path, now, now); err == nil {
		// Cached: the object must still be in the bucket, under the same
		// digest, or the run fails as if nothing were cached (an operator
		// who deletes a snapshot withdraws it).
		if err := t.snapshotStillStored(ctx, ref, cfg); err != nil {
			return "", err
		}
		return path, nil
	}
	store, err := t.fetchSnapshot(ctx, ref, cfg, dir, path)
	if err != nil {
		return "", err
	}
	if store != nil {
		s.storeChecked(ctx, store, path)
	}
	return path, nil
}

// storeMax bounds the store of a checked snapshot into the workspace
// bucket (a put of up to the worker's MaxBytes).
const storeMax = 10 * time.Minute

// storeChecked runs store, the put of the checked snapshot at path into
// the workspace bucket, once the run's agent started (agentStarted), beside
// the run: neither the agent's start nor its in-jail unpack waits for, or
// shares the CPU with, a second 100 MiB put. The run holds path until
// Release, and waitStored waits for the put before the capture and in
// Release, so a run whose state is final has its snapshot in the
// workspace bucket. A failed put is logged; the snapshot stays in the
// uploads bucket, where the next fetch finds it (workspace.Fetch).
func (s *Stage) storeChecked(ctx context.Context, store workspace.StoreChecked, path string) {
	done := make(chan struct{})
	begin := func() {
		go func() {
			defer close(done)
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeMax)
			defer cancel()
			start := time.Now()
			if err := store(ctx, path); err != nil {
				s.run.Log.Warn().Err(err).Msg("store the checked snapshot; it stays in the uploads bucket")
				return
			}
			s.run.Log.Debug().Dur("stored_in", time.Since(start)).Msg("checked snapshot stored")
		}()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored = append(s.stored, done)
	if s.begun {
		begin()
		return
	}
	s.stores = append(s.stores, begin)
}

// waitStored waits for a snapshot still streaming in (it may add a put),
// begins the puts storeChecked deferred, if the agent's start did not,
// and waits for them.
func (s *Stage) waitStored() {
	if s.streamDone != nil {
		<-s.streamDone
	}
	s.agentStarted()
	s.mu.Lock()
	stored := slices.Clone(s.stored)
	s.mu.Unlock()
	for _, done := range stored {
		<-done
	}
}

// startedWaitMax bounds awaitStarted's wait for the agent's start after
// the gate opened: past it what waits for that start begins anyway.
const startedWaitMax = 30 * time.Second

// awaitStarted waits, in the background, until `jetcrew workspace exec`
// connects to the gate's started socket (the tree is unpacked, the agent
// starts), startedWaitMax has passed or Release closed the socket, and
// then calls agentStarted.
func (s *Stage) awaitStarted() {
	ln := s.rw.started
	if ln == nil {
		s.agentStarted()
		return
	}
	_ = ln.SetDeadline(time.Now().Add(startedWaitMax))
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.Close()
		}
		_ = ln.Close()
		s.agentStarted()
	}()
}

// agentStarted, once, begins what waited for the run's agent to start:
// the puts of checked snapshots (storeChecked) and, for a warm
// container's workspace, the pool's refill (stage.WarmWorkspace.Started).
func (s *Stage) agentStarted() {
	s.agentStartOnce.Do(func() {
		s.mu.Lock()
		s.begun = true
		for _, begin := range s.stores {
			begin()
		}
		s.stores = nil
		s.mu.Unlock()
		if ww := s.run.Placement.Workspace; ww != nil && ww.Started != nil {
			ww.Started()
		}
	})
}

// stageSnapshot puts ref's snapshot into rw's input directory
// (JailSnapshotPath), held by the run, and records it in rw.snapshot. A
// cached snapshot, and a git source's (its commit is checked first), is
// linked in whole, the gate's workspace.SnapshotCheckedFile written at
// once. Any other is streamed in (streamSnapshot): the refusals its
// buckets' records show (missing, too large, another digest:
// workspace.OpenStream) fail the run here, before any container runs on
// it; the bytes download into the cache beside the run's start, `jetcrew
// workspace exec` unpacking them as they arrive, and the gate says when
// they are whole and checked, or refused.
func (s *Stage) stageSnapshot(ctx context.Context, ref messages.WorkspaceRef, rw *runWorkspace) error {
	t := s.t
	in := filepath.Join(rw.in(), "snapshot.tar")
	hexDigest, ok := strings.CutPrefix(ref.Digest, "sha256:")
	path := filepath.Join(t.snapshotCacheDir(), hexDigest+".tar")
	if _, err := os.Lstat(path); err == nil || s.git != nil || !ok || t.careful(ref.Digest) {
		path, err := s.cachedSnapshot(ctx, ref)
		if err != nil {
			return stageError(err, isSnapshotRefused(err))
		}
		if s.git != nil {
			if err := s.verifyGitSnapshot(ctx, path, ref, s.git.Commit, s.gitCache); err != nil { // git.go
				return stageError(err, errors.Is(err, workspace.ErrWrongCommit) || isSnapshotRefused(err))
			}
		}
		rw.snapshot = path
		if err := os.Link(path, in); err != nil {
			return stageError(err, false)
		}
		if err := rw.snapshotChecked(); err != nil {
			return stageError(err, false)
		}
		return nil
	}
	if len(hexDigest) != 64 || strings.Trim(hexDigest, "0123456789abcdef") != "" {
		err := fmt.Errorf("%w: digest %q is not sha256:<64 hex digits>", workspace.ErrDigestMismatch, ref.Digest)
		return stageError(err, true)
	}
	ws, _, err := t.stores(ctx)
	if err != nil {
		return stageError(err, false)
	}
	st, err := workspace.OpenStream(ctx, ws, ref, t.cfg.MaxBytes)
	if err != nil {
		return stageError(err, isSnapshotRefused(err))
	}
	dir := t.snapshotCacheDir()
	if err := privdir.Ensure(dir); err != nil {
		return stageError(err, false)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return stageError(err, false)
	}
	// Readable by the run's user from the start, through the link (the
	// cache directory itself is the worker's alone); written through tmp.
	if err := tmp.Chmod(0o444); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return stageError(err, false)
	}
	if err := os.Link(tmp.Name(), in); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return stageError(err, false)
	}
	// Held like a cached one: the sweep spares it, and the rename below
	// makes it one.
	s.hold(holdSnapshot + path)
	rw.snapshot = path
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), objectReadMax)
	s.streamCancel, s.streamDone = cancel, make(chan struct{})
	go func() {
		defer close(s.streamDone)
		defer cancel()
		s.streamSnapshot(sctx, ref, st, tmp, path)
	}()
	return nil
}

// objectReadMax bounds a snapshot's download streamed in beside the run.
const objectReadMax = time.Hour

// streamSnapshot downloads st into tmp (linked into the run's input
// directory, where `jetcrew workspace exec` follows it) and, its bytes
// checked against the digest, writes the gate's
// workspace.SnapshotCheckedFile: exec goes on, applying the header rules
// itself as it unpacks. Only then are the headers scanned
// (workspace.Scan, on the whole file: mostly seeks), beside the agent's
// start, and a snapshot that passes is renamed into the cache at path
// (the cache holds scanned snapshots only: the worker reads a cached one
// on the host for --from) and its put into the workspace bucket begins
// with the agent (storeChecked). A download that fails writes
// workspace.SnapshotRefusedFile instead, its kind workspace.UnpackRefused
// for a snapshot refused for good (its bytes are not the digest's) and
// workspace.UnpackFetch for one worth a retry (the store failed, the
// workspace bucket's copy is broken: the retry fetches it with
// workspace.Fetch, which takes the upload's).
func (s *Stage) streamSnapshot(ctx context.Context, ref messages.WorkspaceRef, st *workspace.Stream, tmp *os.File, path string) {
	rw, cfg := s.rw, s.t.cfg
	start := time.Now()
	store, err := st.ReadTo(ctx, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		kind := workspace.UnpackFetch
		if isSnapshotRefused(err) && !errors.Is(err, workspace.ErrStreamBroken) {
			kind = workspace.UnpackRefused
		}
		if errors.Is(err, workspace.ErrStreamBroken) {
			s.t.setCareful(ref.Digest)
		}
		s.run.Log.Warn().Err(err).Str("kind", kind).Msg("workspace snapshot refused while streamed in")
		if werr := rw.gateFile(workspace.SnapshotRefusedFile, kind+"\n"+err.Error()); werr != nil {
			s.run.Log.Warn().Err(werr).Msg("write the gate's refusal")
		}
		return
	}
	s.t.clearCareful(ref.Digest)
	if err := rw.snapshotChecked(); err != nil {
		s.run.Log.Warn().Err(err).Msg("write the gate's checked file")
	}
	s.run.Log.Info().Str("workspace", ref.Name).Dur("downloaded_in", time.Since(start)).Int64("bytes", st.Size()).Msg("workspace snapshot streamed in")
	if err := scanFile(tmp.Name(), cfg); err != nil {
		// The run's exec refuses it too, by the same rules; it is
		// neither cached nor stored.
		_ = os.Remove(tmp.Name())
		s.run.Log.Warn().Err(err).Msg("workspace snapshot not cached: its headers fail the scan")
		return
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		s.run.Log.Warn().Err(err).Msg("cache the workspace snapshot")
		return
	}
	if store != nil {
		s.storeChecked(ctx, store, path)
	}
}

// scanFile scans the snapshot tar at path (workspace.Scan) with cfg's
// caps.
func scanFile(path string, cfg Config) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return workspace.Scan(f, workspace.UnpackOptions{MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles})
}

// stopStream stops a snapshot still streaming in and waits for it.
func (s *Stage) stopStream() {
	if s.streamCancel != nil {
		s.streamCancel()
		<-s.streamDone
	}
}

// careful reports whether a streamed download of digest broke off
// (workspace.ErrStreamBroken) on this worker since its last success: its
// next is fetched whole first (workspace.Fetch takes the upload's copy of
// a broken one).
func (t *Trees) careful(digest string) bool {
	_, ok := t.broken.Load(digest)
	return ok
}

func (t *Trees) setCareful(digest string)   { t.broken.Store(digest, true) }
func (t *Trees) clearCareful(digest string) { t.broken.Delete(digest) }

// snapshotChecked says the snapshot in rw's input directory is whole and
// checked: workspace.SnapshotCheckedFile in the gate (exec goes on) and
// workspace.PreloadFile beside the snapshot (the capture container may
// read it ahead of the capture).
func (rw *runWorkspace) snapshotChecked() error {
	if err := os.WriteFile(filepath.Join(rw.in(), workspace.PreloadFile), nil, 0o444); err != nil {
		return err
	}
	return rw.gateFile(workspace.SnapshotCheckedFile, "")
}

// gateFile writes the file name, holding data, into rw's gate directory,
// read-only (0444), by a rename so it never appears half written.
func (rw *runWorkspace) gateFile(name, data string) error {
	tmp := filepath.Join(rw.gate(), "."+name)
	if err := os.WriteFile(tmp, []byte(data), 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(rw.gate(), name))
}

// snapshotStillStored checks that ref's object is still in the workspace
// bucket with ref's digest (workspace.CheckStored).
func (t *Trees) snapshotStillStored(ctx context.Context, ref messages.WorkspaceRef, cfg Config) error {
	ws, _, err := t.stores(ctx)
	if err != nil {
		return err
	}
	_, err = workspace.CheckStored(ctx, ws, ref, cfg.MaxBytes)
	return err
}

// fetchSnapshot downloads, checks and scans ref's snapshot into path, and
// returns the store of its bytes into the workspace bucket still to do
// (workspace.FetchLater), if any.
func (t *Trees) fetchSnapshot(ctx context.Context, ref messages.WorkspaceRef, cfg Config, dir, path string) (workspace.StoreChecked, error) {
	ws, _, err := t.stores(ctx)
	if err != nil {
		return nil, err
	}
	if err := privdir.Ensure(dir); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone after the rename
	store, err := workspace.FetchLater(ctx, ws, ref, tmp.Name(), cfg.MaxBytes)
	if err != nil {
		return nil, err
	}
	if err := scanFile(tmp.Name(), cfg); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return nil, err
	}
	return store, os.Rename(tmp.Name(), path)
}

// removeStaleSnapshots removes cached snapshots no live run holds whose
// last use is grace old, leftover temporary files, and staged tools no
// live run holds (the current one stays).
func (t *Trees) removeStaleSnapshots(grace time.Duration) {
	dir := t.snapshotCacheDir()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		// Checked and removed under the registry's lock: a run holds the
		// file before it renews its time.
		t.holds.IfUnheld(holdSnapshot+path, func() {
			info, err := os.Lstat(path)
			if err != nil || time.Since(info.ModTime()) < grace {
				return
			}
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.log.Warn().Err(err).Str("file", path).Msg("remove cached snapshot")
				return
			}
			if key, ok := strings.CutSuffix(e.Name(), ".tar"); ok {
				t.forgetVerified(key)
			}
		})
	}
	if err := t.tools.GC(t.holds.Keys(holdTool)); err != nil {
		t.log.Warn().Err(err).Msg("remove unused staged workspace tools")
	}
}
