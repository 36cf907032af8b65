package coordination

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

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

// handler serves the relay's endpoint table (relayEndpoints). Every
// request, whatever its outcome, counts as the bridge having connected, but
// the launcher's (fromLauncher).
func (s *Session) handler() http.Handler {
	mux := relayEndpoints().mux
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fromLauncher(r) {
			// The launcher's steering polls are not the agent's bridge.
			mux.ServeHTTP(w, r)
			return
		}
		s.connectOnce.Do(func() {
			s.connected.Store(true)
			s.core.log.Info().Msg("bridge connected")
			s.core.emit(Event{Kind: EventConnected})
			s.core.joinLate()
		})
		s.steer.markUnread(w)
		mux.ServeHTTP(w, r)
	})
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

// replyRefused writes v, or err after recording it as an EventRefused
// carrying ev's fields.
func (c *core) replyRefused(w http.ResponseWriter, v any, err error, ev Event) {
	if err != nil {
		ae := c.classify(err)
		ev.Kind, ev.Reason = EventRefused, ae.msg
		c.emit(ev)
		err = ae
	}
	c.reply(w, v, err)
}

// reply writes v as JSON (noContent as a bare 204), or err as an
// ErrorResponse with the status its kind calls for (see classify).
func (c *core) reply(w http.ResponseWriter, v any, err error) {
	if _, ok := v.(noContent); ok && err == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err == nil {
		_ = json.NewEncoder(w).Encode(v)
		return
	}
	ae := c.classify(err)
	w.WriteHeader(ae.status)
	_ = json.NewEncoder(w).Encode(relay.ErrorResponse{Code: ae.code, Error: ae.msg})
}

// classify maps err to its reply: a rule broken by the request (4xx with the
// rule's text), rate limiting (429), the session ending (503
// relay.CodeSessionEnded), or anything else, which can only be NATS
// failing, as 503 "coordination unavailable: ...".
func (c *core) classify(err error) *apiError {
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
	if c.ctx.Err() != nil {
		// The bridge waits for a successor to serve the socket again, and
		// sends an idempotent call again (relay.CodeSessionEnded).
		return &apiError{status: http.StatusServiceUnavailable, code: relay.CodeSessionEnded,
			msg: relay.ErrUnavailable.Error() + ": the run's coordination session has ended (the worker is stopping or handing the run back)"}
	}
	c.log.Warn().Err(err).Msg("coordination request failed")
	return unavailable(err)
}
