package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrStreamBroken is wrapped by the error of a Stream whose bytes, already
// partly written, turned out not to be the snapshot's (the bucket's object
// broken): the caller must drop what it wrote and may fetch again with
// Fetch, which takes the uploads bucket's copy instead.
var ErrStreamBroken = errors.New("the snapshot's bytes broke off while streamed")

// A Stream is a snapshot found by OpenStream, ready to be read.
type Stream struct {
	s    *SnapshotStore
	ref  messages.WorkspaceRef
	b    bucket
	info *jetstream.ObjectInfo
	// upload is set for a snapshot read from the uploads bucket, werr
	// then the workspace bucket's error that sent the lookup there.
	upload bool
	werr   error
}

// Size returns the snapshot's length in bytes.
func (st *Stream) Size() int64 { return int64(st.info.Size) }

// OpenStream looks ref's snapshot up as Fetch would read it (the workspace
// bucket of s; else, for a name that is the digest's, its uploads bucket)
// from the buckets' records alone, without reading a byte, so that a
// missing, oversized or misrecorded snapshot is refused at once with
// Fetch's errors; ReadTo then reads it in one pass.
func OpenStream(ctx context.Context, s *SnapshotStore, ref messages.WorkspaceRef, max int64) (*Stream, error) {
	ws := s.workspaces()
	info, werr := ws.checkStored(ctx, ref, max)
	if werr == nil {
		return &Stream{s: s, ref: ref, b: ws, info: info}, nil
	}
	return s.openUpload(ctx, ref, max, werr)
}

// uploadsByDigest reports whether Fetch may take ref's snapshot from the
// uploads bucket of s: there is one, and ref names the object by its
// digest (messages.WorkspaceObjectName).
func (s *SnapshotStore) uploadsByDigest(ref messages.WorkspaceRef) bool {
	return s.Uploads != nil && ref.Name == messages.WorkspaceObjectName(ref.Digest)
}

// openUpload looks ref's snapshot up in the uploads bucket of s, from its
// record alone, once the workspace bucket failed with werr: only for a
// snapshot missing there or recorded (or read) with other bytes, and only
// under the digest's name (uploadsByDigest). It returns werr when the
// uploads bucket has none (or it is not looked for), saying so when an
// upload of the name is there but not the digest's name; a Stream whose
// store replaces the workspace bucket's object unless that was missing.
func (s *SnapshotStore) openUpload(ctx context.Context, ref messages.WorkspaceRef, max int64, werr error) (*Stream, error) {
	missing := errors.Is(werr, ErrSnapshotMissing)
	if s.Uploads == nil || !missing && !errors.Is(werr, ErrDigestMismatch) {
		return nil, werr
	}
	up := s.uploads()
	if !s.uploadsByDigest(ref) {
		if missing {
			// Say what the uploads bucket holds under that name.
			if _, err := up.checkStored(ctx, ref, max); err == nil {
				return nil, fmt.Errorf("%w (an upload of that name is taken only when named by its digest, %s)", werr, messages.WorkspaceObjectName(ref.Digest))
			} else if !errors.Is(err, ErrSnapshotMissing) {
				return nil, err
			}
		}
		return nil, werr
	}
	info, uerr := up.checkStored(ctx, ref, max)
	if errors.Is(uerr, ErrSnapshotMissing) {
		return nil, werr
	}
	if uerr != nil {
		return nil, uerr
	}
	return &Stream{s: s, ref: ref, b: up, info: info, upload: true, werr: werr}, nil
}

// ReadTo copies the snapshot to w, its bytes checked as Download checks
// them (once they are all read: w sees them before), and returns the store
// still to do into the workspace bucket when they came from the uploads
// bucket (see FetchLater), else nil. Its errors are Download's; bytes that
// differ from the object's record, or a read that breaks off, wrap
// ErrStreamBroken too once anything was written to w.
func (st *Stream) ReadTo(ctx context.Context, w io.Writer) (StoreChecked, error) {
	n, err := st.b.read(ctx, st.ref, st.info, w)
	if err != nil {
		if n > 0 {
			return nil, fmt.Errorf("%w: %w", ErrStreamBroken, err)
		}
		return nil, err
	}
	return st.storeLater(), nil
}

// download writes the snapshot to file path, its bytes checked as ReadTo
// checks them; its errors are Download's.
func (st *Stream) download(ctx context.Context, path string) error {
	return st.b.readFile(ctx, st.ref, st.info, path)
}

// storeLater returns the store still to do into the workspace bucket of
// bytes read from the uploads bucket (storeChecked), else nil.
func (st *Stream) storeLater() StoreChecked {
	if !st.upload {
		return nil
	}
	return storeChecked(st.s, st.ref, !errors.Is(st.werr, ErrSnapshotMissing))
}
