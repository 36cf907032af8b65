package dispatcher

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A run's request is read from JETCREW_RUNS while it waits or runs, from
// its dead letter once it failed, and is gone once it succeeded; a
// message of the same id with another body is not the run's.
func TestAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()

	id, err := b.d.Submit(ctx, messages.RunRequest{Profile: "shell", Prompt: "echo <b>hi</b>"})
	require.NoError(t, err)
	a, err := b.d.Asked(ctx, &messages.RunState{ID: id, State: messages.StateQueued})
	require.NoError(t, err, "a run no worker took: found by scanning")
	require.Equal(t, AskedFromQueue, a.From)
	require.True(t, a.Decoded)
	require.Equal(t, "echo <b>hi</b>", a.Request.Prompt)

	stream, err := b.js.Stream(ctx, messages.StreamRuns)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(ctx, messages.SubjectRuns(messages.DefaultPool))
	require.NoError(t, err)
	running := messages.RunState{ID: id, State: messages.StateRunning, StreamSeq: m.Sequence, RequestDigest: messages.RequestDigest(m.Data)}
	a, err = b.d.Asked(ctx, &running)
	require.NoError(t, err, "a running run: its message at StreamSeq")
	require.Equal(t, m.Data, a.Body)

	other := running
	other.RequestDigest = "sha256:00"
	_, err = b.d.Asked(ctx, &other)
	require.ErrorIs(t, err, ErrRequestGone, "another request under the same id is not the run's")

	// Taken and done with: the stream no longer has it.
	require.NoError(t, stream.DeleteMsg(ctx, m.Sequence))
	done := running
	done.State = messages.StateSucceeded
	_, err = b.d.Asked(ctx, &done)
	require.ErrorIs(t, err, ErrRequestGone)

	// Failed: its dead letter holds it, byte for byte, even malformed.
	dl := nats.NewMsg(messages.SubjectFailed(messages.DefaultPool, id))
	dl.Data = []byte(`{"id":"` + id + `","profile":"shell","prompt":"x",`)
	dl.Header.Set(messages.HeaderState, string(messages.StateFailed))
	_, err = b.js.PublishMsg(ctx, dl)
	require.NoError(t, err)
	failed := messages.RunState{ID: id, State: messages.StateFailed, StreamSeq: m.Sequence}
	a, err = b.d.Asked(ctx, &failed)
	require.NoError(t, err)
	require.Equal(t, AskedFromDeadLetter, a.From)
	require.False(t, a.Decoded)
	require.Equal(t, dl.Data, a.Body)
}

// A ResultReader checks the object against the run's record at its end.
func TestOpenResult(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()
	obs, err := b.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: messages.BucketResults})
	require.NoError(t, err)
	patch := []byte("diff --git a/x b/x\n")
	name := messages.ResultObjectName("r1", 7, 1, messages.ResultPatch)
	_, err = obs.PutBytes(ctx, name, patch)
	require.NoError(t, err)
	sum := sha256.Sum256(patch)
	st := messages.RunState{ID: "r1", State: messages.StateSucceeded, WorkspaceResult: &messages.WorkspaceResult{
		Objects: []messages.ResultObject{{Name: name, Size: int64(len(patch)), SHA256: hex.EncodeToString(sum[:])}}}}

	rr, err := b.d.OpenResult(ctx, &st, messages.ResultPatch)
	require.NoError(t, err)
	got, err := io.ReadAll(rr)
	require.NoError(t, err)
	require.NoError(t, rr.Close())
	require.True(t, bytes.Equal(patch, got))

	st.WorkspaceResult.Objects[0].SHA256 = hex.EncodeToString(make([]byte, 32))
	rr, err = b.d.OpenResult(ctx, &st, messages.ResultPatch)
	require.NoError(t, err)
	_, err = io.ReadAll(rr)
	require.ErrorIs(t, err, ErrResultMismatch)
	require.NoError(t, rr.Close())

	st.WorkspaceResult.Objects[0].Size = 3
	rr, err = b.d.OpenResult(ctx, &st, messages.ResultPatch)
	require.NoError(t, err)
	_, err = io.ReadAll(rr)
	require.ErrorIs(t, err, ErrResultMismatch, "longer than recorded")
	require.NoError(t, rr.Close())

	_, err = b.d.OpenResult(ctx, &st, messages.ResultBundle)
	require.ErrorIs(t, err, ErrNoResult)
}
