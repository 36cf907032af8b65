package workspace_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// forge writes, as any client allowed to publish to the bucket's subjects
// can, an object named name into obs whose record claims digest (the
// victim's) over the bytes body.
func forge(t *testing.T, js jetstream.JetStream, obs jetstream.ObjectStore, name, digest string, body []byte) {
	t.Helper()
	forgeRecord(t, js, obs, name, digest, body, "")
}

// forgeRecord is forge, the record naming chunks nuid when not empty
// (chunks the bucket does not hold).
func forgeRecord(t *testing.T, js jetstream.JetStream, obs jetstream.ObjectStore, name, digest string, body []byte, nuid string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := obs.PutBytes(ctx, name, body)
	require.NoError(t, err)
	raw, err := hex.DecodeString(strings.TrimPrefix(digest, "sha256:"))
	require.NoError(t, err)
	info.Digest = "SHA-256=" + base64.URLEncoding.EncodeToString(raw)
	if nuid != "" {
		info.NUID = nuid
	}
	data, err := json.Marshal(info)
	require.NoError(t, err)
	m := nats.NewMsg("$O." + info.Bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name)))
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Data = data
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	got, err := obs.GetInfo(ctx, name)
	require.NoError(t, err)
	require.Equal(t, info.Digest, got.Digest, "the record claims the victim's digest")
}

// TestSquattedSnapshot: an attacker who knows (or predicts) a snapshot's
// digest writes an object of that name whose record claims that digest
// over other bytes, in the uploads bucket (any submitter may) and, as an
// earlier version let it, in the workspace bucket. The victim's submit
// does not take the forged record for its snapshot: it uploads, the
// worker takes the bytes that hash to the digest, and the workspace
// bucket's object is repaired; a later overwrite of the upload changes
// nothing for the runs on it. Presence is decided by the bytes.
func TestSquattedSnapshot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ws, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	dir := testRepo(t)
	var b bytes.Buffer
	info, err := workspace.Snapshot(dir, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	name := messages.WorkspaceObjectName(info.Digest)
	ref := messages.WorkspaceRef{Name: name, Digest: info.Digest}
	evil := []byte("#!/bin/sh\necho the attacker's tree\n")
	forge(t, js, ws.ObjectStore, name, info.Digest, evil)
	forge(t, js, ws.Uploads, name, info.Digest, evil)
	require.False(t, workspace.Stored(ctx, ws, ref), "a record's claim is not the bytes")
	require.False(t, workspace.Stored(ctx, ws.Uploads, ref))

	up, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.Equal(t, ref, up.Ref)
	require.False(t, up.Reused, "the forged record is not taken for the snapshot")
	require.True(t, workspace.Stored(ctx, ws.Uploads, ref), "the upload replaced the forged object")

	// A worker without the snapshot cached takes the checked bytes.
	out := filepath.Join(t.TempDir(), "s.tar")
	require.NoError(t, workspace.Download(ctx, ws, ref, out, 0))
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	sum := sha256.Sum256(got)
	require.Equal(t, info.Digest, "sha256:"+hex.EncodeToString(sum[:]))
	require.True(t, workspace.Stored(ctx, ws, ref), "the workspace bucket's object is repaired")

	// The attacker overwrites the upload again: the workspace bucket, which
	// only workers write, already holds the bytes.
	forge(t, js, ws.Uploads, name, info.Digest, evil)
	require.NoError(t, workspace.Download(ctx, ws, ref, out, 0))
	up, err = workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.True(t, up.Reused)
	require.Equal(t, messages.BucketWorkspaces, up.Bucket)

	// A request pairing the victim's name with another digest, whose bytes
	// the attacker uploaded under that name, never makes the worker
	// replace the victim's object: only a name made of its digest is taken
	// from the uploads bucket.
	var eb bytes.Buffer
	edir := t.TempDir()
	write(t, edir, "a.txt", "the attacker's\n")
	einfo, err := workspace.Snapshot(edir, &eb, workspace.SnapshotOptions{})
	require.NoError(t, err)
	_, err = ws.Uploads.PutBytes(ctx, name, eb.Bytes())
	require.NoError(t, err)
	require.ErrorIs(t, workspace.Download(ctx, ws, messages.WorkspaceRef{Name: name, Digest: einfo.Digest}, out, 0), workspace.ErrDigestMismatch)
	require.True(t, workspace.Stored(ctx, ws, ref), "the victim's object is untouched")

	// Squatted before the first upload and never repaired: the worker
	// refuses the bytes (the digest check holds) and says so.
	other := t.TempDir()
	write(t, other, "a.txt", "predictable\n")
	b.Reset()
	oinfo, err := workspace.Snapshot(other, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	oref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(oinfo.Digest), Digest: oinfo.Digest}
	forge(t, js, ws.Uploads, oref.Name, oref.Digest, evil)
	require.ErrorIs(t, workspace.Download(ctx, ws, oref, out, 0), workspace.ErrDigestMismatch)
}

// TestForgedRecordWithoutChunks: a record claiming the digest over chunks
// the bucket does not hold makes neither the submitter nor the worker wait
// for them (nats.go would, until its deadline): the chunks are counted
// first. The worker refuses the object, the submitter uploads again, and
// the worker then takes it.
func TestForgedRecordWithoutChunks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ws, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	dir := testRepo(t)
	var b bytes.Buffer
	info, err := workspace.Snapshot(dir, &b, workspace.SnapshotOptions{})
	require.NoError(t, err)
	ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(info.Digest), Digest: info.Digest}
	forgeRecord(t, js, ws.Uploads, ref.Name, ref.Digest, bytes.Repeat([]byte("x"), 300<<10), "nochunks")
	out := filepath.Join(t.TempDir(), "s.tar")
	start := time.Now()
	err = workspace.Download(ctx, ws, ref, out, 0)
	require.ErrorIs(t, err, workspace.ErrDigestMismatch)
	require.ErrorContains(t, err, "the bucket holds 0")
	require.Less(t, time.Since(start), 10*time.Second, "nothing waited for the chunks")
	start = time.Now()
	up, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
	require.NoError(t, err)
	require.False(t, up.Reused)
	require.Less(t, time.Since(start), 10*time.Second)
	require.NoError(t, workspace.Download(ctx, ws, ref, out, 0))
}
