package policy

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParsePolicy: bad entries are refused; names match case-insensitively
// without their trailing dot, a wildcard only below its suffix, an
// address rule the addresses inside it; a rule prints as written.
func TestParsePolicy(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"api.example.com", "api.example.com:0", "*.com:443", "a*b.com:443", "x:99999", ":443", "*:443"} {
		_, err := Parse([]string{bad})
		require.Error(t, err, bad)
	}
	p := Must("API.Example.com.:443", "*.googleapis.com:443", "10.0.0.0/8:443", "[::1]:8080")
	require.True(t, p.AllowsName("api.example.com", 443))
	require.False(t, p.AllowsName("api.example.com", 80))
	require.True(t, p.AllowsName("a.b.googleapis.com", 443))
	require.False(t, p.AllowsName("googleapis.com", 443))
	require.False(t, p.AllowsName("evilgoogleapis.com", 443))
	require.True(t, p.ListsAddr(netip.MustParseAddr("10.9.9.9"), 443))
	require.True(t, p.ListsAddr(netip.MustParseAddr("::1"), 8080))
	require.False(t, p.ListsAddr(netip.MustParseAddr("11.0.0.1"), 443))
	require.Equal(t, "10.0.0.0/8:443", p.Rules()[2].String())
}
