package workspace_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// TestCaptureStreamRoundTrip: what `workspace capture` writes, the worker
// reads back; a stream breaking the format or the caps is refused.
func TestCaptureStreamRoundTrip(t *testing.T) {
	t.Parallel()
	c := &workspace.Captured{Result: messages.WorkspaceResult{Base: "b", Head: "h", Commits: 1, FilesChanged: 2}, Patch: []byte{}, Bundle: []byte("bundle")}
	var b bytes.Buffer
	require.NoError(t, workspace.WriteCaptureStream(&b, c))
	got, err := workspace.ReadCaptureStream(bytes.NewReader(b.Bytes()), int64(b.Len()), 100)
	require.NoError(t, err)
	require.Equal(t, c.Result, got.Result)
	patch, ok := got.Object(messages.ResultPatch)
	require.True(t, ok, "an empty patch is still a patch")
	require.Zero(t, patch.Size)
	bundle, ok := got.Object(messages.ResultBundle)
	require.True(t, ok)
	data, err := bundle.Bytes()
	require.NoError(t, err)
	require.Equal(t, []byte("bundle"), data, "read from its place in the stream")
	sum := sha256.Sum256([]byte("bundle"))
	require.Equal(t, [2]any{int64(6), hex.EncodeToString(sum[:])}, [2]any{bundle.Size, bundle.SHA256})
	_, ok = got.Object(messages.ResultArtifacts)
	require.False(t, ok)

	file := func(name, data string) tar.Header {
		return tar.Header{Name: name, Typeflag: tar.TypeReg, Size: int64(len(data)), Mode: 0o444}
	}
	rec := `{"commits":1,"files_changed":0,"insertions":0,"deletions":0}`
	withData := func(entries ...[2]string) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range entries {
			h := file(e[0], e[1])
			require.NoError(t, tw.WriteHeader(&h))
			_, _ = tw.Write([]byte(e[1]))
		}
		require.NoError(t, tw.Close())
		return b.Bytes()
	}
	for name, stream := range map[string][]byte{
		"no record":       withData([2]string{"patch", "p"}),
		"record second":   withData([2]string{"patch", "p"}, [2]string{"result.json", rec}),
		"unknown field":   withData([2]string{"result.json", `{"commits":1,"evil":true}`}),
		"duplicate key":   withData([2]string{"result.json", `{"commits":1,"commits":2}`}),
		"objects named":   withData([2]string{"result.json", `{"commits":1,"objects":[{"name":"x","size":1,"sha256":"00"}]}`}),
		"unknown entry":   withData([2]string{"result.json", rec}, [2]string{"../etc/passwd", "x"}),
		"object twice":    withData([2]string{"result.json", rec}, [2]string{"patch", "p"}, [2]string{"patch", "p"}),
		"object over cap": withData([2]string{"result.json", rec}, [2]string{"bundle", strings.Repeat("b", 101)}),
		"symlink":         tarOf(t, tar.Header{Name: "result.json", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}),
		"not a tar":       []byte("garbage"),
	} {
		_, err := workspace.ReadCaptureStream(bytes.NewReader(stream), int64(len(stream)), 100)
		require.ErrorIs(t, err, workspace.ErrBadCaptureStream, name)
	}
}

// TestCaptureStreamObjectsNotHeld: reading a stream with a 32 MiB object
// allocates a small fraction of it: the object is hashed as it is read and
// left in the stream's source.
func TestCaptureStreamObjectsNotHeld(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 32<<20)
	var b bytes.Buffer
	require.NoError(t, workspace.WriteCaptureStream(&b, &workspace.Captured{Bundle: big}))
	src := bytes.NewReader(b.Bytes())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, err := workspace.ReadCaptureStream(src, int64(b.Len()), 64<<20)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	o, ok := c.Object(messages.ResultBundle)
	require.True(t, ok)
	require.Equal(t, int64(32<<20), o.Size)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "the object was not copied into memory")
}
