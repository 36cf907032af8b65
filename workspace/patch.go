package workspace

import (
	"bytes"
	"compress/zlib"
	"fmt"
	"io"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/diff"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// onePatch is a diff.Patch of one file.
type onePatch struct{ fp diff.FilePatch }

func (p onePatch) FilePatches() []diff.FilePatch { return []diff.FilePatch{p.fp} }
func (p onePatch) Message() string               { return "" }

// encodePatch writes patch in git's format: unified diffs for text files
// and "GIT binary patch" literals (with full index lines) for binary ones,
// so `git apply` reproduces every change.
func encodePatch(w io.Writer, patch *object.Patch, st storer.EncodedObjectStorer) error {
	enc := diff.NewUnifiedEncoder(w, diff.DefaultContextLines)
	for _, fp := range patch.FilePatches() {
		var err error
		if fp.IsBinary() {
			err = binaryPatch(w, fp, st)
		} else {
			err = enc.Encode(onePatch{fp})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// binaryPatch writes fp as a git binary patch: the new content as a
// zlib-compressed, base85-encoded literal.
func binaryPatch(w io.Writer, fp diff.FilePatch, st storer.EncodedObjectStorer) error {
	from, to := fp.Files()
	var b bytes.Buffer
	fromHash, toHash := plumbing.ZeroHash, plumbing.ZeroHash
	switch {
	case from == nil:
		fmt.Fprintf(&b, "diff --git a/%s b/%s\nnew file mode %o\n", to.Path(), to.Path(), uint32(to.Mode()))
		toHash = to.Hash()
	case to == nil:
		fmt.Fprintf(&b, "diff --git a/%s b/%s\ndeleted file mode %o\n", from.Path(), from.Path(), uint32(from.Mode()))
		fromHash = from.Hash()
	default:
		fmt.Fprintf(&b, "diff --git a/%s b/%s\n", from.Path(), to.Path())
		if from.Path() != to.Path() {
			fmt.Fprintf(&b, "rename from %s\nrename to %s\n", from.Path(), to.Path())
		}
		if from.Mode() != to.Mode() {
			fmt.Fprintf(&b, "old mode %o\nnew mode %o\n", uint32(from.Mode()), uint32(to.Mode()))
		}
		fromHash, toHash = from.Hash(), to.Hash()
	}
	fmt.Fprintf(&b, "index %s..%s\nGIT binary patch\n", fromHash, toHash)
	var content []byte
	if to != nil {
		var err error
		if content, err = blobContent(st, to.Hash()); err != nil {
			return err
		}
	}
	writeLiteral(&b, content)
	b.WriteString("\n")
	_, err := w.Write(b.Bytes())
	return err
}

// blobContent returns the content of blob h of st.
func blobContent(st storer.EncodedObjectStorer, h plumbing.Hash) ([]byte, error) {
	o, err := st.EncodedObject(plumbing.BlobObject, h)
	if err != nil {
		return nil, err
	}
	r, err := o.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// writeLiteral writes a "literal <size>" hunk of data.
func writeLiteral(b *bytes.Buffer, data []byte) {
	fmt.Fprintf(b, "literal %d\n", len(data))
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	_, _ = zw.Write(data)
	_ = zw.Close()
	zb := z.Bytes()
	for len(zb) > 0 {
		n := min(len(zb), 52)
		if n <= 26 {
			b.WriteByte(byte('A' + n - 1))
		} else {
			b.WriteByte(byte('a' + n - 27))
		}
		b.Write(base85(zb[:n]))
		b.WriteByte('\n')
		zb = zb[n:]
	}
}

const base85Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

// base85 encodes p as git does: 5 characters per 4 bytes, the last group
// zero-padded.
func base85(p []byte) []byte {
	var out []byte
	for len(p) > 0 {
		var acc uint32
		for i := range 4 {
			acc <<= 8
			if i < len(p) {
				acc |= uint32(p[i])
			}
		}
		var g [5]byte
		for i := 4; i >= 0; i-- {
			g[i] = base85Alphabet[acc%85]
			acc /= 85
		}
		out = append(out, g[:]...)
		p = p[min(4, len(p)):]
	}
	return out
}
