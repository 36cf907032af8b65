package coordination

import (
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
	mux.HandleFunc("POST "+relay.PathSend, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp relay.SendResponse
		if err := s.allowCall(callSend); err != nil {
			s.reply(w, resp, err) // counted, not reported one by one
			return
		}
		data, err := readBody(w, r)
		var req relay.SendRequest
		if err == nil {
			req, err = relay.DecodeSendRequest(data)
		}
		if err == nil {
			resp, err = s.send(r.Context(), req)
		}
		if err != nil {
			ae := s.classify(err)
			s.emit(Event{Kind: EventRefused, To: req.To, Reason: ae.msg})
			err = ae
		}
		s.reply(w, resp, err)
	})
	mux.HandleFunc("POST "+relay.PathInbox, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp relay.InboxResponse
		if err := s.allowCall(callRead); err != nil {
			s.reply(w, resp, err) // counted, not reported one by one
			return
		}
		data, err := readBody(w, r)
		var req relay.InboxRequest
		if err == nil {
			req, err = relay.DecodeInboxRequest(data)
		}
		if err == nil {
			resp.Messages, err = s.inbox(r.Context(), req)
		}
		if err != nil && r.Context().Err() == nil {
			ae := s.classify(err)
			s.emit(Event{Kind: EventRefused, Reason: ae.msg})
			err = ae
		}
		s.reply(w, resp, err)
	})
	mux.HandleFunc("POST "+relay.PathClaim, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp relay.ClaimResponse
		if err := s.allowCall(callClaim); err != nil {
			s.reply(w, resp, err)
			return
		}
		data, err := readBody(w, r)
		var req relay.ClaimRequest
		if err == nil {
			req, err = relay.DecodeClaimRequest(data)
		}
		if err == nil {
			resp, err = s.claim(r.Context(), req)
		}
		if err != nil {
			ae := s.classify(err)
			s.emit(Event{Kind: EventRefused, Paths: req.Paths, Reason: ae.msg})
			err = ae
		}
		s.reply(w, resp, err)
	})
	mux.HandleFunc("POST "+relay.PathRelease, func(w http.ResponseWriter, r *http.Request) {
		s := sessionOf(r)
		var resp relay.ReleaseResponse
		if err := s.allowCall(callClaim); err != nil {
			s.reply(w, resp, err)
			return
		}
		data, err := readBody(w, r)
		var req relay.ReleaseRequest
		if err == nil {
			req, err = relay.DecodeReleaseRequest(data)
		}
		if err == nil {
			resp, err = s.release(r.Context(), req)
		}
		if err != nil {
			ae := s.classify(err)
			s.emit(Event{Kind: EventRefused, Paths: req.Paths, Reason: ae.msg})
			err = ae
		}
		s.reply(w, resp, err)
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
	addQuestionRoutes(mux)
	addSteerRoutes(mux)
	return mux
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
