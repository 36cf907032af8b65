package egress

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/jetcrew/jetcrew/egress/policy"
)

// Decision is an operator's answer to a connection of the run to a host
// of its ask list (AskFor): allowed or denied, by whom, and for what
// scope ("run": this run's connections to the host from now on; "profile":
// every run of the profile from now on, which the asker keeps). A zero
// Decision with TimedOut set is no answer in time: refused, and asked again
// next time.
type Decision struct {
	Allow bool
	// By names who decided, as the deciding client said it.
	By string
	// Scope is "run" or "profile".
	Scope string
	// Profile is the profile's name, for a profile-wide decision.
	Profile string
	// TimedOut is set when no operator answered in time; Wait is how long
	// the connection waited.
	TimedOut bool
	Wait     string
	// Refused, when set, is why the question was not put (the run's
	// Config.MaxAsks): the connection is refused.
	Refused string
}

// String says the decision as an egress event records it.
func (d Decision) String() string {
	if d.Refused != "" {
		return "not asked: " + d.Refused
	}
	if d.TimedOut {
		return "no answer within " + d.Wait
	}
	verb := "denied"
	if d.Allow {
		verb = "allowed"
	}
	scope := "for the run"
	if d.Scope == "profile" {
		scope = "for profile " + d.Profile
	}
	return fmt.Sprintf("%s by %s %s", verb, d.By, scope)
}

// AskFunc puts a connection of the run to host:port to an operator and
// blocks until the answer, or ctx (the run's connection) ends, or the
// asker's timeout: then it returns a Decision with TimedOut.
type AskFunc func(ctx context.Context, host string, port int) Decision

// asker is a session's ask list and the answers it had for this run.
type asker struct {
	max   int // Config.MaxAsks
	mu    sync.Mutex
	hosts policy.Policy
	ask   AskFunc
	// answers are the run's decisions by "host:port"; concurrent
	// connections to one host wait for the one asking (pending).
	answers map[string]Decision
	pending map[string]chan struct{}
	// asked counts the questions put (Config.MaxAsks bounds it).
	asked int
}

// AskFor sets the hosts (entries as in the allowlist: "name:port",
// "*.suffix:port") whose connections the session puts to an operator
// through ask instead of refusing them, when the allowlist does not list
// them. An answer for the run is kept for the rest of the session; no
// answer in time is not. Call it before the run's container starts.
func (s *Session) AskFor(hosts policy.Policy, ask AskFunc) { s.gate.ask.set(hosts, ask) }

// set sets the ask list and the function that asks, forgetting every
// answer.
func (a *asker) set(hosts policy.Policy, ask AskFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hosts, a.ask = hosts, ask
	a.answers = map[string]Decision{}
	a.pending = map[string]chan struct{}{}
}

// operator returns the decision for a connection to host:port (a name
// the allowlist does not list), asking when the host is on the ask list
// and the run has no answer yet; asked is false when it is not on the
// list (the connection is refused as unlisted). Connections to one host
// at once share one question.
func (a *asker) operator(ctx context.Context, host string, port int) (d Decision, asked bool) {
	key := net.JoinHostPort(host, strconv.Itoa(port))
	for {
		a.mu.Lock()
		if a.ask == nil || !a.hosts.AllowsName(host, port) {
			a.mu.Unlock()
			return Decision{}, false
		}
		if d, ok := a.answers[key]; ok {
			a.mu.Unlock()
			return d, true
		}
		if wait, ok := a.pending[key]; ok {
			a.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return Decision{TimedOut: true, Wait: "the connection's end"}, true
			}
		}
		if a.asked >= a.max {
			a.mu.Unlock()
			return Decision{Refused: fmt.Sprintf("the run asked an operator %d times, its most", a.max)}, true
		}
		a.asked++
		done := make(chan struct{})
		a.pending[key] = done
		ask := a.ask
		a.mu.Unlock()
		d := ask(ctx, host, port)
		a.mu.Lock()
		if !d.TimedOut {
			a.answers[key] = d
		}
		delete(a.pending, key)
		close(done)
		a.mu.Unlock()
		return d, true
	}
}
