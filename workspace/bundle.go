package workspace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrRefExists is returned by ApplyBundle when the bundle's ref already
// exists in the repository at another commit.
var ErrRefExists = errors.New("branch already exists at another commit")

// ApplyBundle adds the commits of a bundle written by Capture to the git
// repository at repoDir and creates the bundle's branch at its head. It
// never changes HEAD, the current branch, the index or the work tree. It
// fails when the repository lacks the bundle's prerequisite (the run's base
// commit), and with ErrRefExists when the branch exists at another commit;
// the same bundle applied twice is a no-op. The bundle's ref must be
// refs/heads/jetcrew/<runID> exactly (runID a messages token). It returns
// the branch and head.
func ApplyBundle(repoDir string, data []byte, runID string) (plumbing.ReferenceName, plumbing.Hash, error) {
	if err := messages.ValidateToken("run id", runID); err != nil {
		return "", plumbing.ZeroHash, err
	}
	repo, err := git.PlainOpenWithOptions(repoDir, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("open git repository %s: %w", repoDir, err)
	}
	return applyBundle(repo, data, runID)
}

// applyBundle is ApplyBundle on an open repository (runID checked).
func applyBundle(repo *git.Repository, data []byte, runID string) (plumbing.ReferenceName, plumbing.Hash, error) {
	prereqs, ref, head, pack, err := parseBundle(data)
	if err != nil {
		return "", plumbing.ZeroHash, err
	}
	if want := plumbing.ReferenceName("refs/heads/jetcrew/" + runID); ref != want {
		return "", plumbing.ZeroHash, fmt.Errorf("not the bundle of run %s: its ref is %q", runID, ref)
	}
	for _, p := range prereqs {
		if err := repo.Storer.HasEncodedObject(p); err != nil {
			return "", plumbing.ZeroHash, fmt.Errorf("this repository lacks the run's base commit %s (submitted from another repository?)", p)
		}
	}
	if cur, err := repo.Storer.Reference(ref); err == nil {
		if cur.Hash() == head {
			return ref, head, nil
		}
		return "", plumbing.ZeroHash, fmt.Errorf("%w: %s is at %s, the run's head is %s", ErrRefExists, ref.Short(), cur.Hash(), head)
	}
	if err := packfile.UpdateObjectStorage(repo.Storer, bytes.NewReader(pack)); err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("store the run's commits: %w", err)
	}
	if _, err := repo.CommitObject(head); err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("the bundle's head %s is not a commit: %w", head, err)
	}
	if err := repo.Storer.SetReference(plumbing.NewHashReference(ref, head)); err != nil {
		return "", plumbing.ZeroHash, err
	}
	return ref, head, nil
}

// parseBundle reads a v2 bundle with one ref: its prerequisites, ref, head
// and pack.
func parseBundle(data []byte) (prereqs []plumbing.Hash, ref plumbing.ReferenceName, head plumbing.Hash, pack []byte, err error) {
	prereqs, ref, head, n, err := readBundleHeader(bufio.NewReader(bytes.NewReader(data)))
	if err != nil {
		return nil, "", head, nil, err
	}
	return prereqs, ref, head, data[n:], nil
}

// Bounds of a bundle's header (readBundleHeader): jetcrew writes one
// prerequisite at most and one ref.
const (
	maxBundleHeaderLines = 64
	maxBundleLineBytes   = 4096
)

// readBundleHeader reads the header of a v2 bundle with one ref from r, up
// to the empty line before the pack: its prerequisites, ref and head, and
// its length in bytes. At most maxBundleHeaderLines lines of
// maxBundleLineBytes are read.
func readBundleHeader(r *bufio.Reader) (prereqs []plumbing.Hash, ref plumbing.ReferenceName, head plumbing.Hash, n int, err error) {
	bad := func(why string) error { return fmt.Errorf("not a jetcrew bundle: %s", why) }
	sig := make([]byte, len(bundleSignature))
	if _, err := io.ReadFull(r, sig); err != nil || string(sig) != bundleSignature {
		return nil, "", head, 0, bad("no v2 signature")
	}
	n = len(sig)
	for range maxBundleHeaderLines {
		b, err := r.ReadSlice('\n')
		if err != nil || len(b) > maxBundleLineBytes {
			return nil, "", head, 0, bad("header not terminated")
		}
		n += len(b)
		line := strings.TrimSuffix(string(b), "\n")
		if line == "" {
			if ref == "" {
				return nil, "", head, 0, bad("no ref")
			}
			return prereqs, ref, head, n, nil
		}
		if rest, ok := strings.CutPrefix(line, "-"); ok {
			h, _, _ := strings.Cut(rest, " ")
			prereqs = append(prereqs, plumbing.NewHash(h))
			continue
		}
		h, name, ok := strings.Cut(line, " ")
		if !ok || ref != "" || !strings.HasPrefix(name, "refs/heads/jetcrew/") {
			return nil, "", head, 0, bad(fmt.Sprintf("unexpected line %q", line))
		}
		ref, head = plumbing.ReferenceName(name), plumbing.NewHash(h)
	}
	return nil, "", head, 0, bad(fmt.Sprintf("more than %d header lines", maxBundleHeaderLines))
}
