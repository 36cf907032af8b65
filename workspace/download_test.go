package workspace_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
	"github.com/jetcrew/jetcrew/workspace"
)

// lookup is what FetchLater or OpenStream and ReadTo did with one snapshot:
// the bytes they gave, whether a store into the workspace bucket was left
// to do, their error, and whether the workspace bucket held the snapshot
// after (the store, if any, done).
type lookup struct {
	data  []byte
	store bool
	err   error
	held  bool
}

// fetchLater runs workspace.FetchLater into a file and reads it back.
func fetchLater(ctx context.Context, t *testing.T, s *workspace.SnapshotStore, ref messages.WorkspaceRef, max int64) (lookup, workspace.StoreChecked) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.tar")
	store, err := workspace.FetchLater(ctx, s, ref, path, max)
	if err != nil {
		return lookup{err: err}, nil
	}
	data, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	return lookup{data: data, store: store != nil}, store
}

// openStream runs workspace.OpenStream, then ReadTo into memory.
func openStream(ctx context.Context, s *workspace.SnapshotStore, ref messages.WorkspaceRef, max int64) (lookup, workspace.StoreChecked) {
	st, err := workspace.OpenStream(ctx, s, ref, max)
	if err != nil {
		return lookup{err: err}, nil
	}
	var b bytes.Buffer
	store, err := st.ReadTo(ctx, &b)
	if err != nil {
		return lookup{err: err}, nil
	}
	if int64(b.Len()) != st.Size() {
		return lookup{err: os.ErrInvalid}, nil
	}
	return lookup{data: b.Bytes(), store: store != nil}, store
}

// storedMeanwhile is an uploads bucket that, asked once for an object's
// record, first lets another worker store the snapshot in the workspace
// bucket, then answers that the upload is gone.
type storedMeanwhile struct {
	jetstream.ObjectStore
	once  sync.Once
	store func()
}

func (s *storedMeanwhile) GetInfo(ctx context.Context, name string, opts ...jetstream.GetObjectInfoOpt) (*jetstream.ObjectInfo, error) {
	s.once.Do(s.store)
	return nil, jetstream.ErrObjectNotFound
}

// TestFetchLaterAndOpenStream pins where the worker's two reads of a
// snapshot look and what each says, bucket by bucket: FetchLater
// (download into a file) and OpenStream with ReadTo (streamed in) take the
// workspace bucket's object, else the upload named by the digest, with
// the same refusals; where they differ is written down. FetchLater takes
// the upload when the workspace bucket's copy turns out broken as it is
// read (the stream says ErrStreamBroken, its caller then fetches), and
// asks the workspace bucket again when neither bucket held the snapshot
// (another worker may have moved it meanwhile; the stream does not).
func TestFetchLaterAndOpenStream(t *testing.T) {
	t.Parallel()
	dir := testRepo(t)
	var snap bytes.Buffer
	info, err := workspace.Snapshot(dir, &snap, workspace.SnapshotOptions{})
	require.NoError(t, err)
	ref := messages.WorkspaceRef{Name: messages.WorkspaceObjectName(info.Digest), Digest: info.Digest}
	evil := []byte("#!/bin/sh\necho the attacker's tree\n")
	missing := "workspace snapshot not found: object \"" + ref.Name + "\" in bucket " + messages.BucketWorkspaces + " (expired or never uploaded)"

	for _, tc := range []struct {
		name string
		// setup fills the buckets, and may return the store to read
		// (nil: ws).
		setup         func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore
		ref           messages.WorkspaceRef
		max           int64
		fetch, stream lookup
		errIs         []error // both errors wrap these
		msg           string  // both errors say this, when set
	}{
		{name: "the workspace bucket holds it", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := workspace.Upload(ctx, ws.ObjectStore, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return nil
		}, ref: ref, fetch: lookup{data: snap.Bytes(), held: true}, stream: lookup{data: snap.Bytes(), held: true}},
		{name: "only the upload", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return nil
		}, ref: ref, fetch: lookup{data: snap.Bytes(), store: true, held: true}, stream: lookup{data: snap.Bytes(), store: true, held: true}},
		{name: "a broken copy in the workspace bucket", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			forge(t, js, ws.ObjectStore, ref.Name, ref.Digest, evil)
			_, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return nil
		}, ref: ref, fetch: lookup{data: snap.Bytes(), store: true, held: true}, stream: lookup{err: workspace.ErrStreamBroken}},
		{name: "another digest's record in the workspace bucket", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := ws.PutBytes(ctx, ref.Name, evil)
			require.NoError(t, err)
			_, err = workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return nil
		}, ref: ref, fetch: lookup{data: snap.Bytes(), store: true, held: true}, stream: lookup{data: snap.Bytes(), store: true, held: true}},
		{name: "another digest's record in the workspace bucket, no upload", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := ws.PutBytes(ctx, ref.Name, evil)
			require.NoError(t, err)
			return nil
		}, ref: ref, fetch: lookup{err: workspace.ErrDigestMismatch}, stream: lookup{err: workspace.ErrDigestMismatch}, msg: "the request names " + ref.Digest},
		{name: "a broken copy in the workspace bucket, no upload", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			forge(t, js, ws.ObjectStore, ref.Name, ref.Digest, evil)
			return nil
		}, ref: ref, fetch: lookup{err: workspace.ErrDigestMismatch}, stream: lookup{err: workspace.ErrStreamBroken}, errIs: []error{workspace.ErrDigestMismatch},
			msg: "its bytes differ from its record's digest"},
		{name: "another digest's record, repaired by another worker while the upload was looked for", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := ws.PutBytes(ctx, ref.Name, evil)
			require.NoError(t, err)
			return &workspace.SnapshotStore{ObjectStore: ws.ObjectStore, Uploads: &storedMeanwhile{ObjectStore: ws.Uploads, store: func() {
				_, err := workspace.Upload(ctx, ws.ObjectStore, dir, workspace.SnapshotOptions{})
				require.NoError(t, err)
			}}}
		}, ref: ref, fetch: lookup{err: workspace.ErrDigestMismatch, held: true}, stream: lookup{err: workspace.ErrDigestMismatch, held: true}},
		{name: "a broken upload", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			forge(t, js, ws.Uploads, ref.Name, ref.Digest, evil)
			return nil
		}, ref: ref, fetch: lookup{err: workspace.ErrDigestMismatch}, stream: lookup{err: workspace.ErrStreamBroken}, errIs: []error{workspace.ErrDigestMismatch}},
		{name: "neither holds it", setup: func(context.Context, *testing.T, jetstream.JetStream, *workspace.SnapshotStore) *workspace.SnapshotStore {
			return nil
		},
			ref: ref, fetch: lookup{err: workspace.ErrSnapshotMissing}, stream: lookup{err: workspace.ErrSnapshotMissing}, msg: missing},
		{name: "an upload under a name not the digest's", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := ws.Uploads.PutBytes(ctx, "nope.tar", snap.Bytes())
			require.NoError(t, err)
			return nil
		}, ref: messages.WorkspaceRef{Name: "nope.tar", Digest: ref.Digest}, fetch: lookup{err: workspace.ErrSnapshotMissing}, stream: lookup{err: workspace.ErrSnapshotMissing},
			msg: "(an upload of that name is taken only when named by its digest, " + ref.Name + ")"},
		{name: "over the cap", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return nil
		}, ref: ref, max: 100, fetch: lookup{err: workspace.ErrTooLarge}, stream: lookup{err: workspace.ErrTooLarge}},
		{name: "no uploads bucket", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			_, err := workspace.Upload(ctx, ws, dir, workspace.SnapshotOptions{})
			require.NoError(t, err)
			return &workspace.SnapshotStore{ObjectStore: ws.ObjectStore}
		}, ref: ref, fetch: lookup{err: workspace.ErrSnapshotMissing}, stream: lookup{err: workspace.ErrSnapshotMissing}, msg: missing},
		{name: "stored by another worker while looked for", setup: func(ctx context.Context, t *testing.T, js jetstream.JetStream, ws *workspace.SnapshotStore) *workspace.SnapshotStore {
			return &workspace.SnapshotStore{ObjectStore: ws.ObjectStore, Uploads: &storedMeanwhile{ObjectStore: ws.Uploads, store: func() {
				_, err := workspace.Upload(ctx, ws.ObjectStore, dir, workspace.SnapshotOptions{})
				require.NoError(t, err)
			}}}
		}, ref: ref, fetch: lookup{data: snap.Bytes(), held: true}, stream: lookup{err: workspace.ErrSnapshotMissing, held: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, read := range []string{"fetch", "stream"} {
				ctx, js, ws := testBucketsJS(t)
				s := tc.setup(ctx, t, js, ws)
				if s == nil {
					s = ws
				}
				var got lookup
				var store workspace.StoreChecked
				want := tc.fetch
				if read == "fetch" {
					got, store = fetchLater(ctx, t, s, tc.ref, tc.max)
				} else {
					got, store = openStream(ctx, s, tc.ref, tc.max)
					want = tc.stream
				}
				if store != nil {
					path := filepath.Join(t.TempDir(), "checked.tar")
					require.NoError(t, os.WriteFile(path, got.data, 0o600))
					require.NoError(t, store(ctx, path))
				}
				got.held = workspace.Stored(ctx, ws.ObjectStore, tc.ref)
				require.Equal(t, want.held, got.held, "%s: the workspace bucket holds the snapshot", read)
				if want.err != nil {
					require.ErrorIs(t, got.err, want.err, read)
					for _, e := range tc.errIs {
						require.ErrorIs(t, got.err, e, read)
					}
					require.ErrorContains(t, got.err, tc.msg, read)
					continue
				}
				require.NoError(t, got.err, read)
				require.Equal(t, want, got, read)
			}
		})
	}
}

// testBucketsJS is testBuckets, with the JetStream context the buckets
// are in (to forge a record).
func testBucketsJS(t *testing.T) (context.Context, jetstream.JetStream, *workspace.SnapshotStore) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	nc := workertest.Connect(t, workertest.StartServer(t))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ws, _, err := workspace.EnsureBuckets(ctx, js, workspace.BucketConfig{})
	require.NoError(t, err)
	return ctx, js, ws
}
