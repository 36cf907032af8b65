package workspace

import (
	"bytes"
	"fmt"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"

	"github.com/jetcrew/jetcrew/messages"
)

// ApplyChain is ApplyBundle of data, run runID's bundle, once the objects
// of earlier, the bundles of the runs it was started from (oldest first:
// a run started from a run started from …), are in the repository at
// repoDir: each one's prerequisite must be there when it is added (the
// first one's is the submitted HEAD), and its objects are added without a
// branch. A run's bundle names the head of the run it was started from as
// its prerequisite, so the branch of the last run of a
// chain holds every run's commits in order. With no earlier bundle it is
// ApplyBundle.
func ApplyChain(repoDir string, earlier [][]byte, data []byte, runID string) (plumbing.ReferenceName, plumbing.Hash, error) {
	if len(earlier) == 0 {
		return ApplyBundle(repoDir, data, runID)
	}
	if err := messages.ValidateToken("run id", runID); err != nil {
		return "", plumbing.ZeroHash, err
	}
	repo, err := git.PlainOpenWithOptions(repoDir, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return "", plumbing.ZeroHash, fmt.Errorf("open git repository %s: %w", repoDir, err)
	}
	return applyChain(repo, earlier, data, runID)
}

// applyChain is ApplyChain on an open repository (runID checked).
func applyChain(repo *git.Repository, earlier [][]byte, data []byte, runID string) (plumbing.ReferenceName, plumbing.Hash, error) {
	for i, b := range earlier {
		prereqs, _, head, pack, err := parseBundle(b)
		if err != nil {
			return "", plumbing.ZeroHash, err
		}
		if repo.Storer.HasEncodedObject(head) == nil {
			continue // added before
		}
		for _, p := range prereqs {
			if err := repo.Storer.HasEncodedObject(p); err != nil {
				return "", plumbing.ZeroHash, fmt.Errorf("this repository lacks commit %s, the base of the first run of the chain (bundle %d of %d; submitted from another repository?)", p, i+1, len(earlier))
			}
		}
		if err := packfile.UpdateObjectStorage(repo.Storer, bytes.NewReader(pack)); err != nil {
			return "", plumbing.ZeroHash, fmt.Errorf("store the commits of an earlier run: %w", err)
		}
	}
	return applyBundle(repo, data, runID)
}
