// Package messages holds jetcrew's public wire contract: the names of its
// JetStream streams, consumers and key-value buckets, the subjects it uses,
// and the JSON documents it exchanges (run requests, run states and run
// events). It imports only the standard library so that any program, jetcrew
// or not, can depend on it.
//
// The contract is documented for non-Go clients in docs/wire.md, and the run
// request has a JSON Schema in docs/run-request.schema.json.
package messages

import (
	"errors"
	"fmt"
	"strings"
)

// Names of the JetStream resources jetcrew uses. They are part of the public
// wire contract: changing one is a breaking change.
const (
	// StreamRuns is the WorkQueue stream holding run requests: a pool's on
	// SubjectRuns, its operators' replays on SubjectReplay.
	StreamRuns = "JETCREW_RUNS"
	// StreamEvents is the limits-retention stream holding run events
	// (SubjectEvents).
	StreamEvents = "JETCREW_EVENTS"
	// StreamFailed is the dead-letter stream: limits retention, subjects
	// jetcrew.failed.<pool>.<run_id>, each message's body the original
	// request exactly as submitted (see the Header* dead-letter headers).
	StreamFailed = "JETCREW_FAILED"
	// BucketRuns is the key-value bucket holding one RunState per run id.
	BucketRuns = "jetcrew-runs"
)

// Subject prefixes.
const (
	// SubjectRunsPrefix prefixes the subject a run request is published to:
	// jetcrew.runs.<pool>.
	SubjectRunsPrefix = "jetcrew.runs"
	// SubjectEventsPrefix prefixes the subjects of run events:
	// jetcrew.events.<run_id>.<type>.
	SubjectEventsPrefix = "jetcrew.events"
	// SubjectFailedPrefix prefixes dead-letter subjects:
	// jetcrew.failed.<pool>.<run_id>.
	SubjectFailedPrefix = "jetcrew.failed"
)

// DefaultPool is the pool a run request goes to when it names none.
const DefaultPool = "default"

// MaxTokenLen is the longest run id, pool, group or profile name accepted, in
// bytes. It keeps subjects and container names well within their limits.
const MaxTokenLen = 64

// ErrInvalidToken is returned, wrapped, by ValidateToken for a value that
// cannot be used as a NATS subject token.
var ErrInvalidToken = errors.New("invalid subject token")

// ValidateToken checks that s can be used as one token of a NATS subject and
// as part of a Docker container name: 1 to MaxTokenLen bytes of ASCII letters,
// digits, '-' and '_'. That excludes '.', '*', '>', white space and every
// other character with a meaning in subjects (see the NATS subject naming
// rules, ADR-6). what names the field in the returned error, which wraps
// ErrInvalidToken.
func ValidateToken(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s: %w: empty", what, ErrInvalidToken)
	}
	if len(s) > MaxTokenLen {
		return fmt.Errorf("%s: %w: %d bytes, longest allowed is %d", what, ErrInvalidToken, len(s), MaxTokenLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return fmt.Errorf("%s: %w: %q has character %q at byte %d (allowed: letters, digits, '-', '_')", what, ErrInvalidToken, s, c, i)
		}
	}
	return nil
}

// SubjectRuns returns the subject run requests for pool are published to,
// jetcrew.runs.<pool>. It does not validate pool; see ValidateToken.
func SubjectRuns(pool string) string {
	return SubjectRunsPrefix + "." + pool
}

// SubjectEvents returns the subject of an event of type typ for run id,
// jetcrew.events.<run_id>.<type>.
func SubjectEvents(runID string, typ EventType) string {
	return SubjectEventsPrefix + "." + runID + "." + string(typ)
}

// SubjectEventsAll returns the wildcard subject matching every event of run id,
// jetcrew.events.<run_id>.>.
func SubjectEventsAll(runID string) string {
	return SubjectEventsPrefix + "." + runID + ".>"
}

// SubjectReplayToken is the last token of a pool's replay subject
// (SubjectReplay).
const SubjectReplayToken = "replay"

// SubjectReplay returns the subject an operator replays a run of pool on,
// jetcrew.runs.<pool>.replay. A pool's workers take requests from it as from
// SubjectRuns(pool), and it is the only subject on which a request for a
// profile that requires signed requests may run a run that has already
// ended again: the roles let operators publish to it, never submitters
// (docs/security.md, "Signed run requests"). It does not validate pool.
func SubjectReplay(pool string) string {
	return SubjectRuns(pool) + "." + SubjectReplayToken
}

// PoolFromSubject returns the pool token of a jetcrew.runs.<pool> or
// jetcrew.runs.<pool>.replay subject, or an error when subject is of
// neither form.
func PoolFromSubject(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, SubjectRunsPrefix+".")
	rest = strings.TrimSuffix(rest, "."+SubjectReplayToken)
	if !ok || rest == "" || strings.Contains(rest, ".") {
		return "", fmt.Errorf("subject %q is not of the form %s.<pool> or %s.<pool>.%s", subject, SubjectRunsPrefix, SubjectRunsPrefix, SubjectReplayToken)
	}
	return rest, nil
}

// IsReplaySubject reports whether subject is a pool's replay subject,
// jetcrew.runs.<pool>.replay (SubjectReplay).
func IsReplaySubject(subject string) bool {
	pool, err := PoolFromSubject(subject)
	return err == nil && subject == SubjectReplay(pool)
}

// ConsumerName returns the name of the durable pull consumer shared by every
// worker of pool: "workers-<pool>".
func ConsumerName(pool string) string {
	return "workers-" + pool
}

// SubjectFailed returns the dead-letter subject of a run,
// jetcrew.failed.<pool>.<run_id>.
func SubjectFailed(pool, runID string) string {
	return SubjectFailedPrefix + "." + pool + "." + runID
}

// ArchivedToken ends the subject of a dead letter's archive mark.
const ArchivedToken = "archived"

// SubjectFailedArchived returns the subject of the mark an operator
// leaves in JETCREW_FAILED to archive a run's dead letters,
// jetcrew.failed.<pool>.<run_id>.archived: five tokens, so no reader of
// dead letters (jetcrew.failed.<pool>.<run_id>) takes it for one.
func SubjectFailedArchived(pool, runID string) string {
	return SubjectFailed(pool, runID) + "." + ArchivedToken
}

// SubjectCancelPrefix prefixes the subject a cancel request is sent to:
// jetcrew.cancel.<run_id>. It is a plain NATS request/reply subject (not a
// stream): `nats req jetcrew.cancel.<run_id> ""` cancels a run and prints
// the CancelReply.
const SubjectCancelPrefix = "jetcrew.cancel"

// SubjectCancel returns the cancel request subject of a run,
// jetcrew.cancel.<run_id>.
func SubjectCancel(runID string) string {
	return SubjectCancelPrefix + "." + runID
}
