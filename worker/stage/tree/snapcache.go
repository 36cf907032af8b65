package tree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	if err := t.fetchSnapshot(ctx, ref, cfg, dir, path); err != nil {
		return "", err
	}
	return path, nil
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

// fetchSnapshot downloads, checks and scans ref's snapshot into path.
func (t *Trees) fetchSnapshot(ctx context.Context, ref messages.WorkspaceRef, cfg Config, dir, path string) error {
	ws, _, err := t.stores(ctx)
	if err != nil {
		return err
	}
	if err := privdir.Ensure(dir); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone after the rename
	if err := workspace.Fetch(ctx, ws, ref, tmp.Name(), cfg.MaxBytes); err != nil {
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
