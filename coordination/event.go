package coordination

import "github.com/jetcrew/jetcrew/messages"

// EventKind says what happened in a run's coordination session: the wire
// type messages.CoordEventKind.
type EventKind = messages.CoordEventKind

// Event kinds (messages.Coord*).
const (
	// EventConnected: the run's bridge reached the socket for the first
	// time in this session (it announces itself when it starts).
	EventConnected = messages.CoordConnected
	// EventSent: the run sent a message (To, MessageID, Bytes, Duplicate).
	EventSent = messages.CoordSent
	// EventRead: the run read messages from its inbox (MessageIDs).
	EventRead = messages.CoordRead
	// EventRefused: a send or inbox call was refused (To, Reason).
	EventRefused = messages.CoordRefused
	// EventClaimed: the run claimed paths (Paths, Reason).
	EventClaimed = messages.CoordClaimed
	// EventReleased: the run released paths (Paths), or its claims were
	// removed when it ended (Paths, Reason "run ended").
	EventReleased = messages.CoordReleased
	// EventAsked: the run asked a question (To, QuestionID, Bytes).
	EventAsked = messages.CoordAsked
	// EventReplied: the run replied to a peer's question (To, QuestionID,
	// Bytes).
	EventReplied = messages.CoordReplied
	// EventAnswered: the run's question was answered (From, QuestionID,
	// Bytes; MessageID when the answer went to the inbox: awaitLate).
	EventAnswered = messages.CoordAnswered
	// EventUnanswered: the run's question went without an answer
	// (QuestionID, To, Reason).
	EventUnanswered = messages.CoordUnanswered
)

// Event reports one coordination step of a run to the worker
// (Config.OnEvent), which records it on the run's event subject: the wire
// type messages.CoordEvent, published as is.
type Event = messages.CoordEvent
