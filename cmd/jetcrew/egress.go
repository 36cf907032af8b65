package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/messages"
)

// hostServicePorts returns the TCP ports of the host's services a jailed run
// must never reach: the NATS server's (from the worker's connected URL) and
// the worker's metrics listener's. The worker's egress proof checks that
// its probe container reaches neither on any of the host's addresses.
func hostServicePorts(natsURL, metricsAddr string) []int {
	var ports []int
	if u, err := url.Parse(natsURL); err == nil {
		if p, err := strconv.Atoi(u.Port()); err == nil {
			ports = append(ports, p)
		}
	}
	if _, p, err := net.SplitHostPort(metricsAddr); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n > 0 {
			ports = append(ports, n)
		}
	}
	return ports
}

// printEgress prints a refused egress attempt as a lifecycle line ("---
// egress refused: CONNECT evil.example:443: not in the profile's egress
// allowlist", or only the reason for a connection refused before its
// request was read), and an allowed one whose host could not be reached or
// did not answer ("--- egress upstream failed: POST api.anthropic.com:443:
// upstream certificate not trusted: …"); other allowed attempts print
// nothing. The method, host and reason are the run's choice, so shown
// escaped (visibleName).
func (p *runPrinter) printEgress(ev dispatcher.WatchEvent) error {
	var e messages.EgressEvent
	if err := json.Unmarshal(ev.Data, &e); err != nil || (e.Allowed && !e.UpstreamFailed()) {
		return nil
	}
	what := "egress refused"
	if e.Allowed {
		what = "egress upstream failed"
	}
	line := fmt.Sprintf("--- %s: %s %s: %s", what, visibleName(e.Method),
		visibleName(net.JoinHostPort(e.Host, strconv.Itoa(e.Port))), visibleName(e.Reason))
	if e.Method == "" && e.Host == "" {
		line = "--- " + what + ": " + visibleName(e.Reason)
	}
	if !p.atLineStart {
		line = "\n" + line
		p.atLineStart = true
	}
	_, err := fmt.Fprintln(p.stderr, line)
	return err
}

// addEgressFlags adds the worker's egress flags.
func (o *workerOptions) addEgressFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.egressCADir, "egress-ca-dir", "",
		"directory of the installation's egress CA, for profiles with egress_inject (default: <user config dir>/jetcrew/egress-ca/<installation>)")
	fs.StringArrayVar(&o.egressCAs, "egress-ca", nil,
		"a PEM file of CA certificates the egress proxy trusts, besides the system's, for the egress_inject hosts it connects to (such as a company proxy's CA in front of a provider); repeatable")
}

// checkEgress loads the --egress-ca files into the upstream roots; a file
// that cannot be read or holds no certificate is a usage error.
func (o *workerOptions) checkEgress() error {
	roots, err := egress.UpstreamRoots(o.egressCAs...)
	if err != nil {
		return usageError(fmt.Errorf("--egress-ca: %w", err))
	}
	o.egressRoots = roots
	return nil
}
