package dispatcher

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/messages"
)

// SubmitSigned is Submit with the request signed by key, an NKey user key
// pair holding its seed: the message carries messages.HeaderSigner (key's
// public key) and messages.HeaderSignature (the Ed25519 signature of the
// encoded request), which a profile with signed_by requires.
func (s *Submitter) SubmitSigned(ctx context.Context, req messages.RunRequest, key nkeys.KeyPair) (string, error) {
	if key == nil {
		return "", fmt.Errorf("submit: nil signing key")
	}
	e, err := Encode(req)
	if err != nil {
		return "", fmt.Errorf("submit: %w", err)
	}
	return s.publish(ctx, e, key)
}

// LoadSigningKey reads an NKey user seed ("SU…") from path, the file
// `jetcrew up --auth` writes for each role or `nk -gen user` prints, and
// returns its key pair. Comment lines and the decorations of a .creds file
// are skipped. The error never contains the seed.
func LoadSigningKey(path string) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "SU") {
			continue
		}
		kp, err := nkeys.FromSeed([]byte(line))
		if err != nil {
			return nil, fmt.Errorf("signing key %s: not a valid NKey user seed", path)
		}
		return kp, nil
	}
	return nil, fmt.Errorf("signing key %s: no NKey user seed (a line starting SU) in the file", path)
}

// signInto sets the signature headers of body, signed by key, in h.
func signInto(h nats.Header, body []byte, key nkeys.KeyPair) error {
	pub, err := key.PublicKey()
	if err != nil {
		return fmt.Errorf("signing key: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("signing key: %s is not an NKey user key (want a seed starting SU)", pub)
	}
	sig, err := key.Sign(body)
	if err != nil {
		return fmt.Errorf("sign request: %w", err)
	}
	h.Set(messages.HeaderSigner, pub)
	h.Set(messages.HeaderSignature, base64.StdEncoding.EncodeToString(sig))
	return nil
}
