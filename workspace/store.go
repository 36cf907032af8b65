package workspace

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// Bucket defaults (docs/workspaces.md).
const (
	// DefaultWorkspaceTTL is how long a workspace snapshot is kept.
	DefaultWorkspaceTTL = 7 * 24 * time.Hour
	// DefaultResultTTL is how long a run's result objects are kept.
	DefaultResultTTL = 7 * 24 * time.Hour
	// DefaultMaxSnapshotBytes bounds one snapshot (submit's and the
	// worker's default), in bytes.
	DefaultMaxSnapshotBytes = 1 << 30
)

// BucketConfig sizes the workspace and result buckets.
type BucketConfig struct {
	// WorkspaceTTL and ResultTTL are the buckets' object lifetimes (the
	// streams' MaxAge); 0 means the defaults above.
	WorkspaceTTL, ResultTTL time.Duration
	// WorkspaceBytes and ResultBytes cap each bucket's total size in
	// bytes; 0 means no cap.
	WorkspaceBytes, ResultBytes int64
	// Replicas is the buckets' replica count; 0 means 1.
	Replicas int
}

// EnsureBuckets returns the workspace and result buckets, creating each
// with cfg when it does not exist (an existing bucket is used as it is).
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (ws, res jetstream.ObjectStore, err error) {
	if cfg.WorkspaceTTL == 0 {
		cfg.WorkspaceTTL = DefaultWorkspaceTTL
	}
	if cfg.ResultTTL == 0 {
		cfg.ResultTTL = DefaultResultTTL
	}
	ws, err = ensureBucket(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: messages.BucketWorkspaces, Description: "jetcrew workspace snapshots, named by digest",
		TTL: cfg.WorkspaceTTL, MaxBytes: capOrNone(cfg.WorkspaceBytes), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, nil, err
	}
	res, err = ensureBucket(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: messages.BucketResults, Description: "jetcrew run results: patch, bundle, artifacts",
		TTL: cfg.ResultTTL, MaxBytes: capOrNone(cfg.ResultBytes), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
	})
	return ws, res, err
}

func capOrNone(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, cfg.Bucket)
	if err == nil {
		return obs, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("object store %s: %w", cfg.Bucket, err)
	}
	obs, err = js.CreateObjectStore(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.ObjectStore(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("create object store %s: %w", cfg.Bucket, err)
	}
	return obs, nil
}

// Uploaded says what Upload did.
type Uploaded struct {
	// Ref is the request field naming the snapshot.
	Ref messages.WorkspaceRef
	// Info describes the snapshot.
	Info Info
	// Reused is true when the bucket already held the snapshot, so
	// nothing was uploaded.
	Reused bool
	// SnapshotTook and UploadTook are the times spent snapshotting and
	// uploading (zero when Reused).
	SnapshotTook, UploadTook time.Duration
	// Stages cuts SnapshotTook into the snapshot's parts.
	Stages Stages
}

// Upload snapshots dir (see Snapshot) into a temporary file and stores it
// in obs under WorkspaceObjectName of its digest, unless obs already holds
// that object with that digest. A snapshot over o.MaxBytes is refused
// (ErrTooLarge) before anything is stored.
func Upload(ctx context.Context, obs jetstream.ObjectStore, dir string, o SnapshotOptions) (Uploaded, error) {
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
	up, err := StoreSnapshot(ctx, obs, f, info)
	up.SnapshotTook, up.Stages = snapTook, took
	return up, err
}

// StoreSnapshot stores the snapshot f, described by info (its digest), in
// obs under WorkspaceObjectName of its digest, reading it from its start,
// unless obs already holds that object with that digest (Reused).
// SnapshotTook is left zero.
func StoreSnapshot(ctx context.Context, obs jetstream.ObjectStore, f io.ReadSeeker, info Info) (Uploaded, error) {
	up := Uploaded{Info: info, Ref: messages.WorkspaceRef{Name: messages.WorkspaceObjectName(info.Digest), Digest: info.Digest}}
	start := time.Now()
	if Stored(ctx, obs, up.Ref) {
		up.Reused = true
		return up, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Uploaded{}, err
	}
	meta := jetstream.ObjectMeta{Name: up.Ref.Name, Description: "jetcrew workspace snapshot (tar)"}
	if _, err := obs.Put(ctx, meta, f); err != nil {
		return Uploaded{}, fmt.Errorf("upload snapshot: %w", err)
	}
	up.UploadTook = time.Since(start)
	return up, nil
}

// Stored reports whether obs holds the object ref names with ref's digest
// (the Object Store's own SHA-256). Any error reading it counts as not.
func Stored(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef) bool {
	cur, err := obs.GetInfo(ctx, ref.Name)
	return err == nil && !cur.Deleted && cur.Digest == objDigest(ref.Digest)
}

// objDigest returns the Object Store's form of a "sha256:<hex>" digest
// ("SHA-256=<base64url>"), or "" for anything else.
func objDigest(d string) string {
	x, ok := strings.CutPrefix(d, "sha256:")
	b, err := hex.DecodeString(x)
	if !ok || err != nil || len(b) != sha256.Size {
		return ""
	}
	return "SHA-256=" + base64.URLEncoding.EncodeToString(b)
}

// ErrSnapshotMissing and ErrDigestMismatch are wrapped by Download's errors
// for a request whose snapshot cannot be used; retrying cannot help.
var (
	ErrSnapshotMissing = errors.New("workspace snapshot not found")
	ErrDigestMismatch  = errors.New("workspace snapshot digest mismatch")
)

// Download writes the object ref names from obs to file path, refusing an
// object over max bytes before reading it (ErrTooLarge), and checks its
// SHA-256 against ref.Digest (ErrDigestMismatch): the store's record of the
// object must name ref.Digest, checked before a byte is read and again on
// the record the read used, and nats.go checks the bytes against that
// record as it reaches their end, so the bytes are hashed once. A missing
// object is ErrSnapshotMissing; other errors are the store's, worth a retry.
func Download(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef, path string, max int64) error {
	info, err := CheckStored(ctx, obs, ref, max)
	if err != nil {
		return err
	}
	r, err := obs.Get(ctx, ref.Name)
	if err != nil {
		return fmt.Errorf("get snapshot: %w", err)
	}
	defer r.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	// Read to the end: nats.go compares the bytes' SHA-256 with the record
	// there.
	n, err := io.Copy(f, io.LimitReader(r, int64(info.Size)+1))
	if errors.Is(err, jetstream.ErrDigestMismatch) {
		return fmt.Errorf("%w: the store's own digest check failed", ErrDigestMismatch)
	}
	if err != nil {
		return fmt.Errorf("download snapshot: %w", err)
	}
	// The object may have been replaced between GetInfo and Get: the
	// record the read was checked against must name ref.Digest too.
	read, err := r.Info()
	if err != nil {
		return fmt.Errorf("download snapshot: %w", err)
	}
	if err := sameDigest(ref, read); err != nil {
		return err
	}
	if n != int64(read.Size) {
		return fmt.Errorf("%w: object %q gave %d bytes, its record says %d", ErrDigestMismatch, ref.Name, n, read.Size)
	}
	return f.Close()
}

// CheckStored reads ref's object record (one Object Store info request)
// and returns it when the object is there, at most max bytes (0: no cap)
// and recorded with ref's digest. Its errors wrap ErrSnapshotMissing
// (deleted, expired or never uploaded), ErrTooLarge or ErrDigestMismatch;
// any other error is the store's. A worker calls it before a download, and
// before each use of a snapshot it has cached, so a snapshot deleted from
// the bucket is withdrawn at once.
func CheckStored(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef, max int64) (*jetstream.ObjectInfo, error) {
	info, err := obs.GetInfo(ctx, ref.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: object %q in bucket %s (expired or never uploaded)", ErrSnapshotMissing, ref.Name, ref.BucketOrDefault())
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot info: %w", err)
	}
	if max > 0 && info.Size > uint64(max) {
		return nil, fmt.Errorf("%w: snapshot %q is %d bytes, this worker takes at most %d", ErrTooLarge, ref.Name, info.Size, max)
	}
	if err := sameDigest(ref, info); err != nil {
		return nil, err
	}
	return info, nil
}

// sameDigest returns an error wrapping ErrDigestMismatch unless the store's
// record info names the digest ref names.
func sameDigest(ref messages.WorkspaceRef, info *jetstream.ObjectInfo) error {
	want := objDigest(ref.Digest)
	if want != "" && info.Digest == want {
		return nil
	}
	got := info.Digest
	if b, err := jetstream.DecodeObjectDigest(info.Digest); err == nil {
		got = "sha256:" + hex.EncodeToString(b)
	}
	return fmt.Errorf("%w: object %q has %s, the request names %s", ErrDigestMismatch, ref.Name, got, ref.Digest)
}
