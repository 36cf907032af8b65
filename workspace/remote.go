package workspace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/go-git/go-billy/v5/osfs"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/sideband"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// Errors of a git remote that retrying cannot fix, wrapped by OpenRemote's,
// Resolve's and Snapshot's errors. Any other error (the remote cannot be
// reached, an HTTP 5xx, a connection cut) is worth a retry.
var (
	// ErrRefNotFound: the remote has no such branch, tag or reference.
	ErrRefNotFound = errors.New("git ref not found")
	// ErrRemoteRefused: the remote says the repository does not exist, is
	// empty, or needs credentials (which jetcrew never sends).
	ErrRemoteRefused = errors.New("git remote refused")
)

// RemoteOptions bound a fetch from a git remote.
type RemoteOptions struct {
	// MaxBytes bounds, each in bytes: what is read from the network (all
	// responses together), the objects of the fetched pack once inflated
	// (counted from the sizes the pack declares, before anything is
	// inflated, with packObjectCost more for each object), and the
	// snapshot written. 0 means no bound. Past it the fetch fails with an
	// error wrapping ErrTooLarge.
	MaxBytes int64
	// MaxFiles bounds the entries of the commit's tree; 0 means no bound.
	MaxFiles int
	// Transport makes the HTTP requests; nil means http.DefaultTransport
	// (which honours HTTPS_PROXY, HTTP_PROXY and NO_PROXY). Redirects are
	// never followed: a remote that answers with one is refused.
	Transport http.RoundTripper
	// TempDir is where Snapshot writes the fetched pack and its index, in
	// a directory of its own ("jetcrew-git-*", mode 0700) removed before
	// it returns; at most MaxBytes of pack, and its index. "" means
	// os.TempDir().
	TempDir string
}

// Remote is a git remote whose references were listed by OpenRemote; its
// Snapshot fetches one commit. It speaks git's smart HTTP protocol through
// go-git: nothing of the remote is executed, no hook, filter, submodule or
// LFS object is fetched or run.
type Remote struct {
	url  string
	o    RemoteOptions
	read *atomic.Int64
	sess transport.UploadPackSession
	hc   *http.Client
	refs storer.ReferenceStorer
	// peeled holds the peeled values the remote advertised, by reference
	// name (an annotated tag's commit).
	peeled map[string]plumbing.Hash
	caps   *capability.List
}

// RemoteRef is one reference of a Remote, as Resolve found it.
type RemoteRef struct {
	// Name is the full reference name (refs/heads/main, refs/tags/v1), or
	// HEAD when the remote's HEAD is detached.
	Name plumbing.ReferenceName
	// Want is the object the reference names: a commit, or an annotated
	// tag.
	Want plumbing.Hash
	// Commit is the commit the listing says the reference names: the
	// peeled value the remote advertised for it (an annotated tag's
	// commit), else Want. The listing is the remote's word: only a fetch
	// (Snapshot's Info.Head) proves it.
	Commit plumbing.Hash
}

// OpenRemote lists the references of the git repository at url (http or
// https). A URL the caller has not checked against its allowlist must not
// reach here. The caller closes the Remote.
func OpenRemote(ctx context.Context, url string, o RemoteOptions) (*Remote, error) {
	ep, err := transport.NewEndpoint(url)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRemoteRefused, url, err)
	}
	if ep.Protocol != "http" && ep.Protocol != "https" {
		return nil, fmt.Errorf("%w: %s: only http and https remotes are fetched", ErrRemoteRefused, url)
	}
	rt := o.Transport
	if rt == nil {
		// A transport of its own: Close drops its connections.
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	read := new(atomic.Int64)
	hc := &http.Client{Transport: &limitTransport{next: rt, read: read, max: o.MaxBytes}}
	cl := githttp.NewClientWithOptions(hc, &githttp.ClientOptions{RedirectPolicy: githttp.NoFollowRedirects})
	sess, err := cl.NewUploadPackSession(ep, nil)
	if err != nil {
		return nil, remoteError(url, err)
	}
	rem := &Remote{url: url, o: o, read: read, sess: sess, hc: hc}
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err == nil {
		rem.refs, err = ar.AllReferences()
	}
	if err != nil {
		rem.Close()
		return nil, remoteError(url, err)
	}
	rem.caps, rem.peeled = ar.Capabilities, ar.Peeled
	return rem, nil
}

// Close closes the remote's idle connections. The Remote is not used
// after.
func (r *Remote) Close() {
	_ = r.sess.Close()
	r.hc.CloseIdleConnections()
}

// remoteError wraps a transport error, with ErrRemoteRefused when retrying
// cannot help and ErrTooLarge past the byte bound.
func remoteError(url string, err error) error {
	switch {
	case errors.Is(err, ErrTooLarge):
		return fmt.Errorf("git remote %s: %w", url, err)
	case errors.Is(err, transport.ErrRepositoryNotFound), errors.Is(err, transport.ErrEmptyRemoteRepository),
		errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed),
		errors.Is(err, transport.ErrInvalidAuthMethod):
		return fmt.Errorf("%w: %s: %w", ErrRemoteRefused, url, err)
	}
	if strings.Contains(err.Error(), "http redirect") {
		return fmt.Errorf("%w: %s answered with a redirect, which jetcrew does not follow (name the final URL): %w", ErrRemoteRefused, url, err)
	}
	return fmt.Errorf("git remote %s: %w", url, err)
}

// Resolve finds ref among the remote's references: empty or "HEAD" means
// the remote's HEAD; a name starting with "refs/" is taken as it is; otherwise
// refs/heads/<ref>, then refs/tags/<ref>. A ref the remote does not have
// is ErrRefNotFound.
func (r *Remote) Resolve(ref string) (RemoteRef, error) {
	var names []plumbing.ReferenceName
	switch {
	case ref == "" || ref == "HEAD":
		names = []plumbing.ReferenceName{plumbing.HEAD}
	case strings.HasPrefix(ref, "refs/"):
		names = []plumbing.ReferenceName{plumbing.ReferenceName(ref)}
	default:
		names = []plumbing.ReferenceName{plumbing.NewBranchReferenceName(ref), plumbing.NewTagReferenceName(ref)}
	}
	for _, n := range names {
		got, err := r.refs.Reference(n)
		if errors.Is(err, plumbing.ErrReferenceNotFound) {
			continue
		}
		if err != nil {
			return RemoteRef{}, err
		}
		if got.Type() == plumbing.SymbolicReference {
			// HEAD names a branch: the snapshot is on that branch.
			target, err := r.refs.Reference(got.Target())
			if err != nil {
				return RemoteRef{}, fmt.Errorf("%w: %s names %s, which %s does not have", ErrRefNotFound, n, got.Target(), r.url)
			}
			return r.remoteRef(target), nil
		}
		return r.remoteRef(got), nil
	}
	return RemoteRef{}, fmt.Errorf("%w: %s has no branch, tag or reference %q", ErrRefNotFound, r.url, cmp.Or(ref, "HEAD"))
}

// remoteRef is the RemoteRef of the hash reference ref.
func (r *Remote) remoteRef(ref *plumbing.Reference) RemoteRef {
	rr := RemoteRef{Name: ref.Name(), Want: ref.Hash(), Commit: ref.Hash()}
	if c, ok := r.peeled[ref.Name().String()]; ok {
		rr.Commit = c
	}
	return rr
}

// Snapshot fetches rr's commit and all its history (no other reference,
// no submodule, no LFS object) and writes the snapshot of that commit to
// w, in the format Snapshot gives a clean clone of it: the commit's tree,
// and a .git holding its history as one pack, HEAD on the branch (detached
// for a tag or a detached HEAD), an index and the minimal config. Equal
// commits give equal bytes. It returns the snapshot's Info; Info.Head is
// the commit (an annotated tag is peeled).
//
// The pack is written to a file under RemoteOptions.TempDir as it
// arrives, and its objects are read from there: before any object is
// inflated, the sizes the pack declares (a delta's target size included)
// are summed against MaxBytes (checkPack), and inflating never goes past
// a declared size, so a compressed bomb fails with ErrTooLarge having cost
// its bytes on the wire. Objects over largeObjectBytes are streamed from
// the file, never held whole; indexing the pack holds one object at a time
// (and go-git's cache of delta bases), each at most MaxBytes.
func (r *Remote) Snapshot(ctx context.Context, rr RemoteRef, w io.Writer) (Info, error) {
	dir, err := os.MkdirTemp(r.o.TempDir, "jetcrew-git-*")
	if err != nil {
		return Info{}, err
	}
	defer os.RemoveAll(dir)
	st, err := r.fetch(ctx, dir, rr.Want)
	if err != nil {
		return Info{}, err
	}
	defer st.Close()
	commit, err := peelCommit(st, rr.Want)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %s: %s: %w", ErrBadArchive, r.url, rr.Name, err)
	}
	head := plumbing.NewHashReference(plumbing.HEAD, commit.Hash)
	if rr.Name.IsBranch() {
		head = plumbing.NewSymbolicReference(plumbing.HEAD, rr.Name)
		if err := st.SetReference(plumbing.NewHashReference(rr.Name, commit.Hash)); err != nil {
			return Info{}, err
		}
	}
	if err := st.SetReference(head); err != nil {
		return Info{}, err
	}
	repo, err := git.Open(st, nil)
	if err != nil {
		return Info{}, err
	}
	return snapshotCommit(repo, commit, w, r.o)
}

// fetch asks the remote for want and everything it reaches, writes the
// pack it sends into dir (a .git directory: objects/pack/pack-<sum>.pack),
// checks it (checkPack), indexes it, and returns the storage of dir.
func (r *Remote) fetch(ctx context.Context, dir string, want plumbing.Hash) (*filesystem.Storage, error) {
	req := packp.NewUploadPackRequestFromCapabilities(r.caps)
	req.Wants = []plumbing.Hash{want}
	if r.caps.Supports(capability.NoProgress) {
		if err := req.Capabilities.Set(capability.NoProgress); err != nil {
			return nil, err
		}
	}
	resp, err := r.sess.UploadPack(ctx, req)
	if err != nil {
		return nil, remoteError(r.url, err)
	}
	defer resp.Close()
	var pack io.Reader = resp
	switch {
	case req.Capabilities.Supports(capability.Sideband64k):
		pack = sideband.NewDemuxer(sideband.Sideband64k, resp)
	case req.Capabilities.Supports(capability.Sideband):
		pack = sideband.NewDemuxer(sideband.Sideband, resp)
	}
	packDir := filepath.Join(dir, "objects", "pack")
	if err := os.MkdirAll(packDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(packDir, "fetch-*.tmp")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// What the remote sends is bounded on the network (limitTransport).
	if _, err := io.Copy(f, pack); err != nil {
		return nil, remoteError(r.url, fmt.Errorf("read pack: %w", err))
	}
	sum, err := indexPack(f, packDir, packRules{max: r.o.MaxBytes})
	if err != nil {
		return nil, remoteError(r.url, fmt.Errorf("read pack: %w", err))
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(f.Name(), filepath.Join(packDir, "pack-"+sum.String()+".pack")); err != nil {
		return nil, err
	}
	return filesystem.NewStorageWithOptions(osfs.New(dir, osfs.WithBoundOS()), cache.NewObjectLRU(fetchCacheBytes),
		filesystem.Options{ExclusiveAccess: true, LargeObjectThreshold: largeObjectBytes}), nil
}

// peelCommit returns the commit h names: h itself, or the commit an
// annotated tag (chain) points to.
func peelCommit(s storer.EncodedObjectStorer, h plumbing.Hash) (*object.Commit, error) {
	for range 10 {
		o, err := s.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, err
		}
		switch o.Type() {
		case plumbing.CommitObject:
			return object.DecodeCommit(s, o)
		case plumbing.TagObject:
			t, err := object.DecodeTag(s, o)
			if err != nil {
				return nil, err
			}
			h = t.Target
		default:
			return nil, fmt.Errorf("%s is a %s, not a commit", h, o.Type())
		}
	}
	return nil, errors.New("tag chain too long")
}

// limitTransport fails a response body once all bodies together gave more
// than max bytes (max 0: no bound).
type limitTransport struct {
	next http.RoundTripper
	read *atomic.Int64
	max  int64
}

// RoundTrip sends req through the next transport and bounds the body.
func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || t.max <= 0 {
		return resp, err
	}
	resp.Body = &limitBody{ReadCloser: resp.Body, t: t}
	return resp, nil
}

type limitBody struct {
	io.ReadCloser
	t *limitTransport
}

func (b *limitBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.t.read.Add(int64(n)) > b.t.max {
		return n, fmt.Errorf("%w: the remote sent more than %d bytes", ErrTooLarge, b.t.max)
	}
	return n, err
}
