package worker

import (
	"fmt"

	"github.com/jetcrew/jetcrew/messages"
)

// otherRequest reports whether prev, the recorded state of this message's run
// id, belongs to a request with another body (messages.RequestDigest): a
// submitter reusing a run id. Such a message is never a redelivery or a
// replay of the recorded run, so handle refuses it as a duplicate. A state
// without a digest (written before digests existed) is not compared.
func (r *run) otherRequest(prev messages.RunState) bool {
	return prev.RequestDigest != "" && r.state.RequestDigest != "" && prev.RequestDigest != r.state.RequestDigest
}

// duplicateReason says why a request for a run id that has a state is
// refused.
func (r *run) duplicateReason(prev messages.RunState) string {
	if r.otherRequest(prev) {
		return fmt.Sprintf("duplicate request refused: run id %s is already used by a different request (%s, request stream sequence %d, this one %d); submit with a new id",
			r.req.ID, prev.State, prev.StreamSeq, r.meta.Sequence.Stream)
	}
	return fmt.Sprintf("duplicate request refused: run %s is already %s (request stream sequence %d, this one %d)",
		r.req.ID, prev.State, prev.StreamSeq, r.meta.Sequence.Stream)
}
