package dispatcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/workspace"
)

// encodeAll encodes a request per id, each with prompt "true".
func encodeAll(t *testing.T, ws *messages.WorkspaceRef, ids ...string) []Encoded {
	t.Helper()
	var out []Encoded
	for _, id := range ids {
		e, err := Encode(messages.RunRequest{ID: id, Profile: "shell", Prompt: "true", Workspace: ws})
		require.NoError(t, err)
		out = append(out, e)
	}
	return out
}

// published returns the requests JETCREW_RUNS holds, in order, with their
// messages' headers.
func (b *testBundle) published(t *testing.T) ([]messages.RunRequest, []*jetstream.RawStreamMsg) {
	t.Helper()
	st, err := b.js.Stream(t.Context(), messages.StreamRuns)
	require.NoError(t, err)
	var reqs []messages.RunRequest
	var msgs []*jetstream.RawStreamMsg
	for seq := uint64(1); ; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return reqs, msgs
		}
		require.NoError(t, err)
		req, err := messages.DecodeRunRequest(m.Data)
		require.NoError(t, err)
		reqs, msgs = append(reqs, req), append(msgs, m)
	}
}

// SubmitBatch is submit's one sequence, for one run or for attempts: the
// workspace is uploaded once and every request names it, each is signed
// and published in order, and the caller hears of the upload and of each
// run published.
func TestSubmitBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a\n"), 0o644))
	key, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := key.PublicKey()
	require.NoError(t, err)

	var uploads []workspace.Uploaded
	var got []string
	ids, err := b.d.SubmitBatch(t.Context(), Batch{
		Requests:  encodeAll(t, nil, "b-1", "b-2", "b-3"),
		Key:       key,
		Workspace: dir,
		Uploaded:  func(up workspace.Uploaded) { uploads = append(uploads, up) },
		Published: func(id string) { got = append(got, id) },
	})
	require.NoError(t, err)
	require.Equal(t, []string{"b-1", "b-2", "b-3"}, ids)
	require.Equal(t, ids, got, "each run is said as it is published")
	require.Len(t, uploads, 1, "the workspace is uploaded once")
	reqs, msgs := b.published(t)
	require.Len(t, reqs, 3)
	for i, req := range reqs {
		require.Equal(t, ids[i], req.ID)
		require.Equal(t, uploads[0].Ref, *req.Workspace, "every request names the one snapshot")
		require.Equal(t, pub, msgs[i].Header.Get(messages.HeaderSigner))
		require.NotEmpty(t, msgs[i].Header.Get(messages.HeaderSignature))
	}

	// A request that its workspace field makes too large: refused with
	// nothing published.
	small, err := Encode(messages.RunRequest{ID: "b-big", Profile: "shell", Prompt: "x"})
	require.NoError(t, err)
	big, err := Encode(messages.RunRequest{ID: "b-big", Profile: "shell",
		Prompt: strings.Repeat("x", messages.MaxRequestBytes-len(small.data)+1)})
	require.NoError(t, err)
	_, err = b.d.SubmitBatch(t.Context(), Batch{Requests: []Encoded{big}, Workspace: dir})
	require.ErrorIs(t, err, messages.ErrInvalidRequest)
	_, err = b.d.SubmitBatch(t.Context(), Batch{Requests: []Encoded{{}}})
	require.ErrorIs(t, err, messages.ErrInvalidRequest, "an Encoded that Encode did not make")
	reqs, _ = b.published(t)
	require.Len(t, reqs, 3)
}

// A batch whose requests start from an earlier run checks that run first:
// unreadable, or without a workspace result, nothing is uploaded or
// published, and the error says which run and why.
func TestSubmitBatchFrom(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.putState(t, messages.RunState{ID: "plain", State: messages.StateSucceeded, Pool: messages.DefaultPool})
	b.putState(t, messages.RunState{ID: "busy", State: messages.StateRunning, Pool: messages.DefaultPool,
		WorkspaceResult: &messages.WorkspaceResult{}})
	b.putState(t, messages.RunState{ID: "done", State: messages.StateSucceeded, Pool: messages.DefaultPool,
		WorkspaceResult: &messages.WorkspaceResult{Commits: 1}})

	for _, tt := range []struct {
		from  string
		state messages.State
		cause error
	}{
		{"nope", "", ErrRunNotFound},
		{"plain", messages.StateSucceeded, ErrNoResult},
		{"busy", messages.StateRunning, ErrNoResult},
	} {
		_, err := b.d.SubmitBatch(t.Context(), Batch{Requests: encodeAll(t, &messages.WorkspaceRef{From: tt.from}, "f-1", "f-2")})
		var fe *FromError
		require.ErrorAs(t, err, &fe, tt.from)
		require.Equal(t, tt.from, fe.Run)
		require.Equal(t, tt.state, fe.State)
		require.ErrorIs(t, err, tt.cause)
	}
	reqs, _ := b.published(t)
	require.Empty(t, reqs, "nothing is published after a refused check")

	ids, err := b.d.SubmitBatch(t.Context(), Batch{Requests: encodeAll(t, &messages.WorkspaceRef{From: "done"}, "f-1", "f-2")})
	require.NoError(t, err)
	require.Equal(t, []string{"f-1", "f-2"}, ids)
}

// A publish that fails ends the batch: the runs published before it are
// returned with the error. A publish refused because jetcrew's streams do
// not exist yet is handed to NotProvisioned, which may have it tried again.
func TestSubmitBatchPublishFails(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.putState(t, messages.RunState{ID: "p-2", State: messages.StateFailed, Pool: messages.DefaultPool, RequestDigest: "sha256:another"})
	ids, err := b.d.SubmitBatch(t.Context(), Batch{Requests: encodeAll(t, nil, "p-1", "p-2", "p-3")})
	require.ErrorIs(t, err, ErrIDInUse)
	require.Equal(t, []string{"p-1"}, ids)

	n := setup(t, setupOpts{noProvision: true})
	refused := errors.New("not waiting")
	var calls int
	_, err = n.d.SubmitBatch(t.Context(), Batch{Requests: encodeAll(t, nil, "n-1"),
		NotProvisioned: func(_ context.Context, err error) error {
			calls++
			require.ErrorIs(t, err, ErrNotProvisioned)
			return refused
		}})
	require.ErrorIs(t, err, refused)
	require.Equal(t, 1, calls)

	// Provisioned meanwhile: tried again, published.
	calls = 0
	ids, err = n.d.SubmitBatch(t.Context(), Batch{Requests: encodeAll(t, nil, "n-1", "n-2"),
		NotProvisioned: func(ctx context.Context, _ error) error {
			calls++
			_, err := worker.Provision(ctx, n.js, worker.ProvisionConfig{})
			return err
		}})
	require.NoError(t, err)
	require.Equal(t, []string{"n-1", "n-2"}, ids)
	require.Equal(t, 1, calls)
}
