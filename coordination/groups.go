package coordination

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/jetcrew/jetcrew/messages"
)

// BucketGroups holds the groups' records: one key "<pool>.<group>" per
// group (messages.BucketGroups).
const BucketGroups = messages.BucketGroups

// ErrGroupRefused is wrapped by the error Groups.Admit returns for a
// request that may not join the group it names: the run fails with that
// reason and a dead letter, and is never retried. Any other error of
// Admit is NATS's, worth a retry.
var ErrGroupRefused = errors.New("group refused")

// Groups admits runs into their coordination groups: the first run of a
// group records who may join it (a messages.GroupRecord in BucketGroups,
// created with a compare-and-set against no key, so the first writer
// wins), and every later run must match that record. Create it with
// NewGroups; it is safe for concurrent use.
type Groups struct {
	js jetstream.JetStream
	mu sync.Mutex
	kv jetstream.KeyValue // BucketGroups, looked up by the first Admit
}

// NewGroups returns a Groups recording in js's BucketGroups, which must
// exist (Provision) before the first Admit. It does no I/O.
func NewGroups(js jetstream.JetStream) *Groups { return &Groups{js: js} }

// Admission is what Groups.Admit is given of a delivered run request.
type Admission struct {
	// Request is the decoded request, its run id set (derived from the
	// stream message when the body named none).
	Request messages.RunRequest
	// BodyID is the run id the body names; "" when it names none.
	BodyID string
	// Header and Body are the request message's, exactly as published:
	// a keyed request's body is signed (messages.HeaderGroupSignature).
	Header nats.Header
	Body   []byte
}

// Admit lets the run of a into its group (messages.RunRequest.GroupRef),
// or refuses it with an error wrapping ErrGroupRefused that says why. A
// keyed request (group_key) must name its run id and carry the body's
// signature by the key. The group's first run creates the group's record:
// a run that named no group makes its own (messages.GroupOfRun), a keyed
// request a keyed group, any other an open one. A later run joins only a
// record it matches: a keyed group with the same key, an open group
// without one, a run's own group never. The record's creator is admitted
// again whatever its kind, so a redelivery or a replay of a run passes
// where the first delivery did. Admit is idempotent by run id.
func (g *Groups) Admit(ctx context.Context, a Admission) error {
	req := a.Request
	ref := req.GroupRef()
	if err := verifyGroupSignature(a); err != nil {
		return err
	}
	kv, err := g.bucket(ctx)
	if err != nil {
		return err
	}
	rec := messages.GroupRecord{Pool: ref.Pool, Group: ref.Name, Kind: kindOf(req), Key: req.GroupKey, Creator: req.ID, Created: time.Now().UTC()}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err = kv.Create(ctx, ref.Key(), data); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("record group %s: %w", ref, err)
	}
	e, err := kv.Get(ctx, ref.Key())
	if err != nil {
		return fmt.Errorf("read the record of group %s: %w", ref, err)
	}
	var have messages.GroupRecord
	if err := json.Unmarshal(e.Value(), &have); err != nil {
		return refused("group %s: its record in %s is unreadable (%v): no run joins it", ref, BucketGroups, err)
	}
	return joins(have, req)
}

// bucket returns BucketGroups, looking it up once.
func (g *Groups) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.kv != nil {
		return g.kv, nil
	}
	kv, err := g.js.KeyValue(ctx, BucketGroups)
	if err != nil {
		return nil, fmt.Errorf("bucket %s (run coordination.Provision first): %w", BucketGroups, err)
	}
	g.kv = kv
	return kv, nil
}

// kindOf is the kind of group req's run would create.
func kindOf(req messages.RunRequest) messages.GroupKind {
	switch {
	case req.Group == "":
		return messages.GroupOfRun
	case req.GroupKey != "":
		return messages.GroupKeyed
	}
	return messages.GroupOpen
}

// refused returns an error wrapping ErrGroupRefused with the reason.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrGroupRefused, fmt.Sprintf(format, args...))
}

// joins says whether req's run may join the group recorded by have: nil,
// or an error wrapping ErrGroupRefused that says why not.
func joins(have messages.GroupRecord, req messages.RunRequest) error {
	ref := req.GroupRef()
	if have.Creator == req.ID && kindOf(req) == have.Kind && req.GroupKey == have.Key {
		return nil // the creator again: a redelivery or a replay
	}
	switch {
	case have.Kind == messages.GroupOfRun:
		return refused("group %s is run %s's own (its request named no group): no other run joins it; name a group of your own", ref, have.Creator)
	case req.Group == "":
		return refused("run %s names no group, so its group is its own id, and group %s exists already (run %s created it): choose another run id", req.ID, ref, have.Creator)
	case have.Kind == messages.GroupKeyed && req.GroupKey == "":
		return refused("group %s has a key (run %s created it): a run joins it only with the group's key, its request signed by it (%s; jetcrew submit --group signs with the key it derives from its group secret)", ref, have.Creator, messages.HeaderGroupSignature)
	case have.Kind == messages.GroupKeyed && req.GroupKey != have.Key:
		return refused("group %s has another key than this request's (run %s created it): a run joins it only with the key of the group's creator (the same group secret)", ref, have.Creator)
	case have.Kind == messages.GroupKeyed:
		return nil
	case have.Kind == messages.GroupOpen && req.GroupKey != "":
		return refused("group %s has no key (run %s created it without one): a keyed request does not join it; name another group", ref, have.Creator)
	case have.Kind == messages.GroupOpen:
		return nil
	}
	return refused("group %s has a record of unknown kind %q: no run joins it", ref, have.Kind)
}

// verifyGroupSignature checks a keyed request (a group_key): its body names
// its run id, and messages.HeaderGroupSignature is the key's Ed25519
// signature of the body. A request without a key passes. The error wraps
// ErrGroupRefused; it never echoes the signature.
func verifyGroupSignature(a Admission) error {
	key := a.Request.GroupKey
	if key == "" {
		return nil
	}
	if a.BodyID == "" {
		return refused("a request with a group_key must name its run id in its body (\"id\"): without one, every copy of it published again would run under a new id")
	}
	sig64 := a.Header.Get(messages.HeaderGroupSignature)
	if sig64 == "" {
		return refused("the request names group_key %s and has no %s header: the key's seed must sign the body", key, messages.HeaderGroupSignature)
	}
	sig, err := base64.StdEncoding.DecodeString(sig64)
	if err != nil {
		return refused("%s is not standard base64", messages.HeaderGroupSignature)
	}
	kp, err := nkeys.FromPublicKey(key)
	if err != nil || !nkeys.IsValidPublicUserKey(key) {
		return refused("group_key %s is not an NKey user public key", key)
	}
	if err := kp.Verify(a.Body, sig); err != nil {
		return refused("the %s does not match the request body (tampered, or signed with another key than group_key)", messages.HeaderGroupSignature)
	}
	return nil
}
