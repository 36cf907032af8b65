package messages

import (
	"fmt"
	"strings"
	"time"
)

// Coordination groups (docs/security.md, "Groups and pools"). A group is
// named by its pool and its name together (GroupRef): the same name in two
// pools is two groups, which share no subject, key or budget. A run that
// names no group is alone in a group of its own, which no request can name
// (GroupRef.Own). Within a pool, the first run a worker admits to a named
// group records who may join it (GroupRecord, in BucketGroups), and every
// later run must match that record.
const (
	// BucketGroups is the key-value bucket of the named groups' records:
	// one key GroupRef.Key ("<pool>.<group>") per group, a GroupRecord,
	// created by the worker that admits the group's first run (a create, so
	// the first writer wins) and never changed. Only workers write it.
	BucketGroups = "jetcrew-groups"
	// HeaderGroupSignature carries, on a run request whose body names a
	// group_key (RunRequest.GroupKey), the Ed25519 signature of the message
	// body, exactly the bytes published, by that key's seed, in standard
	// base64 with padding (RFC 4648 §4): the proof that the submitter holds
	// the group's seed. A body cannot be changed, nor its run id, without
	// the seed.
	HeaderGroupSignature = "Jetcrew-Group-Signature"
	// OwnGroupMark starts the token of a run's own group in subjects and
	// keys (GroupRef.Key): "=" and the run id. No name a request gives
	// holds it (ValidateToken), so no request joins a run's own group.
	OwnGroupMark = "="
)

// GroupRef names a coordination group: a pool and a group name in it.
type GroupRef struct {
	// Pool is the pool of the group's runs.
	Pool string
	// Name is the group's name: a request's group, else its run id.
	Name string
	// Own is true for the group of a run whose request named none: Name
	// is the run's id, and the run is alone in it.
	Own bool
}

// Key returns the group's name in subjects and keys: "<pool>.<group>", or
// "<pool>.=<run_id>" for a run's own group. It is two subject tokens, so a
// wildcard over one pool's groups is "<pool>.*".
func (g GroupRef) Key() string {
	if g.Own {
		return g.Pool + "." + OwnGroupMark + g.Name
	}
	return g.Pool + "." + g.Name
}

// String returns the group as messages say it: "<group> of pool <pool>",
// or "run <run_id>'s own group in pool <pool>".
func (g GroupRef) String() string {
	if g.Own {
		return "run " + g.Name + "'s own group in pool " + g.Pool
	}
	return g.Name + " of pool " + g.Pool
}

// Validate checks that both halves of g are valid names (ValidateName);
// the error wraps ErrInvalidToken or ErrReservedName.
func (g GroupRef) Validate() error {
	if err := ValidateName("pool", g.Pool); err != nil {
		return err
	}
	if g.Own {
		return ValidateName("run id", g.Name)
	}
	return ValidateName("group", g.Name)
}

// ParseGroupKey reads a GroupRef.Key, "<pool>.<group>" or
// "<pool>.=<run_id>", back into its parts, each checked by ValidateName.
func ParseGroupKey(key string) (GroupRef, error) {
	pool, name, ok := strings.Cut(key, ".")
	if !ok {
		return GroupRef{}, fmt.Errorf("group %q: want <pool>.<group>", key)
	}
	g := GroupRef{Pool: pool, Name: name}
	if rest, own := strings.CutPrefix(name, OwnGroupMark); own {
		g.Name, g.Own = rest, true
	}
	return g, g.Validate()
}

// GroupRef returns the group run r belongs to: in its pool (DefaultPool
// when empty), the group it names, else (no group, or its own id) its own
// group (Own, named by its run id).
func (r RunRequest) GroupRef() GroupRef {
	pool := r.Pool
	if pool == "" {
		pool = DefaultPool
	}
	return GroupRef{Pool: pool, Name: r.GroupOrID(), Own: r.Group == "" || r.Group == r.ID}
}

// GroupKind says who may join a named group: what its first run was.
type GroupKind string

// Group kinds.
const (
	// GroupKeyed is a group whose first request carried a group_key: a
	// request joins it only with the same key and the body signed by it
	// (HeaderGroupSignature).
	GroupKeyed GroupKind = "keyed"
	// GroupOpen is a group whose first request named it without a key (a
	// client older than keys, or one that does not use them): any request
	// naming it without a key joins it. jetcrew submit never makes one.
	GroupOpen GroupKind = "open"
)

// GroupRecord is the value of a named group's key in BucketGroups: what
// its first run recorded, which every later run of the group must match.
type GroupRecord struct {
	// Pool and Group name the group (GroupRef).
	Pool  string `json:"pool"`
	Group string `json:"group"`
	// Kind says who may join.
	Kind GroupKind `json:"kind"`
	// Key is the group's NKey user public key (GroupKeyed); empty for an
	// open group.
	Key string `json:"key,omitempty"`
	// Creator is the run whose admission created the record.
	Creator string `json:"creator"`
	// Created is when it was created.
	Created time.Time `json:"created"`
}

// groupKeyLen is the length of an NKey user public key: "U" and 55
// characters of base32 (RFC 4648, no padding).
const groupKeyLen = 56

// validGroupKeyShape reports whether k looks like an NKey user public key:
// 56 characters, "U" then A-Z and 2-7. Whether its checksum holds is the
// worker's to check (package nkeys), with the signature.
func validGroupKeyShape(k string) bool {
	if len(k) != groupKeyLen || k[0] != 'U' {
		return false
	}
	for i := 1; i < len(k); i++ {
		if c := k[i]; (c < 'A' || c > 'Z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
