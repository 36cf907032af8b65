package relay

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Reconnecting. A run outlives its worker: when the worker stops or dies,
// the run's container keeps running, and the next worker on the host adopts
// the run and serves its sockets again at the same paths. Meanwhile a
// socket path either does not exist (ENOENT: the old worker removed it) or
// exists with nobody listening (ECONNREFUSED: the old worker was killed),
// and a connection in flight is cut (EOF, ECONNRESET). The Client rides
// this out:
//
//   - a call whose socket cannot be dialled for either reason is tried
//     again, with backoff (ReconnectBackOff), for up to the client's
//     reconnect window (ReconnectWindow by default) from its first failure;
//     nothing reached the worker, so every call may be;
//   - a call whose connection is cut while it is in flight, or that the
//     worker answers "the run's coordination session has ended"
//     (CodeSessionEnded), is sent again within the same window when it is
//     idempotent for the worker (request.idempotent lists which, and why);
//     any other returns at once an error matching ErrInterrupted, saying
//     that it may or may not have taken effect;
//   - a call never takes longer than its own timeout plus the window, and
//     Close or its context ends it at once.
//
// Past the window the call fails as before, with an error matching
// ErrUnavailable. The egress relay (package bridgecmd) waits for its
// socket the same way (SocketGone, ReconnectBackOff).

// ReconnectWindow is how long, by default, a call waits for the run's
// socket to come back once it cannot be dialled or its connection was cut:
// a worker's successor on the same host serves the socket again within
// seconds to tens of seconds.
const ReconnectWindow = 60 * time.Second

// EnvReconnectWindow names the environment variable that sets the reconnect
// window of the bridge, the steered launcher and the egress relay: a Go
// duration ("90s"), "0" for none (a missing socket fails the call at once).
const EnvReconnectWindow = "JETCREW_BRIDGE_RECONNECT"

// ReconnectWindowFrom returns the reconnect window the environment sets
// (getenv(EnvReconnectWindow)), ReconnectWindow when it sets none. A value
// that is not a duration of at least 0 is an error, returned with
// ReconnectWindow.
func ReconnectWindowFrom(getenv func(string) string) (time.Duration, error) {
	v := getenv(EnvReconnectWindow)
	if v == "" {
		return ReconnectWindow, nil
	}
	if v == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return ReconnectWindow, fmt.Errorf("%s=%q is not a duration of at least 0 (e.g. 90s); using %s", EnvReconnectWindow, v, ReconnectWindow)
	}
	return d, nil
}

// ErrInterrupted is matched (errors.Is) by the error of a call that is not
// safe to send twice (a send without an idempotency key, ask, reply,
// release) whose connection to the worker was cut, or whose coordination
// session ended, while it was in flight: it may or may not have taken
// effect. Its text, "coordination interrupted", starts the message, which
// tells the agent to check and call again.
var ErrInterrupted = errors.New("coordination interrupted")

// Reconnect backoff: quick first tries (a successor often binds within a
// second or two), then one try a second.
const (
	reconnectFirstTry = 50 * time.Millisecond
	reconnectMaxTry   = time.Second
)

// ReconnectBackOff returns the backoff of waiting for a socket to come
// back: exponential from 50 ms to one try a second, for at most window; no
// retry at all when window is 0 or less.
func ReconnectBackOff(window time.Duration) backoff.BackOff {
	if window <= 0 {
		return &backoff.StopBackOff{}
	}
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(reconnectFirstTry),
		backoff.WithMaxInterval(reconnectMaxTry),
		backoff.WithMaxElapsedTime(window))
}

// SocketGone reports whether err is a failed dial of a unix socket that
// nobody serves now: its path does not exist (ENOENT) or nobody listens on
// it (ECONNREFUSED). Both mean, inside a run container, that the worker is
// being replaced.
func SocketGone(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" &&
		(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED))
}

// unreachableError is an attempt whose socket could not be dialled because
// nobody serves it (SocketGone): nothing reached the worker.
type unreachableError struct {
	path   string
	err    error
	waited time.Duration // how long the call waited for the socket
}

// Error says the worker cannot be reached, and for how long it was waited for.
func (e *unreachableError) Error() string {
	if e.waited > 0 {
		return fmt.Sprintf("%s: cannot reach the worker through %s (waited %s for it to come back): %v",
			ErrUnavailable, e.path, e.waited.Round(100*time.Millisecond), e.err)
	}
	return fmt.Sprintf("%s: cannot reach the worker through %s: %v", ErrUnavailable, e.path, e.err)
}

// Is matches ErrUnavailable.
func (e *unreachableError) Is(target error) bool { return target == ErrUnavailable }

// cutError is an attempt whose connection broke after the request may have
// reached the worker (EOF, ECONNRESET, a reply cut short).
type cutError struct {
	path string
	err  error
}

// Error says the connection was cut.
func (e *cutError) Error() string {
	return fmt.Sprintf("%s: the connection to the worker through %s was cut: %v", ErrUnavailable, e.path, e.err)
}

// Is matches ErrUnavailable.
func (e *cutError) Is(target error) bool { return target == ErrUnavailable }

// interrupted is the error of a call r that is not safe to send twice when
// err (a cutError, or the worker's CodeSessionEnded reply) ended it. An
// ask's says its question stays open and its answer will come to the
// inbox (the worker keeps a question its session could not wait out, and
// the run's next session waits on it): asked again, it would be asked
// twice.
func interrupted(r request, err error) error {
	cause := "the worker's session ended"
	var cut *cutError
	if errors.As(err, &cut) {
		cause = cut.err.Error()
	}
	what := "check (status, inbox, claims) and call again if it did not " +
		"(a send repeated with the same idempotency_key is never sent twice)"
	if r.path == PathAsk {
		what = "a question that was asked stays open until its timeout, and its answer will be put in your inbox " +
			"(answer_to names the question): read your inbox before asking again"
	}
	return fmt.Errorf("%w: the worker went away while this call was in flight (it restarted, or handed the run to another worker), "+
		"so it may or may not have taken effect; %s [%s %s: %s]", ErrInterrupted, what, r.method, r.path, cause)
}

// retryable reports whether a failed attempt of r may be made again: its
// socket was not served (nothing reached the worker), or r is idempotent
// and its connection was cut or its session ended.
func retryable(r request, err error) bool {
	var u *unreachableError
	if errors.As(err, &u) {
		return true
	}
	return r.idempotent && workerWent(err)
}

// workerWent reports whether err says the worker went away during the
// attempt: its connection was cut, or it answered that the run's session
// ended.
func workerWent(err error) bool {
	var cut *cutError
	var re *Error
	return errors.As(err, &cut) || errors.As(err, &re) && re.Code == CodeSessionEnded
}
