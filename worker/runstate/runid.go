package runstate

import (
	"encoding/binary"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
)

// DeriveRunID returns the run id of a request that carries none, derived from
// the stream message itself: a ULID whose time is the message's stream
// timestamp and whose entropy is its stream sequence. Every redelivery of the
// message, to any worker, yields the same id.
func DeriveRunID(meta *jetstream.MsgMetadata) string {
	var entropy [10]byte
	binary.BigEndian.PutUint64(entropy[2:], meta.Sequence.Stream)
	id, err := ulid.New(ulid.Timestamp(meta.Timestamp), bytesReader(entropy[:]))
	if err != nil {
		// Only a timestamp beyond the year 10889 fails.
		return "seq-" + strconv.FormatUint(meta.Sequence.Stream, 10)
	}
	return id.String()
}

type bytesReader []byte

func (b bytesReader) Read(p []byte) (int, error) { return copy(p, b), nil }
