package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/jetcrew/jetcrew/messages"
)

// gate decides what a session's run may reach: its allowlist, the
// addresses no name leads to unless listed, the hosts it injects a key
// for (reached by their names only), and the hosts it asks an operator
// about (asker).
type gate struct {
	allow    policy.Policy
	inject   map[string]Injection // by "name:port"
	resolver Resolver
	own      []netip.Addr  // Config.OwnAddrs
	timeout  time.Duration // Config.DialTimeout, for each resolution
	ask      asker
}

// newGate returns the gate of a session allowing allow, injecting inject
// (by "name:port").
func newGate(cfg Config, allow policy.Policy, inject map[string]Injection) *gate {
	return &gate{allow: allow, inject: inject, resolver: cfg.Resolver, own: cfg.OwnAddrs, timeout: cfg.DialTimeout,
		ask: asker{max: cfg.MaxAsks}}
}

// injection returns the injection for host:port, if any.
func (g *gate) injection(host string, port int) (Injection, bool) {
	in, ok := g.inject[net.JoinHostPort(host, strconv.Itoa(port))]
	return in, ok
}

// resolve resolves host, within the gate's timeout.
func (g *gate) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return g.resolver.LookupNetIP(ctx, "ip", host)
}

// decide applies the policy to a requested host and port. It returns the
// normalised host and the address to connect to, or the refusal's reason.
//
// A name the allowlist does not list but the session's ask list does
// (AskFor) is put to the operator first: the connection waits for the
// answer, which ev.Decision records (ev may be nil).
func (g *gate) decide(ctx context.Context, host string, port int, ev *messages.EgressEvent) (string, netip.AddrPort, string) {
	host = normalizeHost(host)
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		if !g.allow.ListsAddr(a, port) {
			return host, netip.AddrPort{}, "an address literal is not in the profile's egress allowlist (list the name, or the address itself)"
		}
		return host, netip.AddrPortFrom(a, uint16(port)), ""
	}
	if !g.allow.AllowsName(host, port) {
		d, asked := g.ask.operator(ctx, host, port)
		if !asked {
			return host, netip.AddrPort{}, "not in the profile's egress allowlist"
		}
		if ev != nil {
			ev.Decision = d.String()
		}
		if !d.Allow {
			return host, netip.AddrPort{}, "asked: " + d.String()
		}
	}
	addrs, err := g.resolve(ctx, host)
	if err != nil || len(addrs) == 0 {
		return host, netip.AddrPort{}, fmt.Sprintf("does not resolve: %v", err)
	}
	reason := ""
	for _, a := range addrs {
		a = a.Unmap()
		why := blockedReason(a, g.own)
		if why == "" || g.allow.ListsAddr(a, port) {
			return host, netip.AddrPortFrom(a, uint16(port)), ""
		}
		if reason == "" {
			reason = fmt.Sprintf("resolves to %s (%s), which the profile does not list", why, a)
		}
	}
	return host, netip.AddrPort{}, reason
}

// meteredAddr refuses target, the checked address of a connection to a
// host the session does not inject a key for, when it is the address and
// port of one it does (resolved now): another name for a metered host would
// otherwise carry the run's model requests past the metering and its
// budgets (with a key the run brought itself). It returns the refusal's
// reason, or "".
func (g *gate) meteredAddr(ctx context.Context, target netip.AddrPort) string {
	for _, in := range g.inject {
		if in.Port != int(target.Port()) {
			continue
		}
		var addrs []netip.Addr
		if a, err := netip.ParseAddr(in.Name); err == nil {
			addrs = []netip.Addr{a}
		} else if addrs, err = g.resolve(ctx, in.Name); err != nil {
			continue
		}
		for _, a := range addrs {
			if a.Unmap() == target.Addr() {
				return fmt.Sprintf("the address of %s, a host the proxy meters: reach it by that name", in.Name)
			}
		}
	}
	return ""
}

// special lists the address ranges that are never reached through a name
// unless the profile lists them: they lead to the host, its neighbours or
// the cloud's metadata service rather than to a provider on the internet.
var special = []struct {
	pfx  netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (the cloud metadata service lives there)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "a protocol-assignment address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("224.0.0.0/3"), "a multicast or reserved address"},
	{netip.MustParsePrefix("::/128"), "an unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("fc00::/7"), "a private (unique local) address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// blockedReason returns why addr may not be reached unless listed ("a
// private address", "one of the host's own addresses"), or "" when it is an
// ordinary public address. own are the host's interface addresses.
func blockedReason(addr netip.Addr, own []netip.Addr) string {
	addr = addr.Unmap()
	for _, s := range special {
		if s.pfx.Contains(addr) {
			return s.what
		}
	}
	for _, o := range own {
		if o == addr {
			return "one of the host's own addresses"
		}
	}
	return ""
}

// ownAddrs returns the addresses of the host's network interfaces.
func ownAddrs() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, pfx.Addr().Unmap())
		}
	}
	return out
}
