package workspace

import (
	"fmt"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// maxRunCommits bounds the commits copied from a run's repository.
const maxRunCommits = 10000

// copyObjects copies into st every object reachable from commit head in src
// that st lacks, stopping at commits st already holds (the submitted
// history), and returns the commits it copied. More than max bytes of
// objects (0: no bound) or more than maxRunCommits commits is an error
// wrapping ErrTooLarge.
func copyObjects(st, src storer.EncodedObjectStorer, head, _ plumbing.Hash, max int64) ([]plumbing.Hash, error) {
	var budget int64
	cp := func(h plumbing.Hash) (plumbing.EncodedObject, bool, error) {
		if st.HasEncodedObject(h) == nil {
			return nil, false, nil
		}
		o, err := src.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, false, fmt.Errorf("object %s: %w", h, err)
		}
		budget += o.Size()
		if max > 0 && budget > max {
			return nil, false, fmt.Errorf("%w: the run's new objects exceed %d bytes", ErrTooLarge, max)
		}
		if _, err := st.SetEncodedObject(o); err != nil {
			return nil, false, err
		}
		return o, true, nil
	}
	var commits []plumbing.Hash
	pending := []plumbing.Hash{head}
	for n := 0; len(pending) > 0; n++ {
		if n >= maxRunCommits {
			return nil, fmt.Errorf("%w: more than %d new commits", ErrTooLarge, maxRunCommits)
		}
		h := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		o, copied, err := cp(h)
		if err != nil || !copied {
			if err != nil {
				return nil, err
			}
			continue
		}
		c, err := object.DecodeCommit(st, o)
		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", h, err)
		}
		if err := copyTree(st, src, c.TreeHash, cp); err != nil {
			return nil, err
		}
		commits = append(commits, h)
		pending = append(pending, c.ParentHashes...)
	}
	return commits, nil
}

// copyTree copies tree h and the objects under it that st lacks.
func copyTree(st, src storer.EncodedObjectStorer, h plumbing.Hash, cp func(plumbing.Hash) (plumbing.EncodedObject, bool, error)) error {
	o, copied, err := cp(h)
	if err != nil || !copied {
		return err
	}
	if o.Type() != plumbing.TreeObject {
		return fmt.Errorf("object %s is a %s, not a tree", h, o.Type())
	}
	t, err := object.DecodeTree(st, o)
	if err != nil {
		return err
	}
	for _, e := range t.Entries {
		switch e.Mode {
		case filemode.Dir:
			err = copyTree(st, src, e.Hash, cp)
		case filemode.Submodule:
		default:
			_, _, err = cp(e.Hash)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
