package workspace

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strings"

	"context"
	"fmt"
	"github.com/nats-io/nuid"
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
	// Streamed is true when the snapshot was uploaded while it was taken
	// (Submit's streamed upload).
	Streamed bool
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
//
// With a cache directory (SnapshotOptions.CacheDir), a snapshot of a
// directory whose last snapshot Submit stored is no longer stored (or
// never was) is streamed instead (submitStreamed): the upload runs while
// the snapshot is taken, so a first submit of a tree does not wait for
// the whole snapshot before its first byte goes out. A directory whose
// last snapshot is still stored is snapshotted first, so an unchanged
// tree is not sent again.
func Submit(ctx context.Context, s *SnapshotStore, dir string, o SnapshotOptions) (Uploaded, error) {
	last := lastSnapshot{cacheDir: o.CacheDir, dir: dir}
	if o.CacheDir != "" && s.Uploads != nil && !last.stored(ctx, s) {
		up, err := submitStreamed(ctx, s, dir, o)
		if err == nil {
			last.record(up.Info.Digest)
		}
		return up, err
	}
	up, err := submitWhole(ctx, s, dir, o)
	if err == nil {
		last.record(up.Info.Digest)
	}
	return up, err
}

// submitWhole is Submit from a whole snapshot file.
func submitWhole(ctx context.Context, s *SnapshotStore, dir string, o SnapshotOptions) (Uploaded, error) {
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
	info, err := b.resolve(ctx, ref.Name)
	if err != nil || info.Deleted || info.Digest != objDigest(ref.Digest) || size >= 0 && info.Size != uint64(size) {
		return false
	}
	n, err := b.read(ctx, ref, info, io.Discard)
	return err == nil && n == int64(info.Size)
}

// streamedPrefix starts the name of a streamed upload's object in the
// uploads bucket ("upload-<NUID>.tar"); the digest's name
// (WorkspaceObjectName) is a link to it.
const streamedPrefix = "upload-"

// submitStreamed snapshots dir (see Snapshot) into an object of the
// uploads bucket named streamedPrefix + a NUID as it is taken (nothing is
// written to a temporary file, and the digest is the put's: nats.go hashes
// the bytes it sends, so they are hashed once), then links the digest's
// name (WorkspaceObjectName) to it there (an Object Store link, which a
// worker follows within the bucket and checks the bytes of against the
// digest, as any upload's). When an object that is not a link already
// holds the digest's name, it counts as stored when its bytes are the
// snapshot's (read back) and is replaced by the streamed object's bytes
// otherwise, as Submit does. Nothing is looked up before: a tree already
// stored is sent again (the worker keeps one copy in the workspace
// bucket). A snapshot over o.MaxBytes fails (ErrTooLarge) with part of it
// sent, never linked. Uploaded.Streamed says so; SnapshotTook is the
// snapshot and the put together, UploadTook the link after them.
func submitStreamed(ctx context.Context, s *SnapshotStore, dir string, o SnapshotOptions) (Uploaded, error) {
	name := streamedPrefix + nuid.Next() + ".tar"
	pr, pw := io.Pipe()
	type snapped struct {
		info Info
		took Stages
		err  error
	}
	done := make(chan snapped, 1)
	start := time.Now()
	go func() {
		var r snapped
		// Whole chunks through the pipe: the put publishes one chunk per
		// read, and the tar writes headers of 512 bytes.
		bw := bufio.NewWriterSize(pw, streamChunk)
		o.noDigest = true
		r.info, r.err = snapshot(dir, bw, o, &r.took)
		if r.err == nil {
			r.err = bw.Flush()
		}
		pw.CloseWithError(r.err)
		done <- r
	}()
	meta := jetstream.ObjectMeta{Name: name, Description: "jetcrew workspace snapshot (tar), streamed; linked from its digest's name",
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: streamChunk}}
	obj, perr := s.Uploads.Put(ctx, meta, fullReads{pr})
	pr.CloseWithError(perr) // a failed put stops the snapshot too
	r := <-done
	if r.err != nil {
		return Uploaded{}, fmt.Errorf("snapshot %s: %w", dir, r.err)
	}
	if perr != nil {
		return Uploaded{}, fmt.Errorf("upload snapshot to %s: %w", messages.BucketUploads, perr)
	}
	sum, err := jetstream.DecodeObjectDigest(obj.Digest)
	if err != nil || len(sum) != sha256.Size || int64(obj.Size) != r.info.Size {
		return Uploaded{}, fmt.Errorf("upload snapshot to %s: the store recorded %q, %d bytes, for a snapshot of %d bytes", messages.BucketUploads, obj.Digest, obj.Size, r.info.Size)
	}
	r.info.Digest = "sha256:" + hex.EncodeToString(sum)
	up := Uploaded{Info: r.info, Ref: snapshotRef(r.info), Bucket: messages.BucketUploads, Streamed: true,
		SnapshotTook: time.Since(start), Stages: r.took}
	linked := time.Now()
	_, err = s.Uploads.AddLink(ctx, up.Ref.Name, obj)
	if errors.Is(err, jetstream.ErrObjectAlreadyExists) {
		// An object holds the digest's name (an upload of the same tree,
		// or a broken one): kept when its bytes are these, else replaced
		// by the streamed object's.
		up.Reused, err = s.uploads().present(ctx, up.Ref, r.info.Size), nil
		if !up.Reused {
			err = replaceFrom(ctx, s.Uploads, name, up.Ref.Name)
		}
	}
	if err != nil {
		return Uploaded{}, fmt.Errorf("link snapshot in %s: %w", messages.BucketUploads, err)
	}
	up.UploadTook = time.Since(linked)
	return up, nil
}

// replaceFrom puts the bytes of object from of obs under name too.
func replaceFrom(ctx context.Context, obs jetstream.ObjectStore, from, name string) error {
	rd, err := obs.Get(ctx, from)
	if err != nil {
		return err
	}
	defer rd.Close()
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: name, Description: "jetcrew workspace snapshot (tar)"}, rd)
	return err
}

// streamChunk is the chunk size of a streamed upload, in bytes: the Object
// Store's default (128 KiB).
const streamChunk = 128 << 10

// fullReads fills every read of r's caller's buffer, but at the end: an
// Object Store put publishes one chunk per read.
type fullReads struct{ r io.Reader }

func (f fullReads) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if err == io.ErrUnexpectedEOF {
		err = nil // the last chunk; the next read says io.EOF
	}
	return n, err
}

// lastSnapshot is the record, in a snapshot cache directory, of the digest
// of the last snapshot of one directory that Submit stored.
type lastSnapshot struct{ cacheDir, dir string }

// path returns the record's file: cacheDir/last/<SHA-256 of dir's
// absolute path, 32 hex digits>.
func (l lastSnapshot) path() string {
	abs, err := filepath.Abs(l.dir)
	if err != nil {
		abs = l.dir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(l.cacheDir, "last", hex.EncodeToString(sum[:16]))
}

// stored reports whether the recorded digest's object is still in the
// workspace or the uploads bucket of s, by their records alone (Submit
// then reads its bytes back when the snapshot has that digest).
func (l lastSnapshot) stored(ctx context.Context, s *SnapshotStore) bool {
	b, err := os.ReadFile(l.path())
	if err != nil {
		return false
	}
	ref := snapshotRef(Info{Digest: strings.TrimSpace(string(b))})
	for _, bk := range []bucket{s.workspaces(), s.uploads()} {
		if bk.obs == nil {
			continue
		}
		if info, err := bk.resolve(ctx, ref.Name); err == nil && info.Digest == objDigest(ref.Digest) {
			return true
		}
	}
	return false
}

// record writes digest as the directory's last snapshot; a failure only
// loses the hint.
func (l lastSnapshot) record(digest string) {
	if l.cacheDir == "" {
		return // no cache directory: nothing is recorded (never the working directory)
	}
	p := l.path()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return
	}
	tmp := p + ".tmp"
	if os.WriteFile(tmp, []byte(digest+"\n"), 0o600) == nil {
		_ = os.Rename(tmp, p)
	}
}
