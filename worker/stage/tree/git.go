package tree

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/singleflight"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
	"github.com/jetcrew/jetcrew/workspace"
)

// GitFetchTimeout bounds one git source's resolution: listing the remote's
// references, fetching the commit and its history, and storing the
// snapshot. Past it the request is handed back for a retry.
const GitFetchTimeout = 5 * time.Minute

// gitCacheEntry is the content of a git cache object: the snapshot made of
// one commit of one remote.
type gitCacheEntry struct {
	Digest string `json:"digest"`
	Commit string `json:"commit"`
}

// gitCacheName returns the name, in the workspace bucket, of the cache
// object of a remote's reference refName at object want (a commit or an
// annotated tag): "git/<hex SHA-256 of url, newline, refName>/<want>". The
// reference is part of the key because the snapshot's HEAD names it.
func gitCacheName(remote, refName, want string) string {
	sum := sha256.Sum256([]byte(remote + "\n" + refName))
	return "git/" + hex.EncodeToString(sum[:]) + "/" + want
}

// resolveGitWorkspace turns a request's git source into the snapshot the
// run stages: it lists the remote's references, resolves src.Ref to a
// commit and, unless the cache object of that commit names a snapshot the
// bucket still holds, fetches the commit and its history with go-git,
// writes its snapshot (workspace.Remote.Snapshot) and stores it under its
// digest, then the cache object. Prestart then checks the downloaded
// snapshot against the commit (verifyGitSnapshot) before the run uses it. Runs asking for the same remote and ref
// at the same time share one resolution, and the worker fetches at most
// Config.GitFetches at once (gitFlight). It records the source,
// commit and digest, for Note. A remote the profile does not
// allow, a ref the remote lacks, a refused repository or one over the
// workspace byte cap fails the run; anything else (the remote or the store
// unreachable, the worker stopping) is transient.
func (s *Stage) resolveGitWorkspace(ctx context.Context, prof *profile.Profile, src messages.GitSource) (messages.WorkspaceRef, error) {
	if err := prof.CheckGitSource(&messages.WorkspaceRef{Git: &src}); err != nil {
		return messages.WorkspaceRef{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, GitFetchTimeout)
	defer cancel()
	start := time.Now()
	g, shared, err := s.t.git.resolve(ctx, src, s.t.resolveGit)
	if err != nil {
		if isGitRefused(err) {
			return messages.WorkspaceRef{}, fmt.Errorf("workspace: %w", err)
		}
		return messages.WorkspaceRef{}, stage.Transient(fmt.Errorf("fetch workspace from git: %w", err))
	}
	s.git = &messages.GitSource{URL: src.URL, Ref: src.Ref, Commit: g.commit, Digest: g.ref.Digest}
	s.gitCache = g.cacheName
	s.run.Log.Info().Str("git_url", src.URL).Str("git_ref", src.Ref).Str("commit", g.commit).
		Bool("fetched", g.fetched).Bool("shared", shared).Dur("resolved_in", time.Since(start)).Msg("git workspace resolved")
	return g.ref, nil
}

// isGitRefused reports whether err means the git source itself is
// unusable, so retrying cannot help.
func isGitRefused(err error) bool {
	return errors.Is(err, workspace.ErrRefNotFound) || errors.Is(err, workspace.ErrRemoteRefused) ||
		errors.Is(err, workspace.ErrTooLarge) || errors.Is(err, workspace.ErrBadArchive)
}

// gitResolution is what one resolution of a git source found: the snapshot
// to stage, the commit it is to hold (checked once the snapshot is
// downloaded: verifyGitSnapshot), the name of the commit's cache object
// and whether it was fetched (false: the cache object named the snapshot).
type gitResolution struct {
	ref       messages.WorkspaceRef
	commit    string
	cacheName string
	fetched   bool
}

// gitFlight shares and bounds a worker's git resolutions. Runs asking for
// the same remote and ref while a resolution of it is in flight share that
// one (golang.org/x/sync/singleflight): one listing, at most one fetch. At
// most cap(fetches) fetches run at once, whatever the worker's
// concurrency; each holds up to the workspace byte cap of objects in
// memory. A resolution runs under the Trees' context (Trees.Start), not a
// run's: a run that gives up (cancelled, timed out) leaves it to the runs
// still waiting for it. stop cancels nothing itself (Trees.Stop ends that
// context first) but waits for every resolution to return.
type gitFlight struct {
	group   singleflight.Group
	fetches chan struct{}

	mu       sync.Mutex
	ctx      context.Context // the Trees' context (start)
	stopping bool
	running  sync.WaitGroup
}

// newGitFlight returns a gitFlight allowing n fetches at once.
func newGitFlight(n int) *gitFlight {
	return &gitFlight{fetches: make(chan struct{}, n), ctx: context.Background()}
}

// start sets the context resolutions run under: the Trees' context,
// which Trees.Stop cancels.
func (g *gitFlight) start(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ctx = ctx
}

// stop refuses new resolutions and waits for those running to return.
func (g *gitFlight) stop() {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
	g.running.Wait()
}

// resolve returns the resolution of src, made by do under the Trees'
// context and GitFetchTimeout, or shared with one in flight (shared
// is then true). It returns early with ctx's error when ctx ends first;
// the resolution goes on for the runs still waiting.
func (g *gitFlight) resolve(ctx context.Context, src messages.GitSource, do func(context.Context, messages.GitSource) (gitResolution, error)) (res gitResolution, shared bool, err error) {
	ch := g.group.DoChan(src.URL+"\n"+src.Ref, func() (any, error) {
		g.mu.Lock()
		if g.stopping {
			g.mu.Unlock()
			return gitResolution{}, errors.New("the worker is stopping")
		}
		g.running.Add(1)
		fctx := g.ctx
		g.mu.Unlock()
		defer g.running.Done()
		fctx, cancel := context.WithTimeout(fctx, GitFetchTimeout)
		defer cancel()
		return do(fctx, src)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return gitResolution{}, r.Shared, r.Err
		}
		return r.Val.(gitResolution), r.Shared, nil
	case <-ctx.Done():
		return gitResolution{}, false, ctx.Err()
	}
}

// acquireFetch takes one of the worker's fetch slots, waiting at most
// until ctx ends; releaseFetch gives it back.
func (g *gitFlight) acquireFetch(ctx context.Context) error {
	select {
	case g.fetches <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for one of the worker's git fetches: %w", ctx.Err())
	}
}

func (g *gitFlight) releaseFetch() { <-g.fetches }

// scratchDir makes a directory of the worker's workspace directory, named
// after prefix, for the files of one resolution (a git fetch's pack, a
// build's bundle, their snapshot), held while it lives (Sweep spares it;
// it removes one a crash leaves); done removes it and lets it go.
func (t *Trees) scratchDir(prefix string) (dir string, done func(), err error) {
	root := filepath.Join(t.stateDir, "ws")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", nil, err
	}
	if dir, err = os.MkdirTemp(root, prefix); err != nil {
		return "", nil, err
	}
	unhold := t.holds.Hold(holdGitFile + dir)
	return dir, func() {
		_ = os.RemoveAll(dir)
		unhold()
	}, nil
}

// snapshotFile takes one of the worker's git fetch slots, waiting for it
// until ctx ends, and creates the snapshot file of a resolution in its
// scratch directory dir; done closes the file and gives the slot back.
func (t *Trees) snapshotFile(ctx context.Context, dir string) (f *os.File, done func(), err error) {
	if err := t.git.acquireFetch(ctx); err != nil {
		return nil, nil, err
	}
	if f, err = os.Create(filepath.Join(dir, "snapshot.tar")); err != nil {
		t.git.releaseFetch()
		return nil, nil, err
	}
	return f, func() {
		_ = f.Close()
		t.git.releaseFetch()
	}, nil
}

// resolveGit is one resolution of src (see resolveGitWorkspace): list,
// resolve the ref, look for the commit's cache object, and only without
// one fetch (in one of the worker's fetch slots), snapshot and store.
func (t *Trees) resolveGit(ctx context.Context, src messages.GitSource) (gitResolution, error) {
	ws, _, err := t.stores(ctx)
	if err != nil {
		return gitResolution{}, err
	}
	cfg := t.cfg
	// The fetched pack, its index and the snapshot go to a scratch
	// directory.
	dir, done, err := t.scratchDir("git-")
	if err != nil {
		return gitResolution{}, err
	}
	defer done()
	rem, err := workspace.OpenRemote(ctx, src.URL, workspace.RemoteOptions{MaxBytes: cfg.MaxBytes, MaxFiles: cfg.MaxFiles, TempDir: dir})
	if err != nil {
		return gitResolution{}, err
	}
	defer rem.Close()
	rr, err := rem.Resolve(src.Ref)
	if err != nil {
		return gitResolution{}, err
	}
	cacheName := gitCacheName(src.URL, rr.Name.String(), rr.Want.String())
	// The entry is used for the commit the remote lists, never for the one
	// it claims: an entry claiming another is ignored (the fetch replaces
	// it), and the snapshot it names must prove to hold the listed commit
	// before the run uses it (verifyGitSnapshot).
	if ent, ok := readGitCache(ctx, ws, cacheName); ok && ent.Commit == rr.Commit.String() {
		ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(ent.Digest), Digest: ent.Digest}
		if workspace.Stored(ctx, ws, ref) {
			return gitResolution{ref: ref, commit: ent.Commit, cacheName: cacheName}, nil
		}
	}
	f, done, err := t.snapshotFile(ctx, dir)
	if err != nil {
		return gitResolution{}, err
	}
	defer done()
	info, err := rem.Snapshot(ctx, rr, f)
	if err != nil {
		return gitResolution{}, err
	}
	up, err := workspace.StoreSnapshot(ctx, ws, f, info)
	if err != nil {
		return gitResolution{}, err
	}
	ent, _ := json.Marshal(gitCacheEntry{Digest: info.Digest, Commit: info.Head})
	if _, err := ws.PutBytes(ctx, cacheName, ent); err != nil {
		// Only the cache is lost: the next run on this commit fetches again.
		t.log.Warn().Err(err).Str("git_url", src.URL).Msg("store git cache entry")
	}
	return gitResolution{ref: up.Ref, commit: info.Head, cacheName: cacheName, fetched: true}, nil
}

// verifyGitSnapshot checks that the cached snapshot file path, of
// snapshot ref, holds commit (workspace.VerifyCommit): HEAD, the commit's
// object, its tree as the files. A snapshot is checked once for a commit
// while it stays in the worker's cache (its bytes, checked against its
// digest, never change). A snapshot that does not hold the commit is
// workspace.ErrWrongCommit, and the cache object cacheName is deleted when
// it still names that snapshot, so the next run fetches the commit.
func (s *Stage) verifyGitSnapshot(ctx context.Context, path string, ref messages.WorkspaceRef, commit, cacheName string) error {
	t := s.t
	key := strings.TrimPrefix(ref.Digest, "sha256:")
	if t.verifiedCommit(key) == commit {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	start := time.Now()
	err = workspace.VerifyCommit(f, fi.Size(), commit, workspace.UnpackOptions{MaxBytes: t.cfg.MaxBytes, MaxFiles: t.cfg.MaxFiles})
	if errors.Is(err, workspace.ErrWrongCommit) {
		s.run.Log.Warn().Err(err).Str("snapshot", ref.Name).Str("git_cache", cacheName).Msg("a git snapshot does not hold its commit; its cache entry is dropped")
		t.dropGitCache(ctx, cacheName, ref.Digest)
	}
	if err != nil {
		return err
	}
	t.setVerified(key, commit)
	s.run.Log.Debug().Str("snapshot", ref.Name).Dur("verified_in", time.Since(start)).Msg("git snapshot holds its commit")
	return nil
}

// dropGitCache deletes the cache object name when it names the snapshot
// digest: one that another worker has since replaced with another
// snapshot is left to be checked on its own.
func (t *Trees) dropGitCache(ctx context.Context, name, digest string) {
	ws, _, err := t.stores(ctx)
	if err != nil {
		return
	}
	if ent, ok := readGitCache(ctx, ws, name); ok && ent.Digest != digest {
		return
	}
	if err := ws.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.log.Warn().Err(err).Str("git_cache", name).Msg("delete a git cache entry; its snapshot is checked again by each run")
	}
}

// verifiedCommit returns the commit the cached snapshot of hex digest key
// was found to hold ("" when none was checked).
func (t *Trees) verifiedCommit(key string) string {
	t.verifiedMu.Lock()
	defer t.verifiedMu.Unlock()
	return t.verified[key]
}

func (t *Trees) setVerified(key, commit string) {
	t.verifiedMu.Lock()
	defer t.verifiedMu.Unlock()
	t.verified[key] = commit
}

// forgetVerified forgets what was checked of the cached snapshot of hex
// digest key, once its file is removed.
func (t *Trees) forgetVerified(key string) {
	t.verifiedMu.Lock()
	defer t.verifiedMu.Unlock()
	delete(t.verified, key)
}

// readGitCache reads the cache object name of bucket ws; ok is false when
// it is missing or malformed (a bucket writer may have put anything).
func readGitCache(ctx context.Context, ws jetstream.ObjectStore, name string) (gitCacheEntry, bool) {
	info, err := ws.GetInfo(ctx, name)
	if err != nil || info.Deleted || info.Size > 1024 {
		return gitCacheEntry{}, false
	}
	b, err := ws.GetBytes(ctx, name)
	if err != nil {
		return gitCacheEntry{}, false
	}
	var ent gitCacheEntry
	if json.Unmarshal(b, &ent) != nil || len(ent.Commit) != 40 || strings.Trim(ent.Commit, "0123456789abcdef") != "" {
		return gitCacheEntry{}, false
	}
	ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(ent.Digest), Digest: ent.Digest}
	if ref.Validate() != nil {
		return gitCacheEntry{}, false
	}
	return ent, true
}
