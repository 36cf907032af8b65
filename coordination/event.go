package coordination

import "time"

// EventKind says what happened in a run's coordination session.
type EventKind string

// Event kinds.
const (
	// EventConnected: the run's bridge reached the socket for the first
	// time in this session (it announces itself when it starts).
	EventConnected EventKind = "connected"
	// EventSent: the run sent a message (To, MessageID, Bytes, Duplicate).
	EventSent EventKind = "sent"
	// EventRead: the run read messages from its inbox (MessageIDs).
	EventRead EventKind = "read"
	// EventRefused: a send or inbox call was refused (To, Reason): bad
	// recipient, unknown peer, too large, rate limited, or NATS
	// unreachable.
	EventRefused EventKind = "refused"
)

// Event reports one coordination step of a run to the worker (Config.OnEvent),
// which records it on the run's event subject. Its JSON form is meant to be
// published as is.
type Event struct {
	// RunID is the run whose session it is.
	RunID string `json:"run_id"`
	// Group is the run's group.
	Group string `json:"group"`
	// Kind says what happened.
	Kind EventKind `json:"kind"`
	// Time is when it happened.
	Time time.Time `json:"time"`
	// To is the recipient of a send (EventSent, EventRefused on send).
	To string `json:"to,omitempty"`
	// MessageID is the id of the message sent (EventSent).
	MessageID string `json:"message_id,omitempty"`
	// Bytes is the body size of the message sent, in bytes (EventSent).
	Bytes int `json:"bytes,omitempty"`
	// Duplicate is true when a send's idempotency key matched an earlier
	// send and nothing new was sent (EventSent).
	Duplicate bool `json:"duplicate,omitempty"`
	// MessageIDs are the ids of the messages read, oldest first (EventRead).
	MessageIDs []string `json:"message_ids,omitempty"`
	// Reason is the error text the agent was given (EventRefused).
	Reason string `json:"reason,omitempty"`
	// Count is, for an EventRefused about rate limiting, how many calls
	// were refused for their rate since the last such event (they are
	// counted, not reported one by one); 0 for every other event.
	Count int `json:"count,omitempty"`
}
