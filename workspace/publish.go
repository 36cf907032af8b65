package workspace

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/jetcrew/jetcrew/messages"
)

// Errors of Publish that say the push was refused before anything was
// sent.
var (
	// ErrBranchMoved: the remote's branch exists at a commit that is not
	// an ancestor of the run's head (someone pushed to it, or it is
	// another line of work); pushing would drop its commits.
	ErrBranchMoved = errors.New("the remote branch is not an ancestor of the run's head")
	// ErrLeaseBroken: with Force, the remote's branch moved between the
	// look at it and the push.
	ErrLeaseBroken = errors.New("the remote branch moved during the push")
)

// PublishOptions says what Publish pushes, and where.
type PublishOptions struct {
	// Repo is a git repository holding the base commit of the run (of the
	// first run of its chain): the HEAD it was submitted from, as for
	// ApplyChain. Its objects are read, never written; its config and
	// hooks are never used.
	Repo string
	// Earlier are the bundles of the runs the run was started from,
	// oldest first (ApplyChain's earlier); Bundle is the run's.
	Earlier [][]byte
	Bundle  []byte
	// RunID is the run whose head is pushed.
	RunID string
	// URL is the remote's http or https URL, without credentials.
	URL string
	// Username and Token authenticate to the remote (HTTP basic auth),
	// when Token is not empty. Username defaults to "x-access-token".
	Username, Token string
	// Branch is the remote branch (a name under refs/heads/) to push to.
	Branch string
	// Force overwrites a branch that is not an ancestor of the run's head,
	// as long as it is still at the commit Publish saw before pushing
	// (git's --force-with-lease).
	Force bool
}

// Published says what Publish did.
type Published struct {
	// Ref is the remote's ref pushed to (refs/heads/<Branch>).
	Ref plumbing.ReferenceName
	// Commit is the run's head, now the remote branch's commit.
	Commit plumbing.Hash
	// Old is the remote branch's commit before, zero when it was created.
	Old plumbing.Hash
	// UpToDate: the branch was at Commit already; nothing was sent.
	UpToDate bool
	// Forced: Old was not an ancestor of Commit and Force replaced it.
	Forced bool
}

// Publish pushes the head of run o.RunID (its commits, and the commit of
// what it left uncommitted: the branch ApplyChain would create) to branch
// o.Branch of the git remote at o.URL. It builds the run's objects in a
// temporary bare repository (removed before it returns) that reads the
// base history from o.Repo, and pushes with go-git: no hook, no config of
// either repository is run or read. A remote branch that is not an
// ancestor of the head is refused with ErrBranchMoved unless o.Force. The
// caller checks o.URL against its allowlist.
func Publish(ctx context.Context, o PublishOptions) (Published, error) {
	ref, err := o.check()
	if err != nil {
		return Published{}, err
	}
	base, err := git.PlainOpenWithOptions(o.Repo, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return Published{}, fmt.Errorf("open git repository %s: %w", o.Repo, err)
	}
	tmp, err := os.MkdirTemp("", "jetcrew-publish-")
	if err != nil {
		return Published{}, err
	}
	defer os.RemoveAll(tmp)
	st := &overlayStorage{Storage: filesystem.NewStorage(osfs.New(tmp), cache.NewObjectLRUDefault()), base: base.Storer}
	repo, err := git.Init(st, nil)
	if err != nil {
		return Published{}, fmt.Errorf("temporary repository: %w", err)
	}
	local, head, err := applyChain(repo, o.Earlier, o.Bundle, o.RunID)
	if err != nil {
		return Published{}, err
	}
	p := pusher{st: st, rem: git.NewRemote(st, &config.RemoteConfig{Name: "publish", URLs: []string{o.URL}}), auth: o.auth()}
	out := Published{Ref: ref, Commit: head}
	if out.Old, err = p.remoteHead(ctx, ref); err != nil {
		return out, err
	}
	switch {
	case out.Old == head:
		out.UpToDate = true
		return out, nil
	case out.Old.IsZero():
	default:
		ff, err := isAncestor(st, out.Old, head)
		if err != nil {
			return out, err
		}
		if !ff && !o.Force {
			return out, fmt.Errorf("%w: %s is at %s (give --force to replace it)", ErrBranchMoved, o.Branch, out.Old)
		}
		out.Forced = !ff
	}
	return out, p.push(ctx, local, out, o.Branch)
}

// check returns the remote ref o.Branch names, after checking o's run id,
// branch and URL (checkPublishURL).
func (o PublishOptions) check() (plumbing.ReferenceName, error) {
	if err := messages.ValidateToken("run id", o.RunID); err != nil {
		return "", err
	}
	ref := plumbing.NewBranchReferenceName(o.Branch)
	if o.Branch == "" || ref.Validate() != nil {
		return "", fmt.Errorf("branch %q is not a valid branch name", o.Branch)
	}
	return ref, checkPublishURL(o.URL)
}

// auth returns the HTTP basic auth of o's token (the user name
// "x-access-token" unless o.Username), or nil without a token.
func (o PublishOptions) auth() *githttp.BasicAuth {
	if o.Token == "" {
		return nil
	}
	auth := &githttp.BasicAuth{Username: o.Username, Password: o.Token}
	if auth.Username == "" {
		auth.Username = "x-access-token"
	}
	return auth
}

// pusher is Publish's remote: the temporary repository's storage, the
// remote named "publish" in it, and the auth sent to it (nil: none).
type pusher struct {
	st   *overlayStorage
	rem  *git.Remote
	auth *githttp.BasicAuth
}

// remoteHead lists the remote's references and returns ref's commit, zero
// when the remote has no such branch (or no branch at all).
func (p pusher) remoteHead(ctx context.Context, ref plumbing.ReferenceName) (plumbing.Hash, error) {
	lo := &git.ListOptions{}
	if p.auth != nil {
		lo.Auth = p.auth
	}
	refs, err := p.rem.ListContext(ctx, lo)
	if err != nil && !errors.Is(err, transport.ErrEmptyRemoteRepository) {
		return plumbing.ZeroHash, fmt.Errorf("list the remote's branches: %w", err)
	}
	var old plumbing.Hash
	for _, r := range refs {
		if r.Name() == ref {
			old = r.Hash()
		}
	}
	return old, nil
}

// push pushes local to out.Ref, replacing out.Old with a lease when
// out.Forced (git's --force-with-lease), and returns ErrLeaseBroken or
// ErrBranchMoved when the branch moved since remoteHead saw it.
func (p pusher) push(ctx context.Context, local plumbing.ReferenceName, out Published, branch string) error {
	po := &git.PushOptions{
		RemoteName: "publish",
		RefSpecs:   []config.RefSpec{config.RefSpec(local.String() + ":" + out.Ref.String())},
	}
	if p.auth != nil {
		po.Auth = p.auth
	}
	if out.Forced {
		po.RefSpecs[0] = "+" + po.RefSpecs[0]
		po.ForceWithLease = &git.ForceWithLease{RefName: out.Ref, Hash: out.Old}
		// go-git looks the lease's ref up among the remote-tracking refs
		// before it compares it with the push's advertisement.
		track := plumbing.ReferenceName("refs/remotes/publish/" + local.Short())
		if err := p.st.SetReference(plumbing.NewHashReference(track, out.Old)); err != nil {
			return err
		}
	}
	err := p.rem.PushContext(ctx, po)
	switch {
	case err == nil, errors.Is(err, git.NoErrAlreadyUpToDate):
		return nil
	case out.Forced && strings.Contains(err.Error(), "non-fast-forward update"):
		// go-git's lease check returns no error value of its own.
		return fmt.Errorf("%w: %s", ErrLeaseBroken, branch)
	case errors.Is(err, git.ErrForceNeeded):
		return fmt.Errorf("%w: %s moved since it was listed", ErrBranchMoved, branch)
	}
	return fmt.Errorf("push to %s: %w", branch, err)
}

// checkPublishURL accepts an http or https URL without credentials in it.
func checkPublishURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("the remote's URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("remote %s: only http and https remotes are pushed to", u.Redacted())
	}
	if u.User != nil {
		return errors.New("the remote's URL holds credentials: name an environment variable for the token instead")
	}
	return nil
}

// isAncestor reports whether commit old is head or one of its ancestors,
// false when old is not a commit s has (the branch moved to commits only
// the remote has).
func isAncestor(s storer.EncodedObjectStorer, old, head plumbing.Hash) (bool, error) {
	oc, err := object.GetCommit(s, old)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	hc, err := object.GetCommit(s, head)
	if err != nil {
		return false, err
	}
	return oc.IsAncestor(hc)
}

// overlayStorage is a temporary repository's storage that also reads the
// objects of base: the run's objects are written to it, the history they
// build on is read from the repository the run was submitted from.
type overlayStorage struct {
	*filesystem.Storage
	base storer.EncodedObjectStorer
}

func (s *overlayStorage) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	o, err := s.Storage.EncodedObject(t, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return s.base.EncodedObject(t, h)
	}
	return o, err
}

func (s *overlayStorage) HasEncodedObject(h plumbing.Hash) error {
	if err := s.Storage.HasEncodedObject(h); !errors.Is(err, plumbing.ErrObjectNotFound) {
		return err
	}
	return s.base.HasEncodedObject(h)
}

func (s *overlayStorage) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	n, err := s.Storage.EncodedObjectSize(h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return s.base.EncodedObjectSize(h)
	}
	return n, err
}

// DeltaObject reads as EncodedObject does (the packfile encoder asks for
// deltas first); a base object is read whole.
func (s *overlayStorage) DeltaObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	o, err := s.Storage.DeltaObject(t, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return s.base.EncodedObject(t, h)
	}
	return o, err
}
