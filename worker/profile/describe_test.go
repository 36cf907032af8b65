package profile

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// everyKeyFile is a profile file whose profile "every" sets every key.
const everyKeyFile = "testdata/every-key.toml"

// loadEveryKey parses everyKeyFile.
func loadEveryKey(t *testing.T) Profiles {
	t.Helper()
	ps, err := LoadProfiles(everyKeyFile)
	require.NoError(t, err)
	return ps
}

// A profile's JSON encoding is what `jetcrew profiles check` prints and
// what its digest (a receipt's ProfileDigest) hashes: both stay
// byte-identical whatever the Go layout of Profile, the order of the keys
// included.
func TestDescribeGolden(t *testing.T) {
	t.Parallel()
	ps := loadEveryKey(t)
	var got bytes.Buffer
	for _, name := range ps.Names() {
		d, err := ps[name].Describe()
		require.NoError(t, err, name)
		b, err := json.MarshalIndent(d, "", "  ")
		require.NoError(t, err)
		fmt.Fprintf(&got, "# profile %s\n%s\n# digest %s\n", name, b, ps[name].Digest())
	}
	const path = "testdata/describe.golden"
	if *update {
		require.NoError(t, os.WriteFile(path, got.Bytes(), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), got.String())
}

// The fixture of TestDescribeGolden sets every profile key, so that a key
// added to Profile is pinned there too.
func TestEveryKeyFixtureSetsEveryKey(t *testing.T) {
	t.Parallel()
	var f struct {
		Profiles map[string]map[string]any `toml:"profiles"`
	}
	_, err := toml.DecodeFile(everyKeyFile, &f)
	require.NoError(t, err)
	for k := range profileKeys() {
		require.Contains(t, f.Profiles["every"], k, "testdata/every-key.toml's profile every does not set %s", k)
	}
	require.Len(t, f.Profiles["every"], len(profileKeys()))
}

// keyLine is a "key = value" line of the fixture.
var keyLine = regexp.MustCompile(`(?m)^([a-z_]+) = `)

// Every key is matched exactly: the same key in upper case, which the TOML
// decoder would match, is refused and named, whatever facet holds it.
func TestExactKeysEveryKey(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(everyKeyFile)
	require.NoError(t, err)
	every, _, _ := strings.Cut(string(data), "[profiles.claude]")
	var seen []string
	for _, m := range keyLine.FindAllStringSubmatchIndex(every, -1) {
		key := every[m[2]:m[3]]
		seen = append(seen, key)
		doc := every[:m[2]] + strings.ToUpper(key) + every[m[3]:]
		_, err := ParseProfiles("upper.toml", []byte(doc))
		require.ErrorContains(t, err, fmt.Sprintf("profile %q: key %q is not a profile key", "every", strings.ToUpper(key)), key)
	}
	for k := range profileKeys() {
		require.True(t, slices.Contains(seen, k), "key %s not tried", k)
	}
}

// Resolve is idempotent: a resolved profile resolves to itself, so a
// value resolved at load is final.
func TestResolveIdempotent(t *testing.T) {
	t.Parallel()
	for name, p := range loadEveryKey(t) {
		again, err := p.Resolve()
		require.NoError(t, err, name)
		require.Equal(t, p, again, name)
	}
}
