package coordination

import (
	"context"
	"net/http"
	"sync"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// The relay's endpoint table: every endpoint a run's socket serves (package
// relay names them), each added by the feature that serves it: the session
// itself (hello), its mailbox (status, send, inbox, ops.go), its claims
// (claims.go), its questions (questions.go) and its steering (steer.go).
// The table is built once for every session: the session of a request is in
// its context (sessionOf). Building a router per session was a measurable
// part of a coordination run's cost.

// none is the request of an endpoint that takes no body (a GET, hello).
type none struct{}

// noContent is the response of an endpoint that answers 204 with no body.
type noContent struct{}

// endpoint is one entry of the relay's endpoint table, served by feature F
// of the session: its method and path, the call class whose limit it takes
// (callFree: none), how its body decodes (nil: it has none), what it does
// (nil: nothing but answer), and the fields of the EventRefused recorded
// when it fails (nil: none is).
type endpoint[F, Req, Resp any] struct {
	method, path string
	class        callClass
	decode       func([]byte) (Req, error)
	do           func(f *F, ctx context.Context, req Req) (Resp, error)
	refused      func(Req) Event
	// before, when set, runs once the request decoded, before do: the
	// ask endpoint lifts the socket's write deadline for its wait.
	before func(w http.ResponseWriter, req Req)
}

// endpointTable is the relay's endpoint table: a router of "METHOD path"
// patterns, and the patterns in the order the features added them.
type endpointTable struct {
	mux      *http.ServeMux
	patterns []string
}

// relayEndpoints returns the relay's endpoint table, built on first use.
var relayEndpoints = sync.OnceValue(func() *endpointTable {
	t := &endpointTable{mux: http.NewServeMux()}
	for _, addTo := range []func(*endpointTable){
		addSessionEndpoints, addMailboxEndpoints, addClaimEndpoints, addQuestionEndpoints, addSteerEndpoints,
	} {
		addTo(t)
	}
	return t
})

// addSessionEndpoints adds the session's own endpoint to t: hello, the
// bridge announcing itself (Session.handler records it connected).
func addSessionEndpoints(t *endpointTable) {
	add(t, nil, endpoint[Session, none, noContent]{method: http.MethodPost, path: relay.PathHello, class: callFree})
}

// add routes e in t, served by the feature of the request's session that
// of returns: the call's limit (a refusal answered 429 and counted, not
// reported one by one), the body read within relay.MaxRequestBytes and
// decoded, e.do, and the reply. A failure is recorded as an EventRefused
// carrying e.refused's fields, but for a request whose agent went away
// meanwhile (nobody refused it).
func add[F, Req, Resp any](t *endpointTable, of func(*Session) *F, e endpoint[F, Req, Resp]) {
	pattern := e.method + " " + e.path
	t.patterns = append(t.patterns, pattern)
	t.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp Resp
		if e.class != callFree {
			if err := s.limits.allow(e.class); err != nil {
				s.core.reply(w, resp, err)
				return
			}
		}
		req, err := e.request(w, r)
		if err == nil {
			if e.before != nil {
				e.before(w, req)
			}
			if e.do != nil {
				resp, err = e.do(of(s), r.Context(), req)
			}
		}
		if err != nil && e.refused != nil && r.Context().Err() == nil {
			s.core.replyRefused(w, resp, err, e.refused(req))
			return
		}
		s.core.reply(w, resp, err)
	})
}

// request reads and decodes r's body, or returns the zero Req for an
// endpoint without one. On a decoding error it returns what the decoder
// did, for e.refused.
func (e endpoint[F, Req, Resp]) request(w http.ResponseWriter, r *http.Request) (Req, error) {
	var req Req
	if e.decode == nil {
		return req, nil
	}
	data, err := readBody(w, r)
	if err != nil {
		return req, err
	}
	return e.decode(data)
}
