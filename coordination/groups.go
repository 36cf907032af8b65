package coordination

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
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
// named group records who may join it (a messages.GroupRecord in BucketGroups,
// created with a compare-and-set against no key, so the first writer
// wins), and every later run must match that record. Create it with
// NewGroups; it is safe for concurrent use.
type Groups struct {
	js jetstream.JetStream
	kv kvBucket // BucketGroups, looked up by the first Admit
}

// NewGroups returns a Groups recording in js's BucketGroups, which must
// exist (Provision) before the first Admit. It does no I/O.
func NewGroups(js jetstream.JetStream) *Groups {
	return &Groups{js: js, kv: kvBucket{name: BucketGroups}}
}

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
// run that names no group (or its own id) is alone in its own group, which
// no request can name: it is admitted without a read. A keyed request
// (group_key) must name its run id and carry the body's signature by the
// key. A named
// group's first run creates the group's record: a keyed request a keyed
// group, any other an open one; a later run joins only a record it
// matches, a keyed group with the same key, an open group without one. A
// redelivery or a replay of a run matches as its first delivery did, so
// Admit is idempotent by run id.
func (g *Groups) Admit(ctx context.Context, a Admission) error {
	req := a.Request
	ref := req.GroupRef()
	if ref.Own {
		return nil
	}
	if err := verifyGroupSignature(a); err != nil {
		return err
	}
	kv, err := g.kv.get(ctx, g.js)
	if err != nil {
		return err
	}
	// Most runs join a group that exists (the attempts after the first):
	// one read. The create decides between first runs at once.
	have, err := readRecord(ctx, kv, ref)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		var created bool
		if have, created, err = createRecord(ctx, kv, req); created {
			return nil
		}
	}
	if err != nil {
		return err
	}
	return joins(have, req)
}

// createRecord creates the record of req's group, as its first run: it
// reports created when this run's create won, and returns otherwise the
// record another run's create won with (readCreated).
func createRecord(ctx context.Context, kv jetstream.KeyValue, req messages.RunRequest) (have messages.GroupRecord, created bool, err error) {
	ref := req.GroupRef()
	rec := messages.GroupRecord{Pool: ref.Pool, Group: ref.Name, Kind: kindOf(req), Key: req.GroupKey, Creator: req.ID, Created: time.Now().UTC()}
	data, err := json.Marshal(rec)
	if err != nil {
		return have, false, err
	}
	_, err = kv.Create(ctx, ref.Key(), data)
	switch {
	case err == nil:
		return rec, true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		have, err = readCreated(ctx, kv, ref)
		return have, false, err
	}
	return have, false, fmt.Errorf("record group %s: %w", ref, err)
}

// readCreated reads group ref's record, which another run's create won an
// instant ago: on a cluster a read may be served by a replica that has not
// stored it yet (the bucket allows direct gets), so a record not found is
// read again, for up to createdReadWait.
func readCreated(ctx context.Context, kv jetstream.KeyValue, ref messages.GroupRef) (messages.GroupRecord, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 5*time.Millisecond, 100*time.Millisecond, createdReadWait
	var rec messages.GroupRecord
	err := backoff.Retry(func() error {
		var err error
		rec, err = readRecord(ctx, kv, ref)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx))
	return rec, err
}

// createdReadWait bounds readCreated.
const createdReadWait = 2 * time.Second

// readRecord reads group ref's record: the error wraps
// jetstream.ErrKeyNotFound when there is none, ErrGroupRefused when it
// cannot be decoded.
func readRecord(ctx context.Context, kv jetstream.KeyValue, ref messages.GroupRef) (messages.GroupRecord, error) {
	var rec messages.GroupRecord
	e, err := kv.Get(ctx, ref.Key())
	if err != nil {
		return rec, fmt.Errorf("read the record of group %s: %w", ref, err)
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return rec, refused("group %s: its record in %s is unreadable (%v): no run joins it", ref, BucketGroups, err)
	}
	return rec, nil
}

// kindOf is the kind of group req's run would create.
func kindOf(req messages.RunRequest) messages.GroupKind {
	if req.GroupKey != "" {
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
	switch {
	case have.Kind == messages.GroupKeyed && req.GroupKey == have.Key:
		return nil
	case have.Kind == messages.GroupKeyed && req.GroupKey == "":
		return refused("group %s has a key (run %s created it): a run joins it only with the group's key, its request signed by it (%s; jetcrew submit --group signs with the key it derives from its group secret)", ref, have.Creator, messages.HeaderGroupSignature)
	case have.Kind == messages.GroupKeyed:
		return refused("group %s has another key than this request's (run %s created it): a run joins it only with the key of the group's creator (the same group secret)", ref, have.Creator)
	case have.Kind == messages.GroupOpen && req.GroupKey == "":
		return nil
	case have.Kind == messages.GroupOpen:
		return refused("group %s has no key (run %s created it without one): a keyed request does not join it; name another group", ref, have.Creator)
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
