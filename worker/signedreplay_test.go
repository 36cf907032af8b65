package worker_test

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker"
	"github.com/jetcrew/jetcrew/worker/profile"
)

// signedSetup starts a worker with a profile "signed" that requires
// requests signed by the returned key.
func signedSetup(t *testing.T) (*testBundle, nkeys.KeyPair) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	ps, err := profile.ParseProfiles("signed.toml", []byte(`
[profiles.signed]
image = "i"
command = ["/bin/sh", "-c", "{prompt}"]
signed_by = ["`+pub+`"]
`))
	require.NoError(t, err)
	return setup(t, func(c *worker.Config) { c.Profiles = ps }), kp
}

// signedMsg is body on subject, signed by kp as any NATS client signs.
func signedMsg(t *testing.T, kp nkeys.KeyPair, subject, body string) *nats.Msg {
	t.Helper()
	sig, err := kp.Sign([]byte(body))
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	m.Header.Set(messages.HeaderSigner, pub)
	m.Header.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))
	return m
}

// A signed request without an id would get a new derived id each time it is
// published again, so each copy would run: a signed body must name its id,
// and one that does not runs never, however often it is published.
func TestSignedRequestWithoutIDRefused(t *testing.T) {
	t.Parallel()
	b, kp := signedSetup(t)
	body := `{"profile":"signed","prompt":"out ran"}`
	for range 2 {
		ack, err := b.js.PublishMsg(t.Context(), signedMsg(t, kp, messages.SubjectRuns("default"), body))
		require.NoError(t, err)
		st := b.waitFinal(t, b.derivedID(t, ack.Sequence))
		require.Equal(t, messages.StateFailed, st.State)
		require.Contains(t, st.Reason, "run request signature refused: a signed request must name its run id in its body")
	}
	require.Empty(t, b.rt.Starts(), "no copy of the id-less signed request ran")
}

// A signed request runs once. Published again by anyone who read it (a
// submitter may read queued requests, headers included), it is refused
// whatever the run's outcome, failure included: a duplicate event says
// why, and nothing runs. An operator's replay, on the pool's replay subject
// (which submitters may not publish to), runs the failed run anew.
func TestSignedRequestReplayOnlyByOperator(t *testing.T) {
	t.Parallel()
	b, kp := signedSetup(t)
	body := `{"id":"s1","profile":"signed","prompt":"out once; exit 3"}`
	_, err := b.js.PublishMsg(t.Context(), signedMsg(t, kp, messages.SubjectRuns("default"), body))
	require.NoError(t, err)
	require.Equal(t, messages.StateFailed, b.waitFinal(t, "s1").State)
	require.Len(t, b.rt.Starts(), 1)

	// The same signed message, published again by a submitter.
	ack, err := b.js.PublishMsg(t.Context(), signedMsg(t, kp, messages.SubjectRuns("default"), body))
	require.NoError(t, err)
	refused := func(seq uint64) bool {
		for _, m := range b.events(t, "s1") {
			if m.Subject() == messages.SubjectEvents("s1", messages.EventDuplicate) && strings.Contains(string(m.Data()), "request stream sequence") &&
				strings.Contains(string(m.Data()), "this one "+strconv.FormatUint(seq, 10)) {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return refused(ack.Sequence) }, 5*time.Second, 20*time.Millisecond, "a duplicate event refuses the copy")
	require.Eventually(t, func() bool { return b.streamMsgs(t, messages.StreamRuns) == 0 }, 5*time.Second, 10*time.Millisecond)
	st, _ := b.state(t, "s1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Zero(t, st.Replays)
	require.Len(t, b.rt.Starts(), 1, "the submitter's copy did not run")
	var reason string
	for _, m := range b.events(t, "s1") {
		if m.Subject() == messages.SubjectEvents("s1", messages.EventDuplicate) {
			reason = string(m.Data())
		}
	}
	require.Contains(t, reason, "signed requests run once; only an operator replays one, on jetcrew.runs.default.replay (jetcrew replay)")

	// The operator's replay of the dead letter runs it anew, signature kept.
	dl := b.deadLetter(t, "default", "s1")
	require.Equal(t, body, string(dl.Data))
	m := nats.NewMsg(messages.SubjectReplay("default"))
	m.Data, m.Header = dl.Data, nats.Header{}
	m.Header.Set(messages.HeaderSigner, dl.Header.Get(messages.HeaderSigner))
	m.Header.Set(messages.HeaderSignature, dl.Header.Get(messages.HeaderSignature))
	_, err = b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, _ := b.state(t, "s1")
		return st.Replays == 1 && st.State == messages.StateFailed
	}, 10*time.Second, 20*time.Millisecond)
	require.Len(t, b.rt.Starts(), 2, "the operator's replay ran")

	// A copy published again after the replay is refused as well.
	ack, err = b.js.PublishMsg(t.Context(), signedMsg(t, kp, messages.SubjectRuns("default"), body))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return refused(ack.Sequence) }, 5*time.Second, 20*time.Millisecond)
	require.Len(t, b.rt.Starts(), 2)
}
