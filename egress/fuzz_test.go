package egress

import (
	"context"
	"net/netip"
	"testing"

	"github.com/jetcrew/jetcrew/egress/policy"
)

// FuzzDecide feeds the CONNECT target an agent chooses to the policy: it
// never panics, and whatever it lets through is listed (by name, or by
// address for a literal) and resolves to an address it may reach.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{"api.example.com:443", "API.EXAMPLE.COM.:443", "x.wild.example.org:443", "169.254.169.254:80",
		"[::1]:443", "10.0.0.1:443", "api.example.com", ":443", "a:b:c", "[fe80::1%eth0]:443", "*.example.org:443"} {
		f.Add(s)
	}
	res := table{
		"api.example.com":       {netip.MustParseAddr("93.184.216.34")},
		"x.wild.example.org":    {netip.MustParseAddr("127.0.0.1")},
		"meta.wild.example.org": {netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("93.184.216.35")},
	}
	g := newGate(Config{Resolver: res}.withDefaults(), policy.Must("api.example.com:443", "*.wild.example.org:443", "10.0.0.0/8:443"), nil)
	f.Fuzz(func(t *testing.T, hostport string) {
		host, port, err := splitHostPort(hostport, 0)
		if err != nil {
			return
		}
		name, target, reason := g.decide(context.Background(), host, port, nil)
		if reason != "" {
			return
		}
		if !target.IsValid() || int(target.Port()) != port {
			t.Fatalf("%q allowed with target %v", hostport, target)
		}
		if _, err := netip.ParseAddr(name); err == nil {
			if !g.allow.ListsAddr(target.Addr(), port) {
				t.Fatalf("literal %q allowed but not listed", hostport)
			}
			return
		}
		if !g.allow.AllowsName(name, port) {
			t.Fatalf("%q allowed but not listed", hostport)
		}
		if blockedReason(target.Addr(), g.own) != "" && !g.allow.ListsAddr(target.Addr(), port) {
			t.Fatalf("%q allowed to blocked address %v", hostport, target)
		}
	})
}
