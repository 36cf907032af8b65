package messages_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// exampleGroupKey is an NKey user public key (of the all-zero seed).
const exampleGroupKey = "UA5WUJ54Z23KILLCUOUNAKTPBVZWKMQVO4O6EQ5GHLAERIMLLHNCTYM5"

// A group is its pool and its name: the key of its subjects and buckets
// holds both, and reads back.
func TestGroupRef(t *testing.T) {
	t.Parallel()
	r := messages.RunRequest{ID: "r1", Profile: "shell"}
	own := r.GroupRef()
	require.Equal(t, messages.GroupRef{Pool: "default", Name: "r1", Own: true}, own, "no pool, no group: the run's own group in the default pool")
	require.Equal(t, "default.=r1", own.Key(), "marked: no request names it")
	back, err := messages.ParseGroupKey(own.Key())
	require.NoError(t, err)
	require.Equal(t, own, back)
	r.Group = "r1"
	require.Equal(t, own, r.GroupRef(), "a request naming its own id as its group is alone")
	require.Empty(t, r.WithDefaults().Group)
	got, err := messages.DecodeRunRequest([]byte(`{"id":"r1","profile":"shell","group":"r1"}`))
	require.NoError(t, err)
	require.Empty(t, got.Group, "decoded as the run's own group")
	r.Pool, r.Group = "gpu", "crew"
	g := r.GroupRef()
	require.Equal(t, "gpu.crew", g.Key())
	require.Equal(t, "crew of pool gpu", g.String())
	back, err = messages.ParseGroupKey(g.Key())
	require.NoError(t, err)
	require.Equal(t, g, back)
	for _, bad := range []string{"crew", "gpu.", ".crew", "gpu.all", "gpu.cr.ew", "g*.crew", "gpu.=", "gpu.==r1"} {
		_, err := messages.ParseGroupKey(bad)
		require.Error(t, err, bad)
	}
	require.Error(t, messages.GroupRef{Pool: "gpu"}.Validate())
}

// group_key is an NKey user public key, on a request that names its group.
func TestRunRequestGroupKey(t *testing.T) {
	t.Parallel()
	ok := messages.RunRequest{ID: "r1", Profile: "shell", Group: "crew", GroupKey: exampleGroupKey}
	require.NoError(t, ok.Validate())
	for name, r := range map[string]messages.RunRequest{
		"no group":   {ID: "r1", Profile: "shell", GroupKey: exampleGroupKey},
		"short":      {ID: "r1", Profile: "shell", Group: "crew", GroupKey: exampleGroupKey[:55]},
		"seed":       {ID: "r1", Profile: "shell", Group: "crew", GroupKey: "S" + exampleGroupKey[1:]},
		"lower case": {ID: "r1", Profile: "shell", Group: "crew", GroupKey: "U" + "a" + exampleGroupKey[2:]},
	} {
		err := r.Validate()
		require.Error(t, err, name)
		require.True(t, errors.Is(err, messages.ErrInvalidRequest), name)
		require.Contains(t, err.Error(), "group_key", name)
	}
	got, err := messages.DecodeRunRequest([]byte(`{"id":"r1","profile":"shell","group":"crew","group_key":"` + exampleGroupKey + `"}`))
	require.NoError(t, err)
	require.Equal(t, exampleGroupKey, got.GroupKey)
}
