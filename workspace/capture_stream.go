package workspace

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/jetcrew/jetcrew/messages"
)

// Names of a capture stream's entries.
const (
	captureRecord = "result.json"
	maxRecord     = 4 << 20
)

// WriteCaptureStream writes c as a capture stream: a tar whose first entry
// is "result.json" (c.Result as JSON, without Objects), followed by one
// regular file per result object c holds, named by its kind
// (messages.ResultPatch, ResultBundle, ResultArtifacts), in that order.
func WriteCaptureStream(w io.Writer, c *Captured) error {
	rec := c.Result
	rec.Objects = nil
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{{captureRecord, b}, {messages.ResultPatch, c.Patch}, {messages.ResultBundle, c.Bundle}, {messages.ResultArtifacts, c.Artifacts}, {messages.ResultSession, c.Session}} {
		if e.data == nil {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(e.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// ErrBadCaptureStream is wrapped by ReadCaptureStream's errors for a stream
// that breaks its format or its caps.
var ErrBadCaptureStream = errors.New("not a valid capture stream")

// CaptureObject is one object of a capture stream as ReadCaptureStream
// found it: where its bytes are in the stream (read them with Data, no
// copy held in memory), their length and their SHA-256, computed while the
// stream was read.
type CaptureObject struct {
	// Kind is messages.ResultPatch, ResultBundle or ResultArtifacts.
	Kind string
	// Data reads the object's bytes from the stream's source.
	Data *io.SectionReader
	// Size is its length in bytes.
	Size int64
	// SHA256 is the hex SHA-256 of its bytes.
	SHA256 string
}

// Bytes reads the whole object into memory.
func (o CaptureObject) Bytes() ([]byte, error) {
	b := make([]byte, o.Size)
	_, err := o.Data.ReadAt(b, 0)
	return b, err
}

// CaptureStream is a capture stream read by ReadCaptureStream: its record
// and its objects, in the stream's order.
type CaptureStream struct {
	Result  messages.WorkspaceResult
	Objects []CaptureObject
}

// Object returns the object of kind and whether the stream has one.
func (c *CaptureStream) Object(kind string) (CaptureObject, bool) {
	for _, o := range c.Objects {
		if o.Kind == kind {
			return o, true
		}
	}
	return CaptureObject{}, false
}

// countingReader counts the bytes read through it. It has only Read, so
// archive/tar reads (and never seeks) it: after tar.Reader.Next, n is the
// offset of the entry's data.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ReadCaptureStream reads a capture stream, the size bytes of src, an
// untrusted source: the record first (at most 4 MiB, decoded with
// messages.DecodeStrictJSON, no Objects), then each object at most once, a
// regular file of at most maxObject bytes (0: no bound) and of a known
// kind, in any order. Only the record is held in memory: each object is
// hashed as it is read and returned as a section of src. Its errors wrap
// ErrBadCaptureStream.
func ReadCaptureStream(src io.ReaderAt, size, maxObject int64) (*CaptureStream, error) {
	cr := &countingReader{r: io.NewSectionReader(src, 0, size)}
	tr := tar.NewReader(cr)
	c := &CaptureStream{}
	seen := map[string]bool{}
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			if !seen[captureRecord] {
				return nil, fmt.Errorf("%w: no %s", ErrBadCaptureStream, captureRecord)
			}
			return c, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadCaptureStream, err)
		}
		if err := checkCaptureEntry(hdr, i, seen, maxObject); err != nil {
			return nil, err
		}
		seen[hdr.Name] = true
		if hdr.Name == captureRecord {
			if err := readCaptureRecord(tr, hdr.Size, &c.Result); err != nil {
				return nil, err
			}
			continue
		}
		h := sha256.New()
		off := cr.n
		if n, err := io.Copy(h, tr); err != nil || n != hdr.Size {
			return nil, fmt.Errorf("%w: entry %q: %d of %d bytes: %v", ErrBadCaptureStream, hdr.Name, n, hdr.Size, err)
		}
		c.Objects = append(c.Objects, CaptureObject{Kind: hdr.Name, Data: io.NewSectionReader(src, off, hdr.Size),
			Size: hdr.Size, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
}

// checkCaptureEntry checks the i-th entry of a capture stream (seen holds
// the names before it).
func checkCaptureEntry(hdr *tar.Header, i int, seen map[string]bool, maxObject int64) error {
	limit := maxObject
	if hdr.Name == captureRecord {
		limit = maxRecord
	}
	switch {
	case hdr.Typeflag != tar.TypeReg:
		return fmt.Errorf("%w: entry %q is not a regular file", ErrBadCaptureStream, hdr.Name)
	case seen[hdr.Name]:
		return fmt.Errorf("%w: entry %q twice", ErrBadCaptureStream, hdr.Name)
	case (i == 0) != (hdr.Name == captureRecord):
		return fmt.Errorf("%w: %s must come first, alone", ErrBadCaptureStream, captureRecord)
	case hdr.Size < 0 || limit > 0 && hdr.Size > limit:
		return fmt.Errorf("%w: entry %q is %d bytes, the cap is %d", ErrBadCaptureStream, hdr.Name, hdr.Size, limit)
	}
	switch hdr.Name {
	case captureRecord, messages.ResultPatch, messages.ResultBundle, messages.ResultArtifacts, messages.ResultSession:
		return nil
	}
	return fmt.Errorf("%w: unknown entry %q", ErrBadCaptureStream, hdr.Name)
}

// readCaptureRecord reads the record entry (size bytes from r) into res.
func readCaptureRecord(r io.Reader, size int64, res *messages.WorkspaceResult) error {
	data := make([]byte, size)
	if _, err := io.ReadFull(r, data); err != nil {
		return fmt.Errorf("%w: entry %q: %v", ErrBadCaptureStream, captureRecord, err)
	}
	if err := messages.DecodeStrictJSON(data, res); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadCaptureStream, captureRecord, err)
	}
	if len(res.Objects) > 0 {
		return fmt.Errorf("%w: the record names objects", ErrBadCaptureStream)
	}
	return nil
}
