package profile

import (
	"encoding/base64"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestVerifySignature(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	other, err := nkeys.CreateUser()
	require.NoError(t, err)
	otherPub, err := other.PublicKey()
	require.NoError(t, err)
	body := []byte(`{"id":"r1","profile":"p"}`)
	sign := func(k nkeys.KeyPair, data []byte) string {
		s, err := k.Sign(data)
		require.NoError(t, err)
		return base64.StdEncoding.EncodeToString(s)
	}
	hdr := func(signer, sig string) nats.Header {
		h := nats.Header{}
		if signer != "" {
			h.Set(messages.HeaderSigner, signer)
		}
		if sig != "" {
			h.Set(messages.HeaderSignature, sig)
		}
		return h
	}
	tests := []struct {
		name     string
		h        nats.Header
		body     []byte
		signedBy []string
		want     string // "" = accepted
	}{
		{"unsigned profile takes anything", nats.Header{}, body, nil, ""},
		{"good", hdr(pub, sign(kp, body)), body, []string{otherPub, pub}, ""},
		{"missing", nats.Header{}, body, []string{pub}, "no Jetcrew-Signer/Jetcrew-Signature headers"},
		{"signer only", hdr(pub, ""), body, []string{pub}, "no Jetcrew-Signer"},
		{"unlisted signer", hdr(otherPub, sign(other, body)), body, []string{pub}, "not in the profile's signed_by"},
		{"claims a listed signer, signed by another", hdr(pub, sign(other, body)), body, []string{pub}, "does not match"},
		{"tampered", hdr(pub, sign(kp, body)), []byte(`{"id":"r1","profile":"q"}`), []string{pub}, "does not match"},
		{"not base64", hdr(pub, "!!!"), body, []string{pub}, "not standard base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifySignature(tt.h, tt.body, tt.signedBy)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrSignature)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// A signed body must name its run id; an unsigned profile takes one
// without, and a bad signature is refused first.
func TestVerifySignedRequest(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	body := []byte(`{"profile":"p"}`)
	sig, err := kp.Sign(body)
	require.NoError(t, err)
	h := nats.Header{}
	h.Set(messages.HeaderSigner, pub)
	h.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))

	err = VerifySignedRequest(h, body, "", []string{pub})
	require.ErrorIs(t, err, ErrSignature)
	require.ErrorContains(t, err, `a signed request must name its run id in its body ("id")`)
	require.NoError(t, VerifySignedRequest(nats.Header{}, body, "", nil), "an unsigned profile")
	require.ErrorContains(t, VerifySignedRequest(nats.Header{}, body, "", []string{pub}), "no Jetcrew-Signer")

	withID := []byte(`{"id":"r1","profile":"p"}`)
	sig, err = kp.Sign(withID)
	require.NoError(t, err)
	h.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))
	require.NoError(t, VerifySignedRequest(h, withID, "r1", []string{pub}))
}

func TestSignedByValidated(t *testing.T) {
	t.Parallel()
	_, err := ParseProfiles("p.toml", []byte("[profiles.x]\nimage='i'\ncommand=['a']\nsigned_by=['SUAAAA']\n"))
	require.ErrorContains(t, err, "not an NKey user public key")
}

// Untrusted signature headers never panic the worker and never pass
// without the signer's key.
func FuzzVerifySignature(f *testing.F) {
	kp, err := nkeys.CreateUser()
	require.NoError(f, err)
	pub, err := kp.PublicKey()
	require.NoError(f, err)
	body := []byte(`{"id":"r1"}`)
	sig, err := kp.Sign(body)
	require.NoError(f, err)
	f.Add(pub, base64.StdEncoding.EncodeToString(sig), body)
	f.Add(pub, "", body)
	f.Add("UAAAA", "====", []byte{})
	f.Add(pub, base64.StdEncoding.EncodeToString(make([]byte, 64)), body)
	f.Fuzz(func(t *testing.T, signer, sig string, data []byte) {
		h := nats.Header{}
		h.Set(messages.HeaderSigner, signer)
		h.Set(messages.HeaderSignature, sig)
		err := VerifySignature(h, data, []string{pub})
		if err == nil {
			// Only a real signature of data by kp passes.
			raw, derr := base64.StdEncoding.DecodeString(sig)
			require.NoError(t, derr)
			require.NoError(t, kp.Verify(data, raw))
			require.Equal(t, pub, signer)
		}
	})
}
