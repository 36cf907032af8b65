package profile

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// egress_unmetered_paths is parsed when the profile is loaded: entries of
// "[METHOD ]PATH", on a profile with egress_inject only.
func TestEgressUnmeteredPaths(t *testing.T) {
	t.Parallel()
	const base = "[profiles.x]\nimage='i'\ncommand=['a']\negress=['api.example.com:443']\n"
	const inject = "egress_inject=[{host='api.example.com:443', header='x-api-key', from_env='K'}]\n"
	ps, err := ParseProfiles("ok.toml", []byte(base+inject+"egress_unmetered_paths=['POST /v1/embeddings', '/v1/files/*']\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"POST /v1/embeddings", "/v1/files/*"}, ps["x"].EgressUnmetered().Entries())
	for name, doc := range map[string]string{
		"no inject":      base + "egress_unmetered_paths=['/v1/embeddings']\n",
		"bad method":     base + inject + "egress_unmetered_paths=['FETCH /v1/embeddings']\n",
		"relative":       base + inject + "egress_unmetered_paths=['v1/embeddings']\n",
		"dot segment":    base + inject + "egress_unmetered_paths=['/v1/../embeddings']\n",
		"query":          base + inject + "egress_unmetered_paths=['/v1/embeddings?x=1']\n",
		"inner wildcard": base + inject + "egress_unmetered_paths=['/v1/*/content']\n",
		"encoded":        base + inject + "egress_unmetered_paths=['/v1/a%2Fb']\n",
	} {
		_, err := ParseProfiles("bad.toml", []byte(doc))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "egress_unmetered_paths", name)
	}
}

// egress_rate is checked when the profile is loaded: rates not negative,
// one set, on a profile with egress_inject.
func TestEgressRate(t *testing.T) {
	t.Parallel()
	const base = "[profiles.x]\nimage='i'\ncommand=['a']\negress=['api.example.com:443']\n"
	const inject = "egress_inject=[{host='api.example.com:443', header='x-api-key', from_env='K'}]\n"
	ps, err := ParseProfiles("ok.toml", []byte(base+inject+"egress_rate={requests_per_minute=500, tokens_per_minute=400000}\n"))
	require.NoError(t, err)
	require.Equal(t, &EgressRate{RequestsPerMinute: 500, TokensPerMinute: 400000}, ps["x"].EgressRate)
	for name, doc := range map[string]string{
		"no inject": base + "egress_rate={requests_per_minute=5}\n",
		"negative":  base + inject + "egress_rate={requests_per_minute=-5}\n",
		"none set":  base + inject + "egress_rate={}\n",
		"unknown":   base + inject + "egress_rate={rpm=5}\n",
	} {
		_, err := ParseProfiles("bad.toml", []byte(doc))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "bad.toml", name)
	}
}
