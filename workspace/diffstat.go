package workspace

import (
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/diff"
)

// emptyBlob is the hash of the empty blob, e69de29….
var emptyBlob = plumbing.ComputeHash(plumbing.BlobObject, nil)

// binaryChange reports whether fp changes a binary file, for the diffstat.
// go-git's IsBinary is true of every file patch without hunks, and so also
// of an empty file added or removed (or its mode changed): a text change of
// no lines, not a binary one. A side that is absent or the empty blob holds
// no content, binary or not.
func binaryChange(fp diff.FilePatch) bool {
	if !fp.IsBinary() {
		return false
	}
	from, to := fp.Files()
	return !emptyContent(from) || !emptyContent(to)
}

// emptyContent reports whether f is absent or the empty blob.
func emptyContent(f diff.File) bool {
	return f == nil || f.Hash() == emptyBlob
}
