package workspace

import (
	"context"
	"errors"
	"fmt"
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

// BucketConfig sizes the workspace, uploads and result buckets.
type BucketConfig struct {
	// WorkspaceTTL and ResultTTL are the buckets' object lifetimes (the
	// streams' MaxAge); 0 means the defaults above. WorkspaceTTL is the
	// uploads bucket's too.
	WorkspaceTTL, ResultTTL time.Duration
	// WorkspaceBytes and ResultBytes cap each bucket's total size in
	// bytes; 0 means no cap. WorkspaceBytes caps the uploads bucket too.
	WorkspaceBytes, ResultBytes int64
	// Replicas is the buckets' replica count; 0 means 1.
	Replicas int
}

// SnapshotStore is where snapshots are: the workspace bucket
// (messages.BucketWorkspaces), whose methods it has as a
// jetstream.ObjectStore, which only workers write, and the uploads bucket
// (messages.BucketUploads), which submitters write. Given one, Upload
// takes the submitter's path (Submit) and Download the worker's (Fetch);
// Stored and StoreSnapshot use the workspace bucket alone.
type SnapshotStore struct {
	// ObjectStore is the workspace bucket.
	jetstream.ObjectStore
	// Uploads is the uploads bucket; nil means none (the workspace bucket
	// alone is used).
	Uploads jetstream.ObjectStore
	// js, when set (EnsureBuckets), counts an object's chunks in its
	// bucket's stream before they are read: a record naming chunks the
	// bucket lacks (a forged one) is refused at once, where nats.go would
	// wait for them until its deadline.
	js jetstream.JetStream
}

// workspaces and uploads return s's buckets.
func (s *SnapshotStore) workspaces() bucket {
	return bucket{obs: s.ObjectStore, name: messages.BucketWorkspaces, js: s.js}
}

func (s *SnapshotStore) uploads() bucket {
	return bucket{obs: s.Uploads, name: messages.BucketUploads, js: s.js}
}

// bucket is one Object Store bucket and what counting its objects' chunks
// takes.
type bucket struct {
	obs jetstream.ObjectStore
	// name is the bucket's name; "" when unknown (asked for an error
	// message).
	name string
	// js counts chunks; nil: they are not counted.
	js jetstream.JetStream
}

// bucketFor returns obs as a bucket: a *SnapshotStore's workspace bucket,
// or obs alone.
func bucketFor(obs jetstream.ObjectStore) bucket {
	if s, ok := obs.(*SnapshotStore); ok {
		return s.workspaces()
	}
	return bucket{obs: obs}
}

// bucketName names b's bucket, for an error message (one status request
// when unknown; "its bucket" when that fails).
func (b bucket) bucketName(ctx context.Context) string {
	if b.name != "" {
		return b.name
	}
	st, err := b.obs.Status(ctx)
	if err != nil {
		return "its bucket"
	}
	return st.Bucket()
}

// chunksHeld checks, when b counts chunks, that b's stream holds exactly
// the chunks info names: fewer (never written, or purged) or more (added
// to by another writer) is a broken object (ErrDigestMismatch).
func (b bucket) chunksHeld(ctx context.Context, info *jetstream.ObjectInfo) error {
	if b.js == nil || info.Size == 0 {
		return nil
	}
	name := b.name
	if name == "" {
		name = info.Bucket
	}
	stream, err := b.js.Stream(ctx, "OBJ_"+name)
	if err != nil {
		return fmt.Errorf("read snapshot's bucket: %w", err)
	}
	subj := "$O." + name + ".C." + info.NUID
	si, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return fmt.Errorf("read snapshot's bucket: %w", err)
	}
	if got := si.State.Subjects[subj]; got != uint64(info.Chunks) {
		return fmt.Errorf("%w: object %q in %s: its record names %d chunks, the bucket holds %d", ErrDigestMismatch, info.Name, name, info.Chunks, got)
	}
	return nil
}

// EnsureBuckets returns the workspace bucket, with the uploads bucket, and
// the result bucket, creating each with cfg when it does not exist (an
// existing bucket is used as it is).
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, cfg BucketConfig) (ws *SnapshotStore, res jetstream.ObjectStore, err error) {
	if cfg.WorkspaceTTL == 0 {
		cfg.WorkspaceTTL = DefaultWorkspaceTTL
	}
	if cfg.ResultTTL == 0 {
		cfg.ResultTTL = DefaultResultTTL
	}
	ws = &SnapshotStore{js: js}
	ws.ObjectStore, err = ensureBucket(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: messages.BucketWorkspaces, Description: "jetcrew workspace snapshots, named by digest, written by workers",
		TTL: cfg.WorkspaceTTL, MaxBytes: capOrNone(cfg.WorkspaceBytes), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, nil, err
	}
	ws.Uploads, err = ensureBucket(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: messages.BucketUploads, Description: "jetcrew workspace snapshots as submitters uploaded them, named by digest, unchecked",
		TTL: cfg.WorkspaceTTL, MaxBytes: capOrNone(cfg.WorkspaceBytes), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, nil, err
	}
	res, err = ensureBucket(ctx, js, jetstream.ObjectStoreConfig{
		Bucket: messages.BucketResults, Description: "jetcrew run results: patch, bundle, artifacts",
		TTL: cfg.ResultTTL, MaxBytes: capOrNone(cfg.ResultBytes), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
	})
	if err != nil {
		return nil, nil, err
	}
	return ws, res, nil
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
