// Package egress is the egress proxy of runs whose profile lists what they
// may reach (profile key egress). Each such run gets a Session: an HTTP proxy
// served on a unix socket in the run's own directory, which the run's
// container (network "none": loopback only) reaches through a relay the
// launcher starts on 127.0.0.1. The socket is the run's identity.
//
// The HTTP mechanics (CONNECT, plain-HTTP forwarding) are
// github.com/elazarl/goproxy's; the policy is ours: only listed name:port
// pairs; names resolved here and the checked address dialled; address
// literals and names resolving to loopback, link-local (169.254.169.254),
// private, shared or the host's own addresses refused unless the profile
// lists the address; a tunnel's TLS ClientHello must name (SNI) the CONNECT
// host. Every attempt, allowed or refused, is a messages.EgressEvent.
//
// What a run can make the worker hold through its socket is bounded
// (Config.MaxConns, RequestReadTimeout, IdleTimeout and their defaults):
// connections past the cap are answered 429 and closed at once, through
// the limiter the coordination socket uses (internal/connlimit); a request
// must be read whole in time; a connection moving no byte is closed; and no
// upstream connection outlives the run's connection it serves.
//
// The allowlist and the unmetered paths a profile gives (policy.Policy,
// policy.UnmeteredPaths) are package egress/policy's, a leaf that
// profiles and the stage contract import without this package. A Session
// composes one part per concern, each in its own file: its events
// (events.go), its policy and the operator's answers (gate.go, ask.go),
// its forwarding, tunnels and injected hosts (forward.go, tunnel.go,
// inject.go), its metering (meter.go: admission in admit.go and
// reserve.go, settlement in settle.go, what it counts and holds in
// budget.go) and the run's connections (conn.go).
//
// A request is decided and sent upstream in the context of the run's
// connection (it ends when the connection closes), not in the request's own,
// which Go's server cancels when the run half-closes the connection after
// its request (golang/go#18527), as the launcher's relay does.
package egress
