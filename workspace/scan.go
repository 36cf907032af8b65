package workspace

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
)

// Scan reads the snapshot tar from r and checks what Unpack would refuse
// without writing anything: only the headers are looked at (a seekable r
// skips the file data). It refuses, wrapping ErrBadArchive, a name that is
// absolute, holds "..", NUL or a backslash, an entry that is not a
// directory, regular file or symlink, a regular file or symlink named twice
// or over a directory, and an entry under a name that is not a directory
// (a symlink or a file); and, wrapping ErrTooLarge, more than o.MaxFiles
// entries or regular files over o.MaxBytes in all. o.UID and o.GID are
// ignored.
func Scan(r io.Reader, o UnpackOptions) error {
	kinds := map[string]byte{}
	var total int64
	return eachEntry(r, o.MaxFiles, func(_ *tar.Reader, hdr *tar.Header, name string) error {
		return scanEntry(kinds, hdr, name, &total, o.MaxBytes)
	})
}

// eachEntry reads the tar from r and calls fn with each entry's header and
// cleaned name, the tree's root "." left out, after refusing what Scan and
// Unpack both refuse: a malformed archive and a name that is not a relative
// path inside the tree (ErrBadArchive), more than maxFiles entries
// (ErrTooLarge; 0: no limit). It returns fn's first error.
func eachEntry(r io.Reader, maxFiles int, fn func(tr *tar.Reader, hdr *tar.Header, name string) error) error {
	tr := tar.NewReader(r)
	for files := 0; ; files++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadArchive, err)
		}
		if maxFiles > 0 && files >= maxFiles {
			return fmt.Errorf("%w: more than %d entries", ErrTooLarge, maxFiles)
		}
		name, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		if err := fn(tr, hdr, name); err != nil {
			return err
		}
	}
}

// scanEntry checks one entry against the kinds of the names seen so far
// and records it.
func scanEntry(kinds map[string]byte, hdr *tar.Header, name string, total *int64, max int64) error {
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeSymlink:
	case tar.TypeReg:
		*total += hdr.Size
		if max > 0 && *total > max {
			return fmt.Errorf("%w: unpacked files exceed %d bytes", ErrTooLarge, max)
		}
	default:
		return fmt.Errorf("%w: %s: entry type %q is not allowed (only directories, regular files and symlinks)", ErrBadArchive, name, hdr.Typeflag)
	}
	for p := path.Dir(name); p != "."; p = path.Dir(p) {
		if k, ok := kinds[p]; ok && k != tar.TypeDir {
			return fmt.Errorf("%w: %s: its parent %s is not a directory", ErrBadArchive, name, p)
		}
		kinds[p] = tar.TypeDir
	}
	if prev, ok := kinds[name]; ok && (prev != tar.TypeDir || hdr.Typeflag != tar.TypeDir) {
		return fmt.Errorf("%w: %s: named twice", ErrBadArchive, name)
	}
	kinds[name] = hdr.Typeflag
	return nil
}
