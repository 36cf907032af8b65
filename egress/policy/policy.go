package policy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one entry of a profile's egress allowlist: a host pattern and a
// port.
type Rule struct {
	// Name is a lowercase DNS name, or a suffix (without the dot) when
	// Wildcard is set. Empty for an address rule.
	Name string
	// Wildcard is true for "*.example.com": any name with at least one more
	// label before the suffix matches; the suffix itself does not.
	Wildcard bool
	// Prefix is set for an address rule ("10.1.2.3:443", "10.0.0.0/8:443"):
	// CONNECT to a literal address inside it, and names resolving inside it,
	// are allowed although the address is private, loopback, link-local or
	// the host's own.
	Prefix netip.Prefix
	// Port is the TCP port, 1 to 65535.
	Port int
}

// String returns the rule as written in a profile.
func (r Rule) String() string {
	host := r.Name
	switch {
	case r.Wildcard:
		host = "*." + r.Name
	case r.Prefix.IsValid() && r.Prefix.IsSingleIP():
		host = r.Prefix.Addr().String()
	case r.Prefix.IsValid():
		host = r.Prefix.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(r.Port))
}

// Policy is a run's egress allowlist. The zero Policy allows nothing.
type Policy struct {
	rules []Rule
}

// Parse parses a profile's allowlist entries (keys egress, egress_ask) into a
// Policy. An entry is "name:port", "*.suffix:port", "address:port" or
// "cidr:port" ("[v6]:port" for IPv6). It returns an error naming the first
// bad entry. Names are compared case-insensitively; a trailing dot is
// dropped.
func Parse(entries []string) (Policy, error) {
	var p Policy
	for _, e := range entries {
		r, err := parseRule(e)
		if err != nil {
			return Policy{}, fmt.Errorf("egress entry %q: %w", e, err)
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// Must is Parse for entries known to be valid; it panics on a bad entry.
// For tests and built-in policies.
func Must(entries ...string) Policy {
	p, err := Parse(entries)
	if err != nil {
		panic(err)
	}
	return p
}

// Rules returns the policy's rules.
func (p Policy) Rules() []Rule { return append([]Rule(nil), p.rules...) }

func parseRule(e string) (Rule, error) {
	host, portS, err := net.SplitHostPort(e)
	if err != nil {
		// A CIDR's slash is not a port separator: "10.0.0.0/8:443".
		i := strings.LastIndexByte(e, ':')
		if i < 0 {
			return Rule{}, errors.New("want host:port")
		}
		host, portS = e[:i], e[i+1:]
	}
	port, err := strconv.Atoi(portS)
	if err != nil || port < 1 || port > 65535 {
		return Rule{}, fmt.Errorf("port %q must be a number from 1 to 65535", portS)
	}
	r := Rule{Port: port}
	if pfx, err := netip.ParsePrefix(host); err == nil {
		r.Prefix = pfx.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		r.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		return r, nil
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		r.Wildcard, name = true, rest
	}
	if err := checkName(name); err != nil {
		return Rule{}, err
	}
	if r.Wildcard && !strings.Contains(name, ".") {
		return Rule{}, fmt.Errorf("wildcard *.%s would match a whole top-level domain", name)
	}
	r.Name = name
	return r, nil
}

// checkName accepts a DNS name of letters, digits, hyphens and dots, with
// no empty label and no wildcard left in it.
func checkName(name string) error {
	if name == "" || len(name) > 253 {
		return errors.New("name is empty or longer than 253 bytes")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("name %q has an empty or over-long label", name)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("name %q: %q is not allowed (a wildcard only as the whole first label)", name, c)
			}
		}
	}
	return nil
}

// AllowsName reports whether a name rule lists host:port. host must be
// normalised (lowercase, no trailing dot), as Parse normalises names.
func (p Policy) AllowsName(host string, port int) bool {
	for _, r := range p.rules {
		if r.Port != port || r.Name == "" {
			continue
		}
		if !r.Wildcard && host == r.Name {
			return true
		}
		if r.Wildcard && strings.HasSuffix(host, "."+r.Name) {
			return true
		}
	}
	return false
}

// ListsAddr reports whether an address rule covers addr:port: the profile
// lists that address explicitly.
func (p Policy) ListsAddr(addr netip.Addr, port int) bool {
	addr = addr.Unmap()
	for _, r := range p.rules {
		if r.Port == port && r.Prefix.IsValid() && r.Prefix.Contains(addr) {
			return true
		}
	}
	return false
}
