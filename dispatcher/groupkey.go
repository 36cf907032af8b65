package dispatcher

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/messages"
)

// MinGroupSecretBytes is the shortest group secret LoadGroupSecret takes,
// in bytes (white space around it not counted).
const MinGroupSecretBytes = 32

// groupKeyContext separates the group keys' derivation from any other use
// of the secret; the version changes only with the derivation.
const groupKeyContext = "jetcrew group key v1"

// ErrNoGroupSecret is wrapped by the error LoadGroupSecret returns for a
// file that does not exist.
var ErrNoGroupSecret = errors.New("no group secret")

// GroupSecret is what a submitter derives its groups' keys from
// (GroupSecret.Key): whoever holds the same secret can add runs to the same
// groups, so a team shares one file and a person keeps theirs. Its bytes
// never leave the submitter: requests carry the derived public key and a
// signature (docs/security.md, "Groups and pools").
type GroupSecret struct{ b []byte }

// LoadGroupSecret reads the group secret in path: its content, white space
// around it trimmed, of at least MinGroupSecretBytes bytes. A file others
// may read (any group or other permission bit) is refused, as an NKey seed
// is. The error wraps ErrNoGroupSecret when the file does not exist; it
// never contains the secret.
func LoadGroupSecret(path string) (GroupSecret, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return GroupSecret{}, fmt.Errorf("group secret %s: %w", path, ErrNoGroupSecret)
	}
	if err != nil {
		return GroupSecret{}, fmt.Errorf("group secret: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return GroupSecret{}, fmt.Errorf("group secret %s is mode %o: it must be readable by its owner only (chmod 600)", path, st.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return GroupSecret{}, fmt.Errorf("group secret: %w", err)
	}
	b := []byte(strings.TrimSpace(string(data)))
	if len(b) < MinGroupSecretBytes {
		return GroupSecret{}, fmt.Errorf("group secret %s holds %d bytes; at least %d are needed", path, len(b), MinGroupSecretBytes)
	}
	return GroupSecret{b: b}, nil
}

// CreateGroupSecret writes a new group secret to path, 32 random bytes in
// base64url (mode 0600, its directory made mode 0700 when missing), and
// returns it. The file appears whole or not at all (written aside, then
// linked), and an existing path is never replaced: the error then wraps
// fs.ErrExist, and the secret to use is the one there (LoadGroupSecret).
func CreateGroupSecret(path string) (GroupSecret, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return GroupSecret{}, fmt.Errorf("group secret: %w", err)
	}
	text := base64.RawURLEncoding.EncodeToString(raw)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return GroupSecret{}, fmt.Errorf("group secret: %w", err)
	}
	f, err := os.CreateTemp(dir, ".group-secret-*")
	if err != nil {
		return GroupSecret{}, fmt.Errorf("create group secret: %w", err)
	}
	defer func() { _ = os.Remove(f.Name()) }()
	_, werr := f.WriteString(text + "\n")
	if err := errors.Join(werr, f.Chmod(0o600), f.Close()); err != nil {
		return GroupSecret{}, fmt.Errorf("write group secret %s: %w", path, err)
	}
	if err := os.Link(f.Name(), path); err != nil {
		return GroupSecret{}, fmt.Errorf("create group secret: %w", err)
	}
	return GroupSecret{b: []byte(text)}, nil
}

// Key returns group g's key pair: an NKey user key whose Ed25519 seed is
// HMAC-SHA256 of the secret over "jetcrew group key v1", the pool and the
// group, each ended by a zero byte. The same secret gives the same key for
// the same group on any machine, and a key tells nothing of the secret or
// of the keys of other groups.
func (s GroupSecret) Key(g messages.GroupRef) (nkeys.KeyPair, error) {
	if len(s.b) == 0 {
		return nil, errors.New("group key: no group secret")
	}
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("group key: %w", err)
	}
	m := hmac.New(sha256.New, s.b)
	m.Write([]byte(groupKeyContext + "\x00" + g.Pool + "\x00" + g.Name + "\x00"))
	return nkeys.FromRawSeed(nkeys.PrefixByteUser, m.Sum(nil))
}

// WithGroupKey returns e with its request keyed to its group: GroupKey set
// to key's public key, and key kept to sign the body when it is published
// (messages.HeaderGroupSignature), whatever WithWorkspace changes later.
// The request must name its group; key is the group's (GroupSecret.Key of
// the request's GroupRef). The error wraps messages.ErrInvalidRequest as
// Encode's does.
func (e Encoded) WithGroupKey(key nkeys.KeyPair) (Encoded, error) {
	if e.data == nil {
		return Encoded{}, errNotEncoded
	}
	pub, err := key.PublicKey()
	if err != nil {
		return Encoded{}, fmt.Errorf("group key: %w", err)
	}
	e.req.GroupKey = pub
	if err := e.req.Validate(); err != nil {
		return Encoded{}, err
	}
	e.groupKey = key
	return e.encode()
}

// signGroup sets messages.HeaderGroupSignature of body, signed by the
// request's group key, in h.
func (e Encoded) signGroup(h nats.Header, body []byte) error {
	sig, err := e.groupKey.Sign(body)
	if err != nil {
		return fmt.Errorf("sign request with its group key: %w", err)
	}
	h.Set(messages.HeaderGroupSignature, base64.StdEncoding.EncodeToString(sig))
	return nil
}
