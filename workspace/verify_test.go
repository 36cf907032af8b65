package workspace_test

import (
	"archive/tar"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// verifyRepo makes a repository of two commits on main (a file, an
// executable, a symlink, a subdirectory and, in the second, a submodule
// entry) and returns it with the two commits.
func verifyRepo(t *testing.T) (src, first, second string) {
	t.Helper()
	src = t.TempDir()
	workertest.Git(t, src, "init", "-q", "-b", "main")
	require.NoError(t, os.MkdirAll(filepath.Join(src, "dir"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(src, "README"), []byte("one\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "dir", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	require.NoError(t, os.Symlink("dir/run.sh", filepath.Join(src, "link")))
	workertest.Git(t, src, "add", "-A")
	workertest.Git(t, src, "commit", "-qm", "first")
	first = workertest.Git(t, src, "rev-parse", "HEAD")
	require.NoError(t, os.WriteFile(filepath.Join(src, "README"), []byte("two\n"), 0o644))
	workertest.Git(t, src, "update-index", "--add", "--cacheinfo", "160000,"+first+",sub")
	workertest.Git(t, src, "add", "README")
	workertest.Git(t, src, "commit", "-qm", "second")
	second = workertest.Git(t, src, "rev-parse", "HEAD")
	return src, first, second
}

// cloneSnapshot returns the snapshot of a clean clone of src at rev (a
// branch, or a commit for a detached HEAD), with edit applied to the clone's
// work tree first: a git source's snapshot when edit is nil
// (TestRemoteSnapshotEqualsCloneSnapshot).
func cloneSnapshot(t *testing.T, src, rev string, edit func(dir string)) []byte {
	t.Helper()
	clone := t.TempDir()
	workertest.Git(t, clone, "clone", "-q", "--no-local", src, ".")
	workertest.Git(t, clone, "checkout", "-q", rev)
	if edit != nil {
		edit(clone)
	}
	var b bytes.Buffer
	_, err := workspace.Snapshot(clone, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	return b.Bytes()
}

// rewriteTar returns the tar b with each entry passed through fn (which
// may change its header and data, or drop it by returning a nil header)
// and extra entries appended.
func rewriteTar(t *testing.T, b []byte, fn func(*tar.Header, []byte) (*tar.Header, []byte), extra map[string][]byte) []byte {
	t.Helper()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		if fn != nil {
			if hdr, data = fn(hdr, data); hdr == nil {
				continue
			}
		}
		hdr.Size = int64(len(data))
		require.NoError(t, tw.WriteHeader(hdr))
		_, err = tw.Write(data)
		require.NoError(t, err)
	}
	for name, data := range extra {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}))
		_, err := tw.Write(data)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return out.Bytes()
}

// entry returns the data of entry name of the tar b.
func entry(t *testing.T, b []byte, name string) []byte {
	t.Helper()
	v, ok := tarNames(t, b)[name]
	require.True(t, ok, "%s is not in the snapshot", name)
	return []byte(v)
}

// replace returns fn for rewriteTar setting entry name's data.
func replace(name string, data []byte) func(*tar.Header, []byte) (*tar.Header, []byte) {
	return func(h *tar.Header, d []byte) (*tar.Header, []byte) {
		if h.Name == name {
			return h, data
		}
		return h, d
	}
}

// looseObject is the loose object file of an object of typ and content.
func looseObject(t *testing.T, typ string, content []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zlib.NewWriter(&b)
	fmt.Fprintf(z, "%s %d\x00", typ, len(content))
	_, _ = z.Write(content)
	require.NoError(t, z.Close())
	return b.Bytes()
}

// VerifyCommit accepts the snapshot of a git source's commit (on a branch,
// or detached) and refuses, with ErrWrongCommit and the reason, a valid
// snapshot of another commit, one whose files are another tree, one whose
// .git would show a run something else than the commit, and one holding
// an object that does not hash to its name.
func TestVerifyCommit(t *testing.T) {
	t.Parallel()
	src, first, second := verifyRepo(t)
	good := cloneSnapshot(t, src, "main", nil)
	detached := cloneSnapshot(t, src, first, nil)
	o := workspace.UnpackOptions{MaxBytes: 1 << 20, MaxFiles: 100}
	verify := func(b []byte, commit string) error {
		return workspace.VerifyCommit(bytes.NewReader(b), int64(len(b)), commit, o)
	}
	require.NoError(t, verify(good, second))
	require.NoError(t, verify(detached, first), "a detached HEAD (a tag's snapshot)")
	require.Equal(t, "ref: refs/heads/main\n", string(entry(t, good, ".git/HEAD")))
	require.Contains(t, tarNames(t, good), "sub/", "the submodule is an empty directory")

	readme := workertest.Git(t, src, "rev-parse", second+":README")
	edits := []struct {
		name   string
		snap   []byte
		commit string
		why    string
	}{
		{"another commit's snapshot", detached, second, "its HEAD is " + first},
		{"a changed file", cloneSnapshot(t, src, "main", func(dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "README"), []byte("three\n"), 0o644))
		}), second, "file README is not the commit's"},
		{"a file's mode", cloneSnapshot(t, src, "main", func(dir string) {
			require.NoError(t, os.Chmod(filepath.Join(dir, "dir", "run.sh"), 0o644))
		}), second, "file dir/run.sh is not the commit's (type or mode)"},
		{"an extra file", cloneSnapshot(t, src, "main", func(dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "extra"), []byte("x\n"), 0o644))
		}), second, "it holds extra, which the commit's tree does not"},
		{"a missing file", cloneSnapshot(t, src, "main", func(dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "link")))
		}), second, "it lacks link, which the commit's tree holds"},
		{"a changed symlink", cloneSnapshot(t, src, "main", func(dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "link")))
			require.NoError(t, os.Symlink("README", filepath.Join(dir, "link")))
		}), second, "symlink link is not the commit's"},
		{"a file in the submodule", rewriteTar(t, good, nil, map[string][]byte{"sub/x": []byte("x\n")}), second,
			"it holds sub/x, which the commit's tree does not"},
		{"HEAD's branch names the commit, the files are another's",
			rewriteTar(t, good, replace(".git/refs/heads/main", []byte(first+"\n")), nil), first,
			"file README is not the commit's"},
		{"HEAD names a branch it lacks", rewriteTar(t, good, replace(".git/HEAD", []byte("ref: refs/heads/dev\n")), nil), second,
			"its HEAD names refs/heads/dev, which it does not hold"},
		{"a second branch", rewriteTar(t, good, nil, map[string][]byte{".git/refs/heads/dev": []byte(first + "\n")}), second,
			"it holds the reference refs/heads/dev beside HEAD's"},
		{"a config", rewriteTar(t, good, replace(".git/config", []byte("[core]\n\tfsmonitor = evil\n")), nil), second,
			"its .git/config is not the minimal one"},
		{"a hook", rewriteTar(t, good, nil, map[string][]byte{".git/hooks/post-checkout": []byte("#!/bin/sh\n")}), second,
			"its .git holds .git/hooks/post-checkout, which a snapshot of a commit never does"},
		{"another index", rewriteTar(t, good, replace(".git/index", entry(t, detached, ".git/index")), nil), second,
			".git/index lists"},
		{"no such object", rewriteTar(t, detached, replace(".git/HEAD", []byte(second+"\n")), nil), second,
			"it holds no object " + second},
		{"an object that does not hash to its name",
			rewriteTar(t, detached, replace(".git/HEAD", []byte(second+"\n")), map[string][]byte{
				".git/objects/" + second[:2] + "/" + second[2:]: looseObject(t, "commit", commitObject(t, src, first)),
			}), second, "the object stored as " + second + " hashes to " + first},
		{"a blob that does not hash to its name", rewriteTar(t, good, nil, map[string][]byte{
			".git/objects/" + readme[:2] + "/" + readme[2:]: looseObject(t, "blob", []byte("not two\n")),
		}), second, "the object stored as " + readme + " hashes to "},
		{"a pack index naming the wrong objects", rewriteTar(t, good, func(h *tar.Header, d []byte) (*tar.Header, []byte) {
			if strings.HasSuffix(h.Name, ".idx") {
				d = swapFirstOffsets(t, d)
			}
			return h, d
		}, nil), second, "pack-"},
	}
	for _, tc := range edits {
		err := verify(tc.snap, tc.commit)
		require.ErrorIs(t, err, workspace.ErrWrongCommit, tc.name)
		require.ErrorContains(t, err, "workspace snapshot does not hold commit "+tc.commit+": "+tc.why, tc.name)
	}

	swapped := edits[len(edits)-1]
	require.ErrorContains(t, verify(swapped.snap, second), "the object stored as", swapped.name)
	require.ErrorContains(t, verify(good, "nope"), "is not 40 lowercase hex digits")
	require.NotErrorIs(t, verify(good, "nope"), workspace.ErrWrongCommit)
}

// commitObject returns the content of commit h of the repository src.
func commitObject(t *testing.T, src, h string) []byte {
	t.Helper()
	return []byte(workertest.Git(t, src, "cat-file", "commit", h) + "\n")
}

// swapFirstOffsets returns a pack index (version 2) whose first two
// objects' offsets are swapped: each name leads to the other's object.
func swapFirstOffsets(t *testing.T, idx []byte) []byte {
	t.Helper()
	idx = bytes.Clone(idx)
	n := int(binary.BigEndian.Uint32(idx[8+4*255:]))
	require.GreaterOrEqual(t, n, 2)
	offs := 8 + 256*4 + 24*n
	a, b := idx[offs:offs+4], idx[offs+4:offs+8]
	var tmp [4]byte
	copy(tmp[:], a)
	copy(a, b)
	copy(b, tmp[:])
	return idx
}

// TestVerifyCommitLargeOffsets: an index entry may give its object's
// offset through the index's table of 8-byte offsets (git writes one for
// packs over 2 GiB); VerifyCommit follows it, both where it hashes every
// object and where it looks the commit's objects up, and refuses an entry
// pointing past that table.
func TestVerifyCommitLargeOffsets(t *testing.T) {
	t.Parallel()
	src, _, second := verifyRepo(t)
	good := cloneSnapshot(t, src, "main", nil)
	o := workspace.UnpackOptions{MaxBytes: 1 << 20, MaxFiles: 100}
	verify := func(b []byte) error {
		return workspace.VerifyCommit(bytes.NewReader(b), int64(len(b)), second, o)
	}
	withLarge := func(slot uint32) []byte {
		return rewriteTar(t, good, func(h *tar.Header, d []byte) (*tar.Header, []byte) {
			if strings.HasSuffix(h.Name, ".idx") {
				d = largeOffsets(t, d, slot)
			}
			return h, d
		}, nil)
	}
	require.NoError(t, verify(withLarge(0)), "every offset read through the 8-byte table")
	err := verify(withLarge(1 << 20))
	require.ErrorIs(t, err, workspace.ErrWrongCommit)
	require.ErrorContains(t, err, "truncated")
}

// largeOffsets returns a pack index (version 2) whose every object's
// offset is moved into a table of 8-byte offsets, the 4-byte entry naming
// its slot there (plus skew: a slot past the table when not 0).
func largeOffsets(t *testing.T, idx []byte, skew uint32) []byte {
	t.Helper()
	n := int(binary.BigEndian.Uint32(idx[8+4*255:]))
	offs := 8 + 256*4 + 24*n
	require.Len(t, idx, offs+4*n+40, "the index has no 8-byte offsets yet")
	out := bytes.Clone(idx[:offs+4*n])
	large := make([]byte, 8*n)
	for i := range n {
		off := binary.BigEndian.Uint32(idx[offs+4*i:])
		binary.BigEndian.PutUint64(large[8*i:], uint64(off))
		binary.BigEndian.PutUint32(out[offs+4*i:], 0x80000000|(uint32(i)+skew))
	}
	out = append(out, large...)
	return append(out, idx[offs+4*n:]...)
}
