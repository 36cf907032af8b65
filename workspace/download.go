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

// ErrSnapshotMissing and ErrDigestMismatch are wrapped by Download's errors
// for a request whose snapshot cannot be used; retrying cannot help.
var (
	ErrSnapshotMissing = errors.New("workspace snapshot not found")
	ErrDigestMismatch  = errors.New("workspace snapshot digest mismatch")
)

// Download writes the object ref names from obs to file path, refusing an
// object over max bytes before reading it (ErrTooLarge), and checks its
// bytes against ref.Digest (ErrDigestMismatch): the store's record of the
// object must name ref.Digest, checked before a byte is read and again on
// the record the read used, and nats.go checks the bytes against that
// record as it reaches their end, so the bytes are hashed once. A missing
// object is ErrSnapshotMissing; other errors are the store's, worth a retry.
// Given a *SnapshotStore with an uploads bucket, as EnsureBuckets returns,
// it is Fetch.
func Download(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef, path string, max int64) error {
	if s, ok := obs.(*SnapshotStore); ok && s.Uploads != nil {
		return Fetch(ctx, s, ref, path, max)
	}
	return bucketFor(obs).download(ctx, ref, path, max)
}

// Fetch is the worker's download of a snapshot: it writes the object ref
// names to file path, its bytes hashing to ref.Digest (see Download), from
// the workspace bucket of s or, when that does not hold those bytes
// (missing, or a broken object) and ref names the object by its digest
// (messages.WorkspaceObjectName, as submit does), from its uploads bucket,
// where any submitter may have written anything under that name; only
// there can the bytes that hash to the digest be the name's, so a request
// pairing another digest's name with its own digest never makes a worker
// replace that name's object. Bytes taken from
// the uploads bucket are then stored in the workspace bucket (a broken
// object there replaced), so the next run, on any worker, finds them
// checked; the upload stays until the bucket's TTL (a worker may still be
// reading it). Its errors are Download's: ErrSnapshotMissing when neither
// bucket has the object (the workspace bucket's answer when the uploads
// bucket has none), ErrDigestMismatch when the uploads bucket's bytes
// differ too, ErrTooLarge over max bytes; a failure to store is the
// store's, worth a retry. It is FetchLater with the store done before it
// returns.
func Fetch(ctx context.Context, s *SnapshotStore, ref messages.WorkspaceRef, path string, max int64) error {
	store, err := FetchLater(ctx, s, ref, path, max)
	if err != nil || store == nil {
		return err
	}
	return store(ctx, path)
}

// StoreChecked stores a snapshot file whose bytes a worker has checked
// against the digest its request names in the workspace bucket: FetchLater
// returns one for bytes it took from the uploads bucket. path is the
// file's path then (it may have been renamed since, its bytes unchanged).
// Its error is the store's, worth a retry; the snapshot stays in the
// uploads bucket meanwhile, where Fetch finds it.
type StoreChecked func(ctx context.Context, path string) error

// FetchLater is Fetch without its last step: when the bytes came from the
// uploads bucket and the workspace bucket does not hold them, it returns
// the store into the workspace bucket for the caller to run (a worker runs
// it beside the run, so a 100 MiB put is not in the path to the agent's
// start, and waits for it before the run's final state); else store is
// nil. Its errors are Fetch's. It is OpenStream read into the file, with
// two more steps: a workspace bucket's copy that turns out broken as it is
// read (its bytes are not its record's, or it went since) is replaced by
// the upload, as a broken record is; and when neither bucket held the
// snapshot, the workspace bucket is asked again (another worker may have
// stored it meanwhile, and the upload may have expired since).
func FetchLater(ctx context.Context, s *SnapshotStore, ref messages.WorkspaceRef, path string, max int64) (store StoreChecked, err error) {
	st, err := OpenStream(ctx, s, ref, max)
	if err == nil && !st.upload {
		if err = st.download(ctx, path); err == nil {
			return nil, nil
		}
		st, err = s.openUpload(ctx, ref, max, err)
	}
	if err == nil {
		if err = st.download(ctx, path); err == nil {
			return st.storeLater(), nil
		}
		if errors.Is(err, ErrSnapshotMissing) {
			// The upload went between its record and its read: the
			// uploads bucket has none after all.
			err = st.werr
		}
	}
	if errors.Is(err, ErrSnapshotMissing) && s.uploadsByDigest(ref) {
		// Neither bucket held it: another worker may have taken it
		// meanwhile.
		return nil, s.workspaces().download(ctx, ref, path, max)
	}
	return nil, err
}

// storeChecked returns the store of ref's checked bytes into the
// workspace bucket of s: unless replace (the bucket's object is broken),
// not again when another worker stored them meanwhile (only workers write
// the workspace bucket).
func storeChecked(s *SnapshotStore, ref messages.WorkspaceRef, replace bool) StoreChecked {
	return func(ctx context.Context, path string) error {
		if !replace {
			if info, err := s.ObjectStore.GetInfo(ctx, ref.Name); err == nil && !info.Deleted && info.Digest == objDigest(ref.Digest) {
				return nil
			}
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		meta := jetstream.ObjectMeta{Name: ref.Name, Description: "jetcrew workspace snapshot (tar), checked by a worker"}
		if _, err := s.ObjectStore.Put(ctx, meta, f); err != nil {
			return fmt.Errorf("store the checked snapshot in %s: %w", messages.BucketWorkspaces, err)
		}
		return nil
	}
}

// download is Download from b alone.
func (b bucket) download(ctx context.Context, ref messages.WorkspaceRef, path string, max int64) error {
	info, err := b.checkStored(ctx, ref, max)
	if err != nil {
		return err
	}
	return b.readFile(ctx, ref, info, path)
}

// readFile writes the object ref names, whose record was info, from b to
// file path (created, or truncated), its bytes checked as read checks
// them.
func (b bucket) readFile(ctx context.Context, ref messages.WorkspaceRef, info *jetstream.ObjectInfo, path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := b.read(ctx, ref, info, f); err != nil {
		return err
	}
	return f.Close()
}

// objectReadMax bounds a read of an object when the caller's context has
// no deadline (nats.go would otherwise give it its default request
// timeout, 5 s, whatever the object's size).
const objectReadMax = time.Hour

// read copies the object ref names, whose record was info, from b to w,
// and returns the bytes copied. The chunks info names must be in b's
// stream (chunksHeld). nats.go checks the bytes against the record the
// read uses as it reaches their end, and that record must name ref's
// digest and size (ErrDigestMismatch otherwise), so the bytes copied hash
// to ref's digest when it returns no error.
func (b bucket) read(ctx context.Context, ref messages.WorkspaceRef, info *jetstream.ObjectInfo, w io.Writer) (int64, error) {
	if err := b.chunksHeld(ctx, info); err != nil {
		return 0, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, objectReadMax)
		defer cancel()
	}
	// By the record's name: a link's target (resolve).
	r, err := b.obs.Get(ctx, info.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return 0, fmt.Errorf("%w: object %q in bucket %s (expired or never uploaded)", ErrSnapshotMissing, info.Name, b.bucketName(ctx))
	}
	if err != nil {
		return 0, fmt.Errorf("get snapshot: %w", err)
	}
	defer r.Close()
	n, err := io.Copy(w, io.LimitReader(r, int64(info.Size)+1))
	if errors.Is(err, jetstream.ErrDigestMismatch) {
		return n, fmt.Errorf("%w: object %q in %s: its bytes differ from its record's digest", ErrDigestMismatch, ref.Name, b.bucketName(ctx))
	}
	if err != nil {
		return n, fmt.Errorf("download snapshot: %w", err)
	}
	// The object may have been replaced between GetInfo and Get: the
	// record the read was checked against must name ref's digest.
	read, err := r.Info()
	if err != nil {
		return n, fmt.Errorf("download snapshot: %w", err)
	}
	if err := sameDigest(ref, read); err != nil {
		return n, err
	}
	if n != int64(read.Size) {
		return n, fmt.Errorf("%w: object %q gave %d bytes, its record says %d", ErrDigestMismatch, ref.Name, n, read.Size)
	}
	return n, nil
}

// CheckStored reads ref's object record (one Object Store info request)
// and returns it when the object is there, at most max bytes (0: no cap)
// and recorded with ref's digest. Its errors wrap ErrSnapshotMissing
// (deleted, expired or never uploaded), ErrTooLarge or ErrDigestMismatch;
// any other error is the store's. It reads the record's claim alone: a
// worker calls it before a download (which then checks the bytes), and
// before each use of a snapshot it has cached (whose bytes were checked
// when it was downloaded), so a snapshot deleted from the bucket is
// withdrawn at once. Given a *SnapshotStore it reads the workspace bucket
// and, when that does not hold the object and ref names it by its digest
// (messages.WorkspaceObjectName), the uploads bucket, where an upload's
// bytes are until a worker has stored them in the workspace bucket (which
// it does beside the run, once its agent started: a second run of the
// snapshot may come first).
func CheckStored(ctx context.Context, obs jetstream.ObjectStore, ref messages.WorkspaceRef, max int64) (*jetstream.ObjectInfo, error) {
	info, err := bucketFor(obs).checkStored(ctx, ref, max)
	if s, ok := obs.(*SnapshotStore); ok && s.Uploads != nil && errors.Is(err, ErrSnapshotMissing) && ref.Name == messages.WorkspaceObjectName(ref.Digest) {
		if uinfo, uerr := s.uploads().checkStored(ctx, ref, max); uerr == nil {
			return uinfo, nil
		}
	}
	return info, err
}

func (b bucket) checkStored(ctx context.Context, ref messages.WorkspaceRef, max int64) (*jetstream.ObjectInfo, error) {
	info, err := b.resolve(ctx, ref.Name)
	if err != nil {
		return nil, err
	}
	if max > 0 && info.Size > uint64(max) {
		return nil, fmt.Errorf("%w: snapshot %q is %d bytes, this worker takes at most %d", ErrTooLarge, ref.Name, info.Size, max)
	}
	if err := sameDigest(ref, info); err != nil {
		return nil, err
	}
	return info, nil
}

// resolve returns the record of the object name names in b, following a
// link to an object of the same bucket (a streamed upload's: the
// submitter links the digest's name to the object it streamed, see
// Submit); its bytes are then read by the record's name (read). A missing
// object, or a link to a missing one, is ErrSnapshotMissing; a link to a
// link or to another bucket is ErrDigestMismatch (no snapshot is stored
// that way).
func (b bucket) resolve(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	info, err := b.obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: object %q in bucket %s (expired or never uploaded)", ErrSnapshotMissing, name, b.bucketName(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot info: %w", err)
	}
	if info.Opts == nil || info.Opts.Link == nil {
		return info, nil
	}
	link := info.Opts.Link
	if link.Name == "" || link.Bucket != info.Bucket {
		return nil, fmt.Errorf("%w: object %q in %s is a link out of its bucket", ErrDigestMismatch, name, info.Bucket)
	}
	target, err := b.obs.GetInfo(ctx, link.Name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: object %q in bucket %s, which %q links to (expired or never uploaded)", ErrSnapshotMissing, link.Name, info.Bucket, name)
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshot info: %w", err)
	}
	if target.Opts != nil && target.Opts.Link != nil {
		return nil, fmt.Errorf("%w: object %q in %s links to a link", ErrDigestMismatch, name, info.Bucket)
	}
	return target, nil
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
