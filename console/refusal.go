package console

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// A NATS server refuses a publish its user may not make with an
// asynchronous error on the connection ("Permissions Violation for Publish
// to <subject>"), never a reply: the request or JetStream publish behind an
// action would wait for one until its deadline. The console follows its
// connection's asynchronous errors (refusals.follow) and fails at once the
// action waiting on the refused subject, naming the role it needs.

// actionRole is the NATS role every action of the console needs: cancel,
// replay, raising a budget, answering egress and sending a message are the
// operator's (package roles, docs/security.md).
const actionRole = "operator"

// refusedError is why an action failed: the server refused its publish to
// Subject, which only Role may make.
type refusedError struct {
	Subject string
	Role    string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("the NATS server refused this console's publish to %q: it needs the %s role, "+
		"and the console's NATS user does not have it (serve it as an %s, or with --read-only)", e.Subject, e.Role, e.Role)
}

// refusedPublish finds the subject in nats.go's error for a refused
// publish: `nats: permissions violation: Permissions Violation for Publish
// to "<subject>"`.
var refusedPublish = regexp.MustCompile(`Permissions Violation for Publish to "([^"]+)"`)

// refusals hands the server's refusals to the actions waiting for them.
type refusals struct {
	mu      sync.Mutex
	waiting map[*refusalWait]struct{}
}

// refusalWait is one action in flight: the subjects it publishes to
// (patterns with * and >) and how to fail it.
type refusalWait struct {
	subjects []string
	fail     context.CancelCauseFunc
}

// follow puts r's handler before nc's asynchronous error handler, which
// still gets every error. It stays for the connection's life: with no
// action waiting, it does nothing.
func (r *refusals) follow(nc *nats.Conn) {
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		r.seen(err)
		if prev != nil {
			prev(c, s, err)
		}
	})
}

// watch registers an action publishing to subjects, failed with a
// *refusedError through fail when the server refuses one of them, until
// the returned function is called.
func (r *refusals) watch(subjects []string, fail context.CancelCauseFunc) (done func()) {
	w := &refusalWait{subjects: subjects, fail: fail}
	r.mu.Lock()
	if r.waiting == nil {
		r.waiting = map[*refusalWait]struct{}{}
	}
	r.waiting[w] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.waiting, w)
		r.mu.Unlock()
	}
}

// seen fails every waiting action that publishes to the subject a
// permissions violation names.
func (r *refusals) seen(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := refusedPublish.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.waiting {
		for _, p := range w.subjects {
			if subjectMatches(p, m[1]) {
				w.fail(&refusedError{Subject: m[1], Role: actionRole})
				break
			}
		}
	}
}

// refusal returns the refusal that failed the action ctx belongs to, if
// one did.
func refusal(ctx context.Context) (*refusedError, bool) {
	var e *refusedError
	ok := errors.As(context.Cause(ctx), &e)
	return e, ok
}

// subjectMatches reports whether subject matches pattern, whose tokens
// may be * (any one token) and a last > (one or more tokens).
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">" && i == len(pt)-1:
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}
