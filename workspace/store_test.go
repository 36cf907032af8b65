package workspace_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// TestUploadOnceDownloadChecked uploads the same work tree ten times: one
// object is stored, in the uploads bucket, the other nine find its bytes
// there. The worker's download takes it from there, its bytes checked,
// into the workspace bucket, where the next upload finds it. The download
// refuses a missing object, a wrong digest and an object over its cap.
func TestUploadOnceDownloadChecked(t *testing.T) {
	t.Parallel()
	ctx, ws := testBuckets(t)
	dir := testRepo(t)

	var refs []messages.WorkspaceRef
	for i := range 10 {
		up, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
		require.NoError(t, err)
		require.Equal(t, i > 0, up.Reused, "upload %d", i)
		require.Equal(t, messages.BucketUploads, up.Bucket)
		refs = append(refs, up.Ref)
	}
	for _, r := range refs {
		require.Equal(t, refs[0], r)
	}
	st, err := ws.Uploads.Status(ctx)
	require.NoError(t, err)
	objs, err := ws.Uploads.List(ctx)
	require.NoError(t, err)
	require.Len(t, objs, 1, "ten runs share one object")
	require.Less(t, st.Size(), 2*objs[0].Size+4096, "stored once")
	_, err = ws.List(ctx)
	require.ErrorIs(t, err, jetstream.ErrNoObjectsFound, "only a worker writes the workspace bucket")

	out := filepath.Join(t.TempDir(), "s.tar")
	require.NoError(t, workspace.Download(ctx, ws, refs[0], out, 0))
	fi, err := os.Stat(out)
	require.NoError(t, err)
	require.EqualValues(t, objs[0].Size, fi.Size())
	require.True(t, workspace.Stored(ctx, ws, refs[0]), "checked into the workspace bucket")
	up, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.True(t, up.Reused)
	require.Equal(t, messages.BucketWorkspaces, up.Bucket)

	bad := refs[0]
	bad.Digest = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
	require.ErrorIs(t, workspace.Download(ctx, ws, bad, out, 0), workspace.ErrDigestMismatch)
	missing := refs[0]
	missing.Name = "nope.tar"
	require.ErrorIs(t, workspace.Download(ctx, ws, missing, out, 0), workspace.ErrSnapshotMissing)
	require.ErrorIs(t, workspace.Download(ctx, ws, refs[0], out, 100), workspace.ErrTooLarge)
	_, err = workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{MaxBytes: 100})
	require.ErrorIs(t, err, workspace.ErrTooLarge)
	objs, err = ws.Uploads.List(ctx)
	require.NoError(t, err)
	require.Len(t, objs, 1, "a refused upload stores nothing")
}

// TestDownloadRefusesAReplacedObject: an object put again under the name
// with other bytes (any NATS client allowed to write the bucket can) fails
// the digest check before a byte is written, and a malformed digest is a
// mismatch, never a panic. With the uploads bucket beside it, the worker
// takes the checked bytes from there and repairs the object.
func TestDownloadRefusesAReplacedObject(t *testing.T) {
	t.Parallel()
	ctx, ws := testBuckets(t)
	dir := testRepo(t)
	up, err := workspace.Upload(ctx, ws.ObjectStore, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	_, err = ws.PutBytes(ctx, up.Ref.Name, []byte("other bytes"))
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "s.tar")
	require.ErrorIs(t, workspace.Download(ctx, ws.ObjectStore, up.Ref, out, 0), workspace.ErrDigestMismatch)
	require.NoFileExists(t, out)
	short := up.Ref
	short.Digest = "sha"
	require.ErrorIs(t, workspace.Download(ctx, ws.ObjectStore, short, out, 0), workspace.ErrDigestMismatch)

	// The submitter's upload goes to the uploads bucket; the worker checks
	// it and replaces the broken object.
	again, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.False(t, again.Reused)
	require.NoError(t, workspace.Download(ctx, ws, up.Ref, out, 0))
	require.NoError(t, workspace.Download(ctx, ws.ObjectStore, up.Ref, out, 0), "repaired")
}

// TestSubmitStreamed: with a cache directory, a first submit of a tree
// streams the snapshot into the uploads bucket while taking it and links
// the digest's name to that object; a worker follows the link, checks the
// bytes against the digest and stores them in the workspace bucket. The
// next submit of the same directory finds its last snapshot stored and
// takes the whole snapshot first: the unchanged tree is not sent again.
// A link to other bytes, or out of the bucket, is refused.
func TestSubmitStreamed(t *testing.T) {
	t.Parallel()
	ctx, ws := testBuckets(t)
	dir := testRepo(t)
	o := workspace.SnapshotOptions{CacheDir: t.TempDir()}

	up, err := workspace.Submit(ctx, ws, dir, o)
	require.NoError(t, err)
	require.True(t, up.Streamed)
	require.False(t, up.Reused)
	require.Equal(t, messages.WorkspaceObjectName(up.Info.Digest), up.Ref.Name, "the request names the digest's name, as always")
	link, err := ws.Uploads.GetInfo(ctx, up.Ref.Name)
	require.NoError(t, err)
	require.NotNil(t, link.Opts)
	require.NotNil(t, link.Opts.Link, "the digest's name is a link")
	require.True(t, strings.HasPrefix(link.Opts.Link.Name, "upload-"), link.Opts.Link.Name)
	var whole bytes.Buffer
	info, err := workspace.Snapshot(dir, &whole, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.Equal(t, info.Digest, up.Info.Digest, "the streamed snapshot is the snapshot")

	out := filepath.Join(t.TempDir(), "s.tar")
	require.NoError(t, workspace.Download(ctx, ws, up.Ref, out, 0))
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, whole.Bytes(), got)
	require.True(t, workspace.Stored(ctx, ws, up.Ref), "checked into the workspace bucket")

	again, err := workspace.Submit(ctx, ws, dir, o)
	require.NoError(t, err)
	require.False(t, again.Streamed, "its last snapshot is stored: taken whole first")
	require.True(t, again.Reused)
	objs, err := ws.Uploads.List(ctx)
	require.NoError(t, err)
	require.Len(t, objs, 2, "the streamed object and its link, nothing more")

	// A link of another digest's name to these bytes is a mismatch; a link
	// out of the bucket is refused.
	other := messages.WorkspaceRef{Digest: "sha256:" + strings.Repeat("ab", 32)}
	other.Name = messages.WorkspaceObjectName(other.Digest)
	target, err := ws.Uploads.GetInfo(ctx, link.Opts.Link.Name)
	require.NoError(t, err)
	_, err = ws.Uploads.AddLink(ctx, other.Name, target)
	require.NoError(t, err)
	require.ErrorIs(t, workspace.Download(ctx, ws, other, out, 0), workspace.ErrDigestMismatch)
	_, err = ws.Uploads.AddBucketLink(ctx, "sha256-"+strings.Repeat("cd", 32)+".tar", ws.ObjectStore)
	require.NoError(t, err)
	out2 := messages.WorkspaceRef{Digest: "sha256:" + strings.Repeat("cd", 32)}
	out2.Name = messages.WorkspaceObjectName(out2.Digest)
	require.ErrorIs(t, workspace.Download(ctx, ws, out2, out, 0), workspace.ErrDigestMismatch)
}

// testBuckets starts a NATS server and returns a context bounded to 30 s,
// and the workspace buckets (EnsureBuckets).
func testBuckets(t *testing.T) (context.Context, *workspace.SnapshotStore) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ws, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	return ctx, ws
}
