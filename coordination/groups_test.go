package coordination_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/coordination/coordtest"
	"github.com/jetcrew/jetcrew/messages"
)

// groupKey returns a new NKey user key pair and its public key.
func groupKey(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	return kp, pub
}

// admission encodes req as a worker receives it: the body, and the group
// signature of the body by key when key is set (signed as published).
func admission(t *testing.T, req messages.RunRequest, key nkeys.KeyPair) coordination.Admission {
	t.Helper()
	body, err := json.Marshal(req)
	require.NoError(t, err)
	a := coordination.Admission{Request: req.WithDefaults(), BodyID: req.ID, Header: nats.Header{}, Body: body}
	if key != nil {
		sig, err := key.Sign(body)
		require.NoError(t, err)
		a.Header.Set(messages.HeaderGroupSignature, base64.StdEncoding.EncodeToString(sig))
	}
	return a
}

// The first run of a group records who may join it; later runs join only
// as the record allows, whatever their order, and a refusal says why.
func TestGroupAdmission(t *testing.T) {
	t.Parallel()
	_, _, js := coordtest.Provisioned(t)
	g := coordination.NewGroups(js)
	owner, ownerPub := groupKey(t)
	other, otherPub := groupKey(t)
	keyed := func(id, pool string, kp nkeys.KeyPair, pub string) coordination.Admission {
		return admission(t, messages.RunRequest{ID: id, Profile: "shell", Pool: pool, Group: "crew", GroupKey: pub}, kp)
	}
	admit := func(a coordination.Admission) error { return g.Admit(t.Context(), a) }

	require.NoError(t, admit(keyed("crew-1", "", owner, ownerPub)), "the first run creates the keyed group")
	require.NoError(t, admit(keyed("crew-2", "", owner, ownerPub)), "the same key joins")
	require.NoError(t, admit(keyed("crew-1", "", owner, ownerPub)), "the creator again: a redelivery")

	for name, tc := range map[string]struct {
		a    coordination.Admission
		want string
	}{
		"another key":  {keyed("crew-3", "", other, otherPub), "has another key"},
		"no key":       {admission(t, messages.RunRequest{ID: "crew-3", Profile: "shell", Group: "crew"}, nil), "has a key"},
		"key, no sig":  {keyed("crew-3", "", nil, ownerPub), "no Jetcrew-Group-Signature"},
		"key, own sig": {keyed("crew-3", "", other, ownerPub), "does not match"},
		"derived id":   {func() coordination.Admission { a := keyed("crew-3", "", owner, ownerPub); a.BodyID = ""; return a }(), "must name its run id"},
		"not base64": {func() coordination.Admission {
			a := keyed("crew-3", "", owner, ownerPub)
			a.Header.Set(messages.HeaderGroupSignature, "!")
			return a
		}(), "not standard base64"},
		"tampered body": {func() coordination.Admission {
			a := keyed("crew-3", "", owner, ownerPub)
			a.Body = append(a.Body, ' ')
			return a
		}(), "does not match"},
	} {
		err := admit(tc.a)
		require.ErrorIs(t, err, coordination.ErrGroupRefused, name)
		require.ErrorContains(t, err, tc.want, name)
	}

	// The same name in another pool is another group: the other key
	// creates it there.
	require.NoError(t, admit(keyed("gpu-crew-1", "gpu", other, otherPub)))
	require.ErrorIs(t, admit(keyed("gpu-crew-2", "gpu", owner, ownerPub)), coordination.ErrGroupRefused)

	kv, err := js.KeyValue(t.Context(), coordination.BucketGroups)
	require.NoError(t, err)
	e, err := kv.Get(t.Context(), "default.crew")
	require.NoError(t, err)
	var rec messages.GroupRecord
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	require.Equal(t, messages.GroupRecord{Pool: "default", Group: "crew", Kind: messages.GroupKeyed, Key: ownerPub, Creator: "crew-1", Created: rec.Created}, rec)
}

// A run that names no group is alone in a group of its own, admitted
// without a record: a group a request names after the run's id is another
// group, with subjects and keys of its own, and a request naming its own
// id as its group is refused.
func TestOwnGroup(t *testing.T) {
	t.Parallel()
	_, _, js := coordtest.Provisioned(t)
	g := coordination.NewGroups(js)
	kp, pub := groupKey(t)
	solo := admission(t, messages.RunRequest{ID: "solo", Profile: "shell"}, nil)
	require.NoError(t, g.Admit(t.Context(), solo))
	named := admission(t, messages.RunRequest{ID: "intruder", Profile: "shell", Group: "solo", GroupKey: pub}, kp)
	require.NoError(t, g.Admit(t.Context(), named), "a named group of the run's id is another group")
	own, other := solo.Request.GroupRef(), named.Request.GroupRef()
	require.True(t, own.Own)
	require.Equal(t, "default.=solo", own.Key())
	require.Equal(t, "default.solo", other.Key())
	require.NotEqual(t, coordination.Subject(own, "solo"), coordination.Subject(other, "solo"))
	require.NotEqual(t, coordination.PeerKey(own, "solo"), coordination.PeerKey(other, "solo"))
	back, err := messages.ParseGroupKey(own.Key())
	require.NoError(t, err)
	require.Equal(t, own, back)

	kv, err := js.KeyValue(t.Context(), coordination.BucketGroups)
	require.NoError(t, err)
	keys, err := kv.Keys(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"default.solo"}, keys, "a run's own group has no record")

	// A request naming its own id as its group is alone too (a derived
	// id equal to the group included).
	self := admission(t, messages.RunRequest{ID: "self", Profile: "shell"}, nil)
	self.Request.Group = "self"
	require.True(t, self.Request.GroupRef().Own)
	require.NoError(t, g.Admit(t.Context(), self))
	keys, err = kv.Keys(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"default.solo"}, keys)
}

// A group created without a key (an older client) stays open to requests
// without one, and refuses keyed requests.
func TestOpenGroup(t *testing.T) {
	t.Parallel()
	_, _, js := coordtest.Provisioned(t)
	g := coordination.NewGroups(js)
	kp, pub := groupKey(t)
	require.NoError(t, g.Admit(t.Context(), admission(t, messages.RunRequest{ID: "o1", Profile: "shell", Group: "open"}, nil)))
	require.NoError(t, g.Admit(t.Context(), admission(t, messages.RunRequest{ID: "o2", Profile: "shell", Group: "open"}, nil)))
	err := g.Admit(t.Context(), admission(t, messages.RunRequest{ID: "o3", Profile: "shell", Group: "open", GroupKey: pub}, kp))
	require.ErrorIs(t, err, coordination.ErrGroupRefused)
	require.ErrorContains(t, err, "has no key")
}

// Many first runs of one group at once, each with its own key: exactly one
// creates the group, and every other is refused.
func TestGroupFirstWriterWins(t *testing.T) {
	t.Parallel()
	_, _, js := coordtest.Provisioned(t)
	g := coordination.NewGroups(js)
	const n = 16
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		kp, pub := groupKey(t)
		a := admission(t, messages.RunRequest{ID: fmt.Sprintf("race-%d", i), Profile: "shell", Group: "race", GroupKey: pub}, kp)
		wg.Go(func() { errs[i] = g.Admit(t.Context(), a) })
	}
	wg.Wait()
	admitted := 0
	for _, err := range errs {
		if err == nil {
			admitted++
			continue
		}
		require.ErrorIs(t, err, coordination.ErrGroupRefused)
	}
	require.Equal(t, 1, admitted)
}

// Without its bucket Admit returns NATS's error, not a refusal: the worker
// retries such a run rather than failing it.
func TestGroupAdmitNoBucket(t *testing.T) {
	t.Parallel()
	s := coordtest.StartServer(t)
	js, err := jetstream.New(coordtest.Connect(t, s))
	require.NoError(t, err)
	err = coordination.NewGroups(js).Admit(t.Context(), admission(t, messages.RunRequest{ID: "r1", Profile: "shell", Group: "crew"}, nil))
	require.Error(t, err)
	require.NotErrorIs(t, err, coordination.ErrGroupRefused)
}

// BenchmarkGroupAdmit measures a run's admission to its group: a keyed
// group's first run (a read that misses, then the create), a later run of
// it (one read, the signature checked) and a run alone (no I/O).
func BenchmarkGroupAdmit(b *testing.B) {
	_, _, js := coordtest.Provisioned(b)
	g := coordination.NewGroups(js)
	kp, err := nkeys.CreateUser()
	require.NoError(b, err)
	pub, err := kp.PublicKey()
	require.NoError(b, err)
	keyed := func(id, group string) coordination.Admission {
		req := messages.RunRequest{ID: id, Profile: "shell", Group: group, GroupKey: pub}
		body, err := json.Marshal(req)
		require.NoError(b, err)
		sig, err := kp.Sign(body)
		require.NoError(b, err)
		h := nats.Header{}
		h.Set(messages.HeaderGroupSignature, base64.StdEncoding.EncodeToString(sig))
		return coordination.Admission{Request: req.WithDefaults(), BodyID: id, Header: h, Body: body}
	}
	b.Run("first", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			require.NoError(b, g.Admit(context.Background(), keyed(fmt.Sprint("f-", i), fmt.Sprint("first-", i))))
		}
	})
	b.Run("join", func(b *testing.B) {
		require.NoError(b, g.Admit(context.Background(), keyed("j-0", "joined")))
		a := keyed("j-1", "joined")
		for b.Loop() {
			require.NoError(b, g.Admit(context.Background(), a))
		}
	})
	b.Run("alone", func(b *testing.B) {
		a := coordination.Admission{Request: messages.RunRequest{ID: "solo", Profile: "shell"}.WithDefaults(), BodyID: "solo"}
		for b.Loop() {
			require.NoError(b, g.Admit(context.Background(), a))
		}
	})
}
