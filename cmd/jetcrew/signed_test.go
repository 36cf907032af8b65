package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/roles"
)

// writeSeed makes an NKey user and writes its seed to a file; it returns
// the key pair and the file.
func writeSeed(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	seed, err := kp.Seed()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "signer.nk")
	require.NoError(t, os.WriteFile(path, seed, 0o600))
	return kp, path
}

// Signed requests on a server with auth on: a good signature runs; a
// missing one, one by a key the profile does not list and one over a
// tampered body each fail with the reason and a dead letter, and nothing
// runs.
func TestSignedRequests(t *testing.T) {
	t.Parallel()
	signer, signerFile := writeSeed(t)
	_, otherFile := writeSeed(t)
	pub, err := signer.PublicKey()
	require.NoError(t, err)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(`[profiles.signed]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
require_bridge = false
signed_by = ["`+pub+`"]
`), 0o644))
	e := authUp(t, "--profiles", profiles)

	code, out, errOut := e.as(t, roles.Submitter, "submit", "--profile", "signed", "--sign-key", signerFile, "--id", "good", "--wait", "out signed ok")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "signed ok\n", out)
	started := len(e.rt.Starts())
	require.Equal(t, 1, started)

	code, _, errOut = e.as(t, roles.Submitter, "submit", "--profile", "signed", "--id", "unsigned", "--wait", "out no")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "no Jetcrew-Signer/Jetcrew-Signature headers")

	code, _, errOut = e.as(t, roles.Submitter, "submit", "--profile", "signed", "--sign-key", otherFile, "--id", "wrongkey", "--wait", "out no")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "is not in the profile's signed_by")

	// Tampered: signed, then the body changed on the way (any client).
	rc := e.conn(t, roles.Submitter)
	body, err := json.Marshal(messages.RunRequest{Version: 1, ID: "tampered", Profile: "signed", Pool: "default", Prompt: "out harmless"})
	require.NoError(t, err)
	sig, err := signer.Sign(body)
	require.NoError(t, err)
	evil, err := json.Marshal(messages.RunRequest{Version: 1, ID: "tampered", Profile: "signed", Pool: "default", Prompt: "out evil"})
	require.NoError(t, err)
	m := nats.NewMsg(messages.SubjectRuns("default"))
	m.Data = evil
	m.Header.Set(messages.HeaderSigner, pub)
	m.Header.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))
	_, err = rc.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
	code, _, errOut = e.as(t, roles.Submitter, "watch", "tampered")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "the signature does not match the request body")

	require.Equal(t, started, len(e.rt.Starts()), "no refused request may start a container")

	// Each refusal has its dead letter, with the signature headers kept.
	ops := e.conn(t, roles.Operator)
	failed, err := ops.js.Stream(t.Context(), messages.StreamFailed)
	require.NoError(t, err)
	for _, id := range []string{"unsigned", "wrongkey", "tampered"} {
		dl, err := failed.GetLastMsgForSubject(t.Context(), messages.SubjectFailed("default", id))
		require.NoError(t, err, id)
		require.Contains(t, dl.Header.Get(messages.HeaderError), "signature refused", id)
	}
	dl, err := failed.GetLastMsgForSubject(t.Context(), messages.SubjectFailed("default", "tampered"))
	require.NoError(t, err)
	require.Equal(t, pub, dl.Header.Get(messages.HeaderSigner))
	require.Equal(t, string(evil), string(dl.Data))
}

// A key file without a user seed is refused before anything is published.
func TestSignKeyInvalid(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.nk")
	require.NoError(t, os.WriteFile(bad, []byte("not a seed\n"), 0o600))
	code, _, errOut := cli(t, "nats://127.0.0.1:1", "submit", "--sign-key", bad, "echo")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "no NKey user seed")
	require.NotContains(t, errOut, "connect")
}

// A signed request runs once under --auth. A submitter who publishes the
// same signed bytes again — a copy of a failed run's request, or one with
// no id — gets nothing run; it may not publish to the replay subject; the
// operator's `jetcrew replay` runs the failed run again.
func TestSignedReplayUnderAuth(t *testing.T) {
	t.Parallel()
	signer, signerFile := writeSeed(t)
	pub, err := signer.PublicKey()
	require.NoError(t, err)
	profiles := filepath.Join(t.TempDir(), "profiles.toml")
	require.NoError(t, os.WriteFile(profiles, []byte(`[profiles.signed]
image = "jetcrew-sandbox:latest"
command = ["/bin/sh", "-c", "{prompt}"]
signed_by = ["`+pub+`"]
`), 0o644))
	e := authUp(t, "--profiles", profiles)

	code, _, errOut := e.as(t, roles.Submitter, "submit", "--profile", "signed", "--sign-key", signerFile, "--id", "sr1", "--wait", "out once; exit 3")
	require.Equal(t, 3, code, errOut)
	require.Len(t, e.rt.Starts(), 1)

	// The request as the submitter read it (the same bytes, the same
	// headers), published again.
	rc := e.conn(t, roles.Submitter)
	ops := e.conn(t, roles.Operator)
	failed, err := ops.js.Stream(t.Context(), messages.StreamFailed)
	require.NoError(t, err)
	dl, err := failed.GetLastMsgForSubject(t.Context(), messages.SubjectFailed("default", "sr1"))
	require.NoError(t, err)
	copyOf := func(subject string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = dl.Data
		m.Header.Set(messages.HeaderSigner, dl.Header.Get(messages.HeaderSigner))
		m.Header.Set(messages.HeaderSignature, dl.Header.Get(messages.HeaderSignature))
		return m
	}
	_, err = rc.js.PublishMsg(t.Context(), copyOf(messages.SubjectRuns("default")))
	require.NoError(t, err)
	// watch shows every event of the run, the refusal's once it is out.
	require.Eventually(t, func() bool {
		code, _, errOut = e.as(t, roles.Submitter, "watch", "sr1")
		return code == 3 && strings.Contains(errOut, "signed requests run once; only an operator replays one, on jetcrew.runs.default.replay")
	}, 10*time.Second, 50*time.Millisecond, "watch: %s", errOut)
	require.Len(t, e.rt.Starts(), 1, "the submitter's copy did not run")
	// The replay subject is the operator's.
	require.ErrorIs(t, rc.try(messages.SubjectReplay("default"), func(ctx context.Context) error {
		_, err := rc.js.PublishMsg(ctx, copyOf(messages.SubjectReplay("default")))
		return err
	}), errRefused)

	// The operator replays it: it runs again, under the same id.
	code, _, errOut = e.as(t, roles.Operator, "replay", "--wait", "sr1")
	require.Equal(t, 3, code, errOut)
	require.Contains(t, errOut, "published to jetcrew.runs.default.replay")
	require.Len(t, e.rt.Starts(), 2)
	code, out, errOut := e.as(t, roles.Submitter, "status", "sr1")
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `replays:\s+1`, out)

	// A signed body without an id, as the README's nats pub example
	// makes it, never runs, however often it is published.
	body := []byte(`{"profile":"signed","prompt":"out no id"}`)
	sig, err := signer.Sign(body)
	require.NoError(t, err)
	for range 2 {
		m := nats.NewMsg(messages.SubjectRuns("default"))
		m.Data = body
		m.Header.Set(messages.HeaderSigner, pub)
		m.Header.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))
		_, err = rc.js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		st, err := failed.Info(t.Context())
		return err == nil && st.State.Msgs == 4 // sr1 twice, and the two id-less copies
	}, 10*time.Second, 20*time.Millisecond)
	require.Len(t, e.rt.Starts(), 2, "no id-less signed copy ran")
}
