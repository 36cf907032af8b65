package workspace

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// epoch is the modification time of every snapshot entry: snapshots of
// equal trees are equal bytes whatever the files' times.
var epoch = time.Unix(0, 0).UTC()

// tarWriter writes deterministic tar entries: owner 0:0, no names, times at
// epoch, modes normalised to 0755/0644 (0755 when any execute bit is set)
// and 0777 for symlinks.
type tarWriter struct {
	tw  *tar.Writer
	buf []byte // copy buffer, made on first use
}

func newTarWriter(w io.Writer) *tarWriter { return &tarWriter{tw: tar.NewWriter(w)} }

func (t *tarWriter) dir(name string) error {
	return t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
}

func (t *tarWriter) symlink(name, target string) error {
	return t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: epoch, Format: tar.FormatPAX})
}

func (t *tarWriter) bytes(name string, b []byte) error {
	if err := t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(b)), Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := t.tw.Write(b)
	return err
}

// file writes the regular file name of root, whose Lstat was info, with
// exactly info.Size() bytes; a file that changed size meanwhile is an error.
func (t *tarWriter) file(root *os.Root, name string, info fs.FileInfo) error {
	return t.copyFile(root, name, name, info, nil)
}

// fileAs is file storing the file as entry name as, and returns the hex
// SHA-256 of its content.
func (t *tarWriter) fileAs(root *os.Root, name, as string, info fs.FileInfo) (string, error) {
	h := sha256.New()
	if err := t.copyFile(root, name, as, info, h); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// copyFile writes the regular file name of root as entry as, its content
// also to h when h is not nil.
func (t *tarWriter) copyFile(root *os.Root, name, as string, info fs.FileInfo, h io.Writer) error {
	mode := int64(0o644)
	if info.Mode().Perm()&0o111 != 0 {
		mode = 0o755
	}
	if err := t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: as, Size: info.Size(), Mode: mode, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscallNoFollow|syscallNonBlock, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var w io.Writer = t.tw
	if h != nil {
		w = io.MultiWriter(t.tw, h)
	}
	if t.buf == nil {
		t.buf = make([]byte, 256<<10)
	}
	n, err := io.CopyBuffer(w, io.LimitReader(f, info.Size()), t.buf)
	if err != nil {
		return err
	}
	if n != info.Size() {
		return fmt.Errorf("%s changed while it was read (%d of %d bytes)", name, n, info.Size())
	}
	return nil
}

func (t *tarWriter) close() error { return t.tw.Close() }

// countWriter counts bytes and fails once more than max were written (max
// 0: no bound).
type countWriter struct {
	w   io.Writer
	n   int64
	max int64
}

// ErrTooLarge is wrapped by errors for a snapshot, workspace or result
// larger than its limit.
var ErrTooLarge = fmt.Errorf("too large")

func (c *countWriter) Write(p []byte) (int, error) {
	if c.max > 0 && c.n+int64(len(p)) > c.max {
		return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, c.max)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
