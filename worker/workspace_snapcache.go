package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// snapshotCacheDir is the cache of downloaded snapshots, StateDir/snap:
// one file per digest, "<64 hex>.tar", mode 0444, checked (digest, caps,
// header scan) before it is renamed into place. Ten runs on one snapshot
// download it once; the reconciler removes a file no delivery uses once
// it is OrphanGrace old (each use renews its time).
func (w *Worker) snapshotCacheDir() string { return filepath.Join(w.cfg.StateDir, "snap") }

// cachedSnapshot returns the cached file of ref's snapshot, downloading it
// when absent: into a temporary file, its digest checked (workspace.
// Download) and its headers scanned (workspace.Scan, nothing written from
// the archive), then renamed into place read-only. The file is marked in
// use until useSnapshot(path, false). A cached file serves a delivery only
// while the object is still stored with ref's digest (one info request).
// A refused snapshot's errors wrap
// workspace's ErrSnapshotMissing, ErrDigestMismatch, ErrTooLarge or
// ErrBadArchive.
func (w *Worker) cachedSnapshot(ctx context.Context, ref messages.WorkspaceRef, cfg WorkspaceConfig) (string, error) {
	hexDigest, ok := strings.CutPrefix(ref.Digest, "sha256:")
	if !ok || len(hexDigest) != 64 || strings.Trim(hexDigest, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%w: digest %q is not sha256:<64 hex digits>", workspace.ErrDigestMismatch, ref.Digest)
	}
	dir := w.snapshotCacheDir()
	path := filepath.Join(dir, hexDigest+".tar")
	w.useSnapshot(path, true)
	now := time.Now()
	if err := os.Chtimes(path, now, now); err == nil {
		// Cached: the object must still be in the bucket, under the same
		// digest, or the run fails as if nothing were cached (an operator
		// who deletes a snapshot withdraws it).
		err = w.snapshotStillStored(ctx, ref, cfg)
		if err != nil {
			w.useSnapshot(path, false)
			return "", err
		}
		return path, nil
	}
	err := w.fetchSnapshot(ctx, ref, cfg, dir, path)
	if err != nil {
		w.useSnapshot(path, false)
		return "", err
	}
	return path, nil
}

// snapshotStillStored checks that ref's object is still in the workspace
// bucket with ref's digest (workspace.CheckStored).
func (w *Worker) snapshotStillStored(ctx context.Context, ref messages.WorkspaceRef, cfg WorkspaceConfig) error {
	ws, _, err := w.stores(ctx)
	if err != nil {
		return err
	}
	_, err = workspace.CheckStored(ctx, ws, ref, cfg.MaxBytes)
	return err
}

// fetchSnapshot downloads, checks and scans ref's snapshot into path.
func (w *Worker) fetchSnapshot(ctx context.Context, ref messages.WorkspaceRef, cfg WorkspaceConfig, dir, path string) error {
	ws, _, err := w.stores(ctx)
	if err != nil {
		return err
	}
	if err := ensurePrivateDir(dir); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone after the rename
	if err := workspace.Download(ctx, ws, ref, tmp.Name(), cfg.MaxBytes); err != nil {
		return err
	}
	f, err := os.Open(tmp.Name())
	if err != nil {
		return err
	}
	err = workspace.Scan(f, workspace.UnpackOptions{MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles})
	f.Close()
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// useSnapshot counts a delivery's use of a cached snapshot or staged tool
// (key), or its end.
func (w *Worker) useSnapshot(key string, use bool) {
	s := &w.wsStores
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inUse == nil {
		s.inUse = map[string]int{}
	}
	if use {
		s.inUse[key]++
		return
	}
	if s.inUse[key]--; s.inUse[key] <= 0 {
		delete(s.inUse, key)
	}
}

// removeStaleSnapshots removes cached snapshots no delivery uses whose last
// use is OrphanGrace old, leftover temporary files, and staged tools no
// delivery uses (the current one stays).
func (w *Worker) removeStaleSnapshots() {
	dir := w.snapshotCacheDir()
	entries, _ := os.ReadDir(dir)
	keep := map[string]bool{}
	// Held across each check and removal: a delivery marks its use (under
	// the same lock) before it renews the file's time.
	w.wsStores.mu.Lock()
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		info, err := os.Lstat(path)
		if err != nil || w.wsStores.inUse[path] > 0 || time.Since(info.ModTime()) < w.cfg.OrphanGrace {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.Warn().Err(err).Str("file", path).Msg("remove cached snapshot")
		}
	}
	for k := range w.wsStores.inUse {
		if d, ok := strings.CutPrefix(k, "tool:"); ok {
			keep[d] = true
		}
	}
	w.wsStores.mu.Unlock()
	if err := w.tools.gc(keep); err != nil {
		w.log.Warn().Err(err).Msg("remove unused staged workspace tools")
	}
}
