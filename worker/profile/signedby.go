package profile

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ErrSignature is wrapped by the reason a signed profile's request is
// refused for: no signature, a signer the profile does not list, or a
// signature that does not match the body.
var ErrSignature = errors.New("run request signature refused")

// checkSignedBy validates a profile's signed_by list: NKey user public keys.
func checkSignedBy(keys []string) error {
	for _, k := range keys {
		if !nkeys.IsValidPublicUserKey(k) {
			return fmt.Errorf("signed_by %q is not an NKey user public key (U…, 56 characters; `nk -gen user -pubout` makes one)", k)
		}
	}
	return nil
}

// VerifySignature checks the signature of a request for a profile's signers.
// For a profile that lists signers (signedBy), the Jetcrew-Signer header
// must name one of them and Jetcrew-Signature must be its Ed25519 signature
// of body (see messages.HeaderSignature). A profile without signers accepts
// anything. The error wraps ErrSignature and says what was wrong; it never
// echoes the signature.
func VerifySignature(h nats.Header, body []byte, signedBy []string) error {
	if len(signedBy) == 0 {
		return nil
	}
	signer, sig64 := h.Get(messages.HeaderSigner), h.Get(messages.HeaderSignature)
	if signer == "" || sig64 == "" {
		return fmt.Errorf("%w: the profile requires a request signed by one of its signed_by keys, and this one has no %s/%s headers (jetcrew submit --sign-key)", ErrSignature, messages.HeaderSigner, messages.HeaderSignature)
	}
	if !slices.Contains(signedBy, signer) {
		return fmt.Errorf("%w: signer %s is not in the profile's signed_by", ErrSignature, signer)
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil {
		return fmt.Errorf("%w: %s is not standard base64", ErrSignature, messages.HeaderSignature)
	}
	kp, err := nkeys.FromPublicKey(signer)
	if err != nil {
		return fmt.Errorf("%w: signer: %v", ErrSignature, err)
	}
	if err := kp.Verify(body, sig); err != nil {
		return fmt.Errorf("%w: the signature does not match the request body (tampered, or signed with another key)", ErrSignature)
	}
	return nil
}

// VerifySignedRequest is VerifySignature for a run request naming its run
// id. The body names run id bodyID ("" when it names none): a profile that
// lists signers also refuses a signed body without an id. Such a body's run
// id is derived from the message it came in, so every copy of it published
// again would run under a new id; with the id in the signed body, the
// worker's record of that id refuses the copies (docs/security.md, "Signed
// run requests"). The error wraps ErrSignature.
func VerifySignedRequest(h nats.Header, body []byte, bodyID string, signedBy []string) error {
	if err := VerifySignature(h, body, signedBy); err != nil {
		return err
	}
	if len(signedBy) > 0 && bodyID == "" {
		return fmt.Errorf("%w: a signed request must name its run id in its body (\"id\"): without one, every copy of it published again would run under a new id", ErrSignature)
	}
	return nil
}
