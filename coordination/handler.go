package coordination

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/jetcrew/jetcrew/coordination/relay"
)

// apiError is an error reply with its HTTP status and relay error code.
type apiError struct {
	status int
	code   string
	msg    string
}

// Error returns the text the agent is given.
func (e *apiError) Error() string { return e.msg }

// unavailable wraps a NATS failure as the 503 the bridge turns into
// "coordination unavailable: ...".
func unavailable(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: relay.CodeUnavailable,
		msg: fmt.Sprintf("%s: the worker cannot reach NATS (%v); try again later", relay.ErrUnavailable, err)}
}

// sessionKey keys the Session in the context of a request on its socket
// (http.Server.BaseContext).
type sessionKey struct{}

// sessionOf returns the session whose socket r came in on.
func sessionOf(r *http.Request) *Session { return r.Context().Value(sessionKey{}).(*Session) }

// relayMux routes the relay endpoints of every session, built once: the
// session of a request is in its context (sessionOf). Building a router per
// session was a measurable part of a coordination run's cost.
var relayMux = sync.OnceValue(newRelayMux)

// handler routes the relay endpoints. Every request, whatever its outcome,
// counts as the bridge having connected, but the launcher's (fromLauncher).
func (s *Session) handler() http.Handler {
	mux := relayMux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fromLauncher(r) {
			// The launcher's steering polls are not the agent's bridge.
			mux.ServeHTTP(w, r)
			return
		}
		s.connectOnce.Do(func() {
			s.connected.Store(true)
			s.log.Info().Msg("bridge connected")
			s.emit(Event{Kind: EventConnected})
			s.joinLate()
		})
		s.markUnread(w)
		mux.ServeHTTP(w, r)
	})
}

// newRelayMux returns the router of the relay endpoints.
func newRelayMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+relay.PathHello, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+relay.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var st relay.Status
		err := s.allowCall(callRead)
		if err == nil {
			st, err = s.status(r.Context())
		}
		s.reply(w, st, err)
	})
	mux.HandleFunc("GET "+relay.PathClaims, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp relay.ClaimsResponse
		err := s.allowCall(callRead)
		if err == nil {
			resp, err = s.claims(r.Context())
		}
		s.reply(w, resp, err)
	})
	post(mux, relay.PathSend, endpoint[relay.SendRequest, relay.SendResponse]{
		class: callSend, decode: relay.DecodeSendRequest, do: (*Session).send,
		refused: func(req relay.SendRequest) Event { return Event{To: req.To} },
	})
	post(mux, relay.PathInbox, endpoint[relay.InboxRequest, relay.InboxResponse]{
		class: callRead, decode: relay.DecodeInboxRequest,
		do: func(s *Session, ctx context.Context, req relay.InboxRequest) (relay.InboxResponse, error) {
			msgs, err := s.inbox(ctx, req)
			return relay.InboxResponse{Messages: msgs}, err
		},
		refused: func(relay.InboxRequest) Event { return Event{} },
	})
	post(mux, relay.PathClaim, endpoint[relay.ClaimRequest, relay.ClaimResponse]{
		class: callClaim, decode: relay.DecodeClaimRequest, do: (*Session).claim,
		refused: func(req relay.ClaimRequest) Event { return Event{Paths: req.Paths} },
	})
	post(mux, relay.PathRelease, endpoint[relay.ReleaseRequest, relay.ReleaseResponse]{
		class: callClaim, decode: relay.DecodeReleaseRequest, do: (*Session).release,
		refused: func(req relay.ReleaseRequest) Event { return Event{Paths: req.Paths} },
	})
	addQuestionRoutes(mux)
	addSteerRoutes(mux)
	return mux
}

// callFree is the class of an endpoint no call limit applies to (the
// launcher's steering polls, the bridge's notices: each answers at most
// what another limit let in).
const callFree callClass = -1

// endpoint is one POST endpoint of the relay: the call class whose limit
// it takes (callFree: none), how its body decodes, what it does, and the
// fields of the EventRefused recorded when it fails (nil: none is).
type endpoint[Req, Resp any] struct {
	class   callClass
	decode  func([]byte) (Req, error)
	do      func(s *Session, ctx context.Context, req Req) (Resp, error)
	refused func(Req) Event
	// before, when set, runs once the request decoded, before do: the
	// ask endpoint lifts the socket's write deadline for its wait.
	before func(w http.ResponseWriter, req Req)
}

// post routes POST path to e: the call's limit (a refusal answered 429 and
// counted, not reported one by one), the body read within
// relay.MaxRequestBytes and decoded, e.do, and the reply. A failure is
// recorded as an EventRefused carrying e.refused's fields, but for a
// request whose agent went away meanwhile (nobody refused it).
func post[Req, Resp any](mux *http.ServeMux, path string, e endpoint[Req, Resp]) {
	mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp Resp
		if e.class != callFree {
			if err := s.allowCall(e.class); err != nil {
				s.reply(w, resp, err)
				return
			}
		}
		data, err := readBody(w, r)
		var req Req
		if err == nil {
			req, err = e.decode(data)
		}
		if err == nil {
			if e.before != nil {
				e.before(w, req)
			}
			resp, err = e.do(s, r.Context(), req)
		}
		if err != nil && e.refused != nil && r.Context().Err() == nil {
			s.replyRefused(w, resp, err, e.refused(req))
			return
		}
		s.reply(w, resp, err)
	})
}

// replyRefused writes v, or err after recording it as an EventRefused
// carrying ev's fields.
func (s *Session) replyRefused(w http.ResponseWriter, v any, err error, ev Event) {
	if err != nil {
		ae := s.classify(err)
		ev.Kind, ev.Reason = EventRefused, ae.msg
		s.emit(ev)
		err = ae
	}
	s.reply(w, v, err)
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, relay.MaxRequestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: relay.CodeTooLarge,
				msg: fmt.Sprintf("request is larger than %d bytes", relay.MaxRequestBytes)}
		}
		return nil, &apiError{status: http.StatusBadRequest, code: relay.CodeInvalid, msg: "reading request: " + err.Error()}
	}
	return data, nil
}

// reply writes v as JSON, or err as an ErrorResponse with the status its
// kind calls for (see classify).
func (s *Session) reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err == nil {
		_ = json.NewEncoder(w).Encode(v)
		return
	}
	ae := s.classify(err)
	w.WriteHeader(ae.status)
	_ = json.NewEncoder(w).Encode(relay.ErrorResponse{Code: ae.code, Error: ae.msg})
}

// classify maps err to its reply: a rule broken by the request (4xx with the
// rule's text), rate limiting (429), or anything else, which can only be NATS
// failing, as 503 "coordination unavailable: ...".
func (s *Session) classify(err error) *apiError {
	var ae *apiError
	var ie *relay.InvalidError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &ie):
		status := http.StatusBadRequest
		switch ie.Code {
		case relay.CodeTooLarge:
			status = http.StatusRequestEntityTooLarge
		case relay.CodeUnknownPeer:
			status = http.StatusNotFound
		}
		return &apiError{status: status, code: ie.Code, msg: ie.Message}
	}
	if s.ctx.Err() != nil {
		return &apiError{status: http.StatusServiceUnavailable, code: relay.CodeUnavailable,
			msg: relay.ErrUnavailable.Error() + ": the run's coordination session has ended (the worker is stopping or handing the run back)"}
	}
	s.log.Warn().Err(err).Msg("coordination request failed")
	return unavailable(err)
}
