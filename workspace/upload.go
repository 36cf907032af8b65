package workspace

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Uploaded says what Upload did.
type Uploaded struct {
	// Ref is the request field naming the snapshot.
	Ref messages.WorkspaceRef
	// Info describes the snapshot.
	Info Info
	// Reused is true when a bucket already held the snapshot's bytes, so
	// nothing was uploaded.
	Reused bool
	// Bucket names the bucket holding the snapshot after Submit: the
	// workspace bucket (a worker checked it there before), or the uploads
	// bucket (uploaded or found there, for a worker to check). Empty after
	// Upload to a bucket alone.
	Bucket string
	// SnapshotTook is the time spent snapshotting; UploadTook the time
	// spent uploading, or reading the stored bytes back when Reused.
	SnapshotTook, UploadTook time.Duration
	// Stages cuts SnapshotTook into the snapshot's parts.
	Stages Stages
}

// Upload snapshots dir (see Snapshot) into a temporary file and stores it
// in obs under WorkspaceObjectName of its digest, unless obs already holds
// that object with those bytes (StoreSnapshot). Given a *SnapshotStore
// with an uploads bucket, as EnsureBuckets returns, it is Submit. A
// snapshot over o.MaxBytes is refused (ErrTooLarge) before anything is
// stored.
func Upload(ctx context.Context, obs jetstream.ObjectStore, dir string, o SnapshotOptions) (Uploaded, error) {
	if s, ok := obs.(*SnapshotStore); ok && s.Uploads != nil {
		return Submit(ctx, s, dir, o)
	}
	return upload(dir, o, func(f io.ReadSeeker, info Info) (Uploaded, error) {
		return storeSnapshot(ctx, bucketFor(obs), f, info)
	})
}

// Submit is the submitter's upload: it snapshots dir (see Snapshot) into
// a temporary file and, unless the workspace bucket of s already holds
// the snapshot's bytes (see Stored), stores it in the uploads bucket
// unless that holds them: an object of that name there whose bytes differ
// (a broken or forged one) is replaced, so uploading again repairs it. A
// worker takes it from there once it has checked its bytes (Fetch). A
// snapshot over o.MaxBytes is refused (ErrTooLarge) before anything is
// stored.
func Submit(ctx context.Context, s *SnapshotStore, dir string, o SnapshotOptions) (Uploaded, error) {
	return upload(dir, o, func(f io.ReadSeeker, info Info) (Uploaded, error) {
		start := time.Now()
		if s.workspaces().present(ctx, snapshotRef(info), info.Size) {
			return Uploaded{Info: info, Ref: snapshotRef(info), Reused: true, Bucket: messages.BucketWorkspaces, UploadTook: time.Since(start)}, nil
		}
		up, err := storeSnapshot(ctx, s.uploads(), f, info)
		up.Bucket, up.UploadTook = messages.BucketUploads, time.Since(start)
		return up, err
	})
}

// upload snapshots dir into a temporary file and hands it to store.
func upload(dir string, o SnapshotOptions, store func(io.ReadSeeker, Info) (Uploaded, error)) (Uploaded, error) {
	f, err := os.CreateTemp("", "jetcrew-snapshot-*.tar")
	if err != nil {
		return Uploaded{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	var took Stages
	info, err := snapshot(dir, f, o, &took)
	if err != nil {
		return Uploaded{}, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	snapTook := time.Since(start)
	up, err := store(f, info)
	up.SnapshotTook, up.Stages = snapTook, took
	return up, err
}

// snapshotRef is the request field naming the snapshot info describes.
func snapshotRef(info Info) messages.WorkspaceRef {
	return messages.WorkspaceRef{Name: messages.WorkspaceObjectName(info.Digest), Digest: info.Digest}
}

// StoreSnapshot stores the snapshot f, described by info (its digest), in
// obs under WorkspaceObjectName of its digest, reading it from its start,
// unless obs already holds that object with those bytes (Reused; see
// Stored): an object of that name whose bytes differ is replaced. Given a
// *SnapshotStore it stores in the workspace bucket (a worker's snapshot of
// a git source). SnapshotTook is left zero.
func StoreSnapshot(ctx context.Context, obs jetstream.ObjectStore, f io.ReadSeeker, info Info) (Uploaded, error) {
	return storeSnapshot(ctx, bucketFor(obs), f, info)
}

func storeSnapshot(ctx context.Context, b bucket, f io.ReadSeeker, info Info) (Uploaded, error) {
	up := Uploaded{Info: info, Ref: snapshotRef(info)}
	start := time.Now()
	if b.present(ctx, up.Ref, info.Size) {
		up.Reused = true
		up.UploadTook = time.Since(start)
		return up, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Uploaded{}, err
	}
	meta := jetstream.ObjectMeta{Name: up.Ref.Name, Description: "jetcrew workspace snapshot (tar)"}
	if _, err := b.obs.Put(ctx, meta, f); err != nil {
		return Uploaded{}, fmt.Errorf("upload snapshot to %s: %w", b.bucketName(ctx), err)
	}
	up.UploadTook = time.Since(start)
	return up, nil
}

// Stored reports whether obs holds the object ref names with bytes whose
// SHA-256 is ref's digest: its record must name that digest, and the bytes
// are then read and hashed (a download, nothing written). An object whose
// record names the digest over other bytes, or over chunks the bucket
// does not hold (a forged one), is not stored. Any error reading it counts
// as not. Given a *SnapshotStore it reads the workspace bucket.
func Stored(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef) bool {
	return bucketFor(obs).present(ctx, ref, -1)
}

// present is Stored, the record saying size bytes too (size < 0: any).
func (b bucket) present(ctx context.Context, ref messages.WorkspaceRef, size int64) bool {
	info, err := b.obs.GetInfo(ctx, ref.Name)
	if err != nil || info.Deleted || info.Digest != objDigest(ref.Digest) || size >= 0 && info.Size != uint64(size) {
		return false
	}
	n, err := b.read(ctx, ref, info, io.Discard)
	return err == nil && n == int64(info.Size)
}
