// Package staged stages the static binaries run containers execute (the
// bridge, the workspace tool): content-addressed copies the runs mount, so
// that a rebuild while runs are live changes nothing they execute and a
// receipt names what they ran by its digest. It is the stages' shared
// library, not a stage.
package staged

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Stager stages one binary: a copy of the source under its directory named
// by its SHA-256, mode 0555, written to a temporary name, fsynced, renamed
// and hashed again. Copies no run refers to are removed (GC). Safe for
// concurrent use.
type Stager struct {
	dir string
	// what names the binary in errors; "" means "coordination bridge".
	what string

	mu     sync.Mutex
	src    srcKey // the source last staged
	path   string // its staged copy
	digest string // its SHA-256, hex
}

// srcKey identifies a version of the source file without reading it.
type srcKey struct {
	path  string
	size  int64
	mtime time.Time
	ino   uint64
}

// New returns a Stager keeping its copies in dir (created when first
// needed); what names the binary in errors ("" for the coordination
// bridge).
func New(dir, what string) *Stager { return &Stager{dir: dir, what: what} }

// Dir returns the directory the copies are kept in.
func (s *Stager) Dir() string { return s.dir }

// Stage returns the staged copy of the binary at src and its SHA-256
// (hex), staging it when src changed since the last call (or its copy is
// gone). It refuses a source that is not a regular file, or a dynamically
// linked ELF executable (it could not run in a scratch image).
func (s *Stager) Stage(src string) (path, digest string, err error) {
	path, digest, err = s.stageFile(src)
	if err != nil && s.what != "" {
		err = errors.New(strings.Replace(err.Error(), "coordination bridge", s.what, 1))
	}
	return path, digest, err
}

// stageFile is stage with the bridge's wording.
func (s *Stager) stageFile(src string) (path, digest string, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return "", "", fmt.Errorf("coordination bridge cannot be staged: %w (the worker stages its own executable unless --bridge names another; or turn coordination off in the profile)", err)
	}
	if !fi.Mode().IsRegular() {
		return "", "", fmt.Errorf("coordination bridge cannot be staged: %s is not a regular file (has %s)", src, fi.Mode())
	}
	key := srcKey{path: src, size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key.ino = st.Ino
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == s.src {
		if _, err := os.Stat(s.path); err == nil {
			return s.path, s.digest, nil
		}
	}
	if err := checkStatic(src); err != nil {
		return "", "", fmt.Errorf("coordination bridge cannot be staged: %w", err)
	}
	path, digest, err = s.copyIn(src)
	if err != nil {
		return "", "", fmt.Errorf("coordination bridge cannot be staged: %w", err)
	}
	s.src, s.path, s.digest = key, path, digest
	return path, digest, nil
}

// copyIn copies src to dir/<sha256>, mode 0555, through a temporary file
// that is fsynced before the rename, then hashes the result again.
func (s *Stager) copyIn(src string) (string, string, error) {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return "", "", err
	}
	// The directory's mode passes through the worker's umask: the run's
	// user must be able to reach the copy.
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return "", "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", "", err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(tmp.Name()) // gone after the rename; removed on failure
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		tmp.Close()
		return "", "", err
	}
	if err := errors.Join(tmp.Chmod(0o555), tmp.Sync(), tmp.Close()); err != nil {
		return "", "", err
	}
	digest := hex.EncodeToString(h.Sum(nil))
	path := filepath.Join(s.dir, digest)
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", "", err
	}
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync() // the rename itself durable
		d.Close()
	}
	got, err := fileDigest(path)
	if err != nil {
		return "", "", err
	}
	if got != digest {
		_ = os.Remove(path)
		return "", "", fmt.Errorf("staged copy %s has digest %s, not %s", path, got, digest)
	}
	return path, digest, nil
}

// GC removes staged copies (and leftover temporary files) whose digest is
// neither the current one nor in keep.
func (s *Stager) GC(keep map[string]bool) error {
	s.mu.Lock()
	current := s.digest
	s.mu.Unlock()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == current || keep[e.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// fileDigest returns the SHA-256 (hex) of the file at path.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkStatic refuses a dynamically linked ELF executable: run containers
// have no loader nor libc. A file that is not ELF (a script, say) is left
// to the kernel.
func checkStatic(path string) error {
	raw, err := os.Open(path)
	if err != nil {
		return err
	}
	defer raw.Close()
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(raw, magic); err != nil || string(magic) != elf.ELFMAG {
		return nil
	}
	f, err := elf.NewFile(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: a run container has no loader (build it with CGO_ENABLED=0)", path)
		}
	}
	return nil
}
