package workspace

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// UnpackOptions bound and own an unpacked workspace.
type UnpackOptions struct {
	// MaxBytes bounds the sum of the regular files' sizes; 0 means no
	// bound. A larger tree fails with an error wrapping ErrTooLarge.
	MaxBytes int64
	// MaxFiles bounds the number of entries; 0 means no bound.
	MaxFiles int
	// UID and GID own every unpacked entry (and dir itself) when UID > 0.
	UID, GID int
}

// ErrBadArchive is wrapped by Unpack's errors for a tar that is not a
// workspace snapshot: an unsafe path, a duplicate, a link, a device.
var ErrBadArchive = errors.New("not a valid workspace snapshot")

// Unpack extracts the snapshot tar read from r into dir, an existing empty
// directory. Every entry is created through an os.Root on dir, so no name,
// ".." or symlink (created from the tar or not) reaches outside it. Only
// directories, regular files and symlinks are accepted; modes keep only the
// permission bits 0755 (no setuid, setgid or sticky bit); hard links,
// devices, FIFOs, absolute or ".." names and duplicates are refused with an
// error wrapping ErrBadArchive. On error dir is left partly filled; the
// caller removes it.
func Unpack(r io.Reader, dir string, o UnpackOptions) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	own := func(name string) error {
		if o.UID <= 0 {
			return nil
		}
		return root.Lchown(name, o.UID, o.GID)
	}
	if err := own("."); err != nil {
		return err
	}
	var total int64
	dirs := map[string]bool{".": true}
	return eachEntry(r, o.MaxFiles, func(tr *tar.Reader, hdr *tar.Header, name string) error {
		if err := unpackEntry(root, dirs, tr, hdr, name, &total, o.MaxBytes); err != nil {
			return err
		}
		return own(name)
	})
}

// cleanName checks a tar entry's name and returns it cleaned.
func cleanName(n string) (string, error) {
	c := path.Clean(strings.TrimSuffix(n, "/"))
	if n == "" || path.IsAbs(n) || c == ".." || strings.HasPrefix(c, "../") || strings.ContainsRune(n, 0) || strings.Contains(n, "\\") {
		return "", fmt.Errorf("%w: entry name %q is not a relative path inside the tree", ErrBadArchive, n)
	}
	return c, nil
}

// unpackEntry writes one entry under root. dirs holds the directories this
// unpack made or found (a real directory, never a symlink), so a file's
// parent is made once, not once per file (os.Root's MkdirAll opens each
// component); every open still goes through root, which refuses to leave
// it.
func unpackEntry(root *os.Root, dirs map[string]bool, tr *tar.Reader, hdr *tar.Header, name string, total *int64, max int64) error {
	perm := os.FileMode(hdr.Mode) & 0o755
	if parent := path.Dir(name); !dirs[parent] {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, name, err)
		}
		for d := parent; d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(name, perm|0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, name, err)
		}
		if fi, err := root.Lstat(name); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: %s: not a directory", ErrBadArchive, name)
		}
		dirs[name] = true
		return nil
	case tar.TypeSymlink:
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, name, err)
		}
		return nil
	case tar.TypeReg:
		*total += hdr.Size
		if max > 0 && *total > max {
			return fmt.Errorf("%w: unpacked files exceed %d bytes", ErrTooLarge, max)
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscallNoFollow, perm|0o600)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, name, err)
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	default:
		return fmt.Errorf("%w: %s: entry type %q is not allowed (only directories, regular files and symlinks)", ErrBadArchive, name, hdr.Typeflag)
	}
}
