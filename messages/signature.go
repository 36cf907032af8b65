package messages

// Signed run requests. A profile with signed_by accepts only requests that
// carry both headers, made with the NKey of one of its listed public keys
// (docs/security.md, "Signed run requests"):
//
//	Jetcrew-Signer:    the signer's NKey user public key ("U…", 56 characters)
//	Jetcrew-Signature: the Ed25519 signature of the message body, exactly as
//	                   published, in standard base64 with padding (RFC 4648 §4)
//
// Any NATS client can produce them: sign the body bytes with the Ed25519 key
// the NKey seed holds (nkeys' KeyPair.Sign) and publish with the headers.
//
// A signed body must name its run id (RunRequest.ID), and a signed request
// runs once: the same signed body published again is refused, whatever the
// run's outcome, unless it comes on the pool's replay subject
// (SubjectReplay), which only operators may publish to (docs/security.md,
// "A signed request runs once").
const (
	// HeaderSigner carries the NKey user public key that signed the request.
	HeaderSigner = "Jetcrew-Signer"
	// HeaderSignature carries the base64 Ed25519 signature of the body.
	HeaderSignature = "Jetcrew-Signature"
)
