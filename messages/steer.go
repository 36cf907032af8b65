package messages

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Steering: an operator's message to a running agent, written into the agent
// CLI's standard input as a user turn when its backend takes streamed input,
// and put in the run's coordination inbox either way (see package
// coordination and docs/wire.md#steering).

// SubjectSteerPrefix prefixes the subject a steer request is sent to:
// jetcrew.steer.<run_id>. It is a plain NATS request/reply subject (not a
// stream), answered by the worker serving the run's coordination session
// with a SteerReply: `nats req -H Jetcrew-Steer-Id:ID jetcrew.steer.RUN 'text'`.
// Only operators may publish on it, only workers subscribe (package roles).
const SubjectSteerPrefix = "jetcrew.steer"

// SubjectSteer returns the steer request subject of a run,
// jetcrew.steer.<run_id>.
func SubjectSteer(runID string) string { return SubjectSteerPrefix + "." + runID }

// HeaderSteerID carries a steer's id on its request: the sender's choice
// (ValidateSteerID), the key that makes a steer idempotent. A request
// repeated with the same id is answered with the first one's outcome and
// delivers nothing new (within SteerDedupWindow on one worker; the inbox
// copy within JETCREW_COORD's duplicate window on any worker).
const HeaderSteerID = "Jetcrew-Steer-Id"

// MaxSteerBytes is the largest steer text, in bytes: the size of a
// coordination message a run may send (16 KiB).
const MaxSteerBytes = 16 << 10

// MaxSteerIDLen is the longest steer id, in bytes.
const MaxSteerIDLen = 64

// SteerOutcome says what became of a steer.
type SteerOutcome string

// Steer outcomes.
const (
	// SteerDelivered: the text was written to the agent CLI's standard
	// input as a user turn (and put in the run's inbox).
	SteerDelivered SteerOutcome = "delivered"
	// SteerQueued: the text is in the run's inbox only; the agent's bridge
	// tells it that unread messages wait. Reason says why it was not
	// written to the CLI's input (its backend takes none, the launcher
	// did not take it in time).
	SteerQueued SteerOutcome = "queued"
	// SteerRefused: nothing was delivered nor stored; Code and Reason say
	// why.
	SteerRefused SteerOutcome = "refused"
)

// Refusal codes of a steer (SteerReply.Code).
const (
	// SteerNotRunning: the run is queued or starting, not running yet.
	SteerNotRunning = "not_running"
	// SteerEnded: the run has ended (Reason names its final state).
	SteerEnded = "ended"
	// SteerFinishing: the agent CLI's last turn ended and its input is
	// closed: it is finishing and would read the steer nowhere.
	SteerFinishing = "finishing"
	// SteerUnknownRun: no run has that id.
	SteerUnknownRun = "unknown_run"
	// SteerInvalid: the text or the id breaks a rule (empty, not UTF-8,
	// a NUL byte, a bad id).
	SteerInvalid = "invalid"
	// SteerTooLarge: the text is larger than MaxSteerBytes.
	SteerTooLarge = "too_large"
	// SteerRateLimited: the run was steered too often; wait and retry.
	SteerRateLimited = "rate_limited"
	// SteerUnavailable: the worker cannot store the steer (NATS trouble,
	// the run's session is ending) or no worker answered.
	SteerUnavailable = "unavailable"
)

// SteerReply is the JSON reply to a request on jetcrew.steer.<run_id>.
type SteerReply struct {
	// RunID is the run steered.
	RunID string `json:"run_id"`
	// ID is the steer's id (HeaderSteerID).
	ID string `json:"id"`
	// Outcome says what became of it.
	Outcome SteerOutcome `json:"outcome"`
	// Code is a Steer* refusal code (SteerRefused only).
	Code string `json:"code,omitempty"`
	// Reason explains a queued or refused outcome in words.
	Reason string `json:"reason,omitempty"`
	// MessageID is the inbox copy's sequence in JETCREW_COORD, in decimal
	// (delivered and queued).
	MessageID string `json:"message_id,omitempty"`
	// Duplicate is true when the id matched an earlier steer: nothing new
	// was delivered or stored, and Outcome is the earlier one's.
	Duplicate bool `json:"duplicate,omitempty"`
}

// ErrInvalidSteer is wrapped by ValidateSteer's errors.
var ErrInvalidSteer = errors.New("invalid steer")

// ValidateSteerID checks a steer id: 1 to MaxSteerIDLen bytes of letters,
// digits, '-' and '_'.
func ValidateSteerID(id string) error {
	if len(id) > MaxSteerIDLen {
		return fmt.Errorf("%w: id is %d bytes, longest allowed is %d", ErrInvalidSteer, len(id), MaxSteerIDLen)
	}
	if err := ValidateToken("steer id", id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSteer, err)
	}
	return nil
}

// ValidateSteer checks a steer's text and returns the refusal code for it
// ("" when valid): text only, 1 to MaxSteerBytes bytes of valid UTF-8
// without a NUL byte. The text is shown inert wherever it is shown.
func ValidateSteer(text string) (code string, err error) {
	switch {
	case strings.TrimSpace(text) == "":
		return SteerInvalid, fmt.Errorf("%w: the text is empty", ErrInvalidSteer)
	case len(text) > MaxSteerBytes:
		return SteerTooLarge, fmt.Errorf("%w: the text is %d bytes, largest allowed is %d (16 KiB)", ErrInvalidSteer, len(text), MaxSteerBytes)
	case !utf8.ValidString(text):
		return SteerInvalid, fmt.Errorf("%w: the text is not valid UTF-8 (a steer is text only)", ErrInvalidSteer)
	case strings.IndexByte(text, 0) >= 0:
		return SteerInvalid, fmt.Errorf("%w: the text holds a NUL byte (a steer is text only)", ErrInvalidSteer)
	}
	return "", nil
}

// CoordSteered is the coordination event of a steer the run's worker
// answered (jetcrew.events.<run_id>.coord): Outcome, SteerID, Bytes,
// MessageID (the inbox copy), Reason (queued or refused), Duplicate.
// A steer refused before any worker saw it (the run ended or is unknown)
// has no event: the sender's reply and exit code say so.
const CoordSteered CoordEventKind = "steered"

// Formats of the user turns a launcher writes to an agent CLI's standard
// input (`jetcrew-bridge launch --steer FORMAT`): the run's prompt as the
// first turn, each steer as one more.
const (
	// SteerInputClaude is Claude Code's `--input-format stream-json`: one
	// line {"type":"user","message":{"role":"user","content":[{"type":"text","text":...}]}}
	// per turn; a turn ends with a {"type":"result",...} line on stdout.
	SteerInputClaude = "claude-stream-json"
	// SteerInputKimi is Kimi CLI's `--input-format stream-json`: one line
	// {"role":"user","content":...} per turn; a turn ends with an assistant
	// message that calls no tool.
	SteerInputKimi = "kimi-stream-json"
)
