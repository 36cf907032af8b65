package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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
