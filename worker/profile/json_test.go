package profile

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// jsonKeys lists every key of Profile once, facets' included, and nothing
// else: a key missing from it would be encoded out of order.
func TestJSONKeysEveryKey(t *testing.T) {
	t.Parallel()
	var names []string
	for _, f := range keyFields(reflect.TypeFor[Profile](), nil) {
		names = append(names, f.jsonName())
	}
	require.ElementsMatch(t, jsonKeys, names)
	require.Len(t, slices.Compact(slices.Sorted(slices.Values(jsonKeys))), len(jsonKeys), "a key listed twice")
}

// A Profile encodes flat wherever it sits: alone, through a pointer, in a
// Description (whose own keys follow the profile's), or as a field of
// another value.
func TestProfileJSONFlat(t *testing.T) {
	t.Parallel()
	p := ShellProfile()
	alone, err := json.Marshal(p)
	require.NoError(t, err)
	viaPtr, err := json.Marshal(&p)
	require.NoError(t, err)
	require.Equal(t, string(alone), string(viaPtr))
	var m map[string]any
	require.NoError(t, json.Unmarshal(alone, &m))
	require.Equal(t, "shell", m["name"])
	require.Equal(t, SandboxImage, m["image"])
	require.NotContains(t, m, "JailConfig")

	nested, err := json.Marshal(struct{ P Profile }{p})
	require.NoError(t, err)
	require.Equal(t, `{"P":`+string(alone)+`}`, string(nested))

	d, err := p.Describe()
	require.NoError(t, err)
	desc, err := json.Marshal(d)
	require.NoError(t, err)
	require.Equal(t, string(alone[:len(alone)-1]), string(desc[:len(alone)-1]), "the profile's keys first")
	require.NoError(t, json.Unmarshal(desc, &m))
	require.Contains(t, m, "argv")

	var back Profile
	require.NoError(t, json.Unmarshal(alone, &back))
	require.Equal(t, p.Image, back.Image, "the flat encoding decodes into the facets")
}

// Digest encodes the profile through its flat layout: the cost a run
// pays when its receipt is written.
func BenchmarkDigest(b *testing.B) {
	ps, err := LoadProfiles(everyKeyFile)
	require.NoError(b, err)
	p := ps["every"]
	b.ReportAllocs()
	for b.Loop() {
		_ = p.Digest()
	}
}
