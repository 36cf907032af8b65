package messages

import "time"

// Names of the coordination resources clients address (with the stock NATS
// CLI, or decoding coordination events), defined here so a client needs
// only this package. Package coordination uses the same values.
const (
	// StreamCoord is the limits-retention stream holding every coordination
	// message, subjects jetcrew.coord.>.
	StreamCoord = "JETCREW_COORD"
	// StreamCoordView mirrors StreamCoord for everyone who reads the
	// conversations (the console, `nats sub --stream`): StreamCoord's
	// consumers are the runs' inboxes, which only workers may create, read
	// or change.
	StreamCoordView = "JETCREW_COORD_VIEW"
	// BucketCoordPeers is the presence key-value bucket: one key
	// "<pool>.<group>.<run_id>" per queued or running run that has a
	// session.
	BucketCoordPeers = "jetcrew-coord-peers"
	// BucketCoordClaims holds the groups' file claims: one key
	// "<pool>.<group>" (GroupRef.Key) per group with a claim, its value a CoordClaims document, written
	// only by workers with compare-and-set (see package coordination).
	BucketCoordClaims = "jetcrew-coord-claims"
	// SubjectCoordPrefix prefixes every coordination subject:
	// jetcrew.coord.<pool>.<group>.<recipient>.
	SubjectCoordPrefix = "jetcrew.coord"
	// HeaderFrom carries the sender's run id on a coordination message. The
	// worker sets it on every message a run sends, from the socket the
	// message came through, whatever the agent wrote. A message without it
	// is from the operator.
	HeaderFrom = "Jetcrew-From"
)

// Reserved coordination recipients (the last subject token). Every other
// recipient is a run id; a run may therefore not be called "all" or
// "operator".
const (
	// RecipientAll addresses every run of the group but the sender.
	RecipientAll = "all"
	// RecipientOperator addresses the people watching the group (they read
	// with `nats sub 'jetcrew.coord.<pool>.<group>.>'`); no run reads it.
	RecipientOperator = "operator"
)

// SubjectCoord returns the subject of a coordination message to recipient
// in group g: jetcrew.coord.<pool>.<group>.<recipient>. recipient is a run
// id, RecipientAll or RecipientOperator. It does not validate its arguments
// (see GroupRef.Validate).
func SubjectCoord(g GroupRef, recipient string) string {
	return SubjectCoordPrefix + "." + g.Key() + "." + recipient
}

// SubjectCoordFromOperator returns the subject of an operator's message to
// recipient (a run id or RecipientAll) in group g:
// jetcrew.coord.<pool>.<group>.<recipient>.operator. A run reads a message
// on it as from RecipientOperator whatever its headers say. It does not
// validate its arguments; "*" makes the wildcard a permission needs.
func SubjectCoordFromOperator(g GroupRef, recipient string) string {
	return SubjectCoord(g, recipient) + "." + RecipientOperator
}

// SubjectCoordGroup returns the wildcard matching every coordination
// message of group g, jetcrew.coord.<pool>.<group>.>.
func SubjectCoordGroup(g GroupRef) string {
	return SubjectCoordPrefix + "." + g.Key() + ".>"
}

// CoordEventKind says what happened in a run's coordination session.
type CoordEventKind string

// Coordination event kinds.
const (
	// CoordConnected: the run's bridge reached the socket for the first
	// time in this session (it announces itself when it starts).
	CoordConnected CoordEventKind = "connected"
	// CoordSent: the run sent a message (To, MessageID, Bytes, Duplicate).
	CoordSent CoordEventKind = "sent"
	// CoordRead: the run read messages from its inbox (MessageIDs).
	CoordRead CoordEventKind = "read"
	// CoordRefused: a send or inbox call was refused (To, Reason): bad
	// recipient, unknown peer, too large, rate limited, or NATS
	// unreachable.
	CoordRefused CoordEventKind = "refused"
	// CoordClaimed: the run claimed paths (Paths, Reason).
	CoordClaimed CoordEventKind = "claimed"
	// CoordReleased: the run released paths (Paths), or the worker released
	// every claim of a run that ended (Paths, Reason "run ended").
	CoordReleased CoordEventKind = "released"
)

// CoordEvent is the JSON body of an EventCoord event
// (jetcrew.events.<run_id>.coord): one coordination step of a run.
type CoordEvent struct {
	// RunID is the run whose session it is.
	RunID string `json:"run_id"`
	// Group is the run's group.
	Group string `json:"group"`
	// Kind says what happened.
	Kind CoordEventKind `json:"kind"`
	// Time is when it happened.
	Time time.Time `json:"time"`
	// To is the recipient of a send (CoordSent, CoordRefused on send).
	To string `json:"to,omitempty"`
	// MessageID is the id of the message sent (CoordSent).
	MessageID string `json:"message_id,omitempty"`
	// Bytes is the body size of the message sent, in bytes (CoordSent).
	Bytes int `json:"bytes,omitempty"`
	// Duplicate is true when a send's idempotency key matched an earlier
	// send and nothing new was sent (CoordSent).
	Duplicate bool `json:"duplicate,omitempty"`
	// MessageIDs are the ids of the messages read, oldest first (CoordRead).
	MessageIDs []string `json:"message_ids,omitempty"`
	// Reason is the error text the agent was given (CoordRefused).
	Reason string `json:"reason,omitempty"`
	// Count is, for a CoordRefused about rate limiting, how many calls were
	// refused for their rate since the last such event (they are counted,
	// not reported one by one); 0 for every other event.
	Count int `json:"count,omitempty"`
	// Paths are the patterns claimed or released (CoordClaimed,
	// CoordReleased), or refused (CoordRefused on claim or release).
	Paths []string `json:"paths,omitempty"`
	// QuestionID names the question asked, replied to, answered or left
	// unanswered (CoordAsked, CoordReplied, CoordAnswered, CoordUnanswered,
	// CoordRefused on ask or reply).
	QuestionID string `json:"question_id,omitempty"`
	// From is who answered the run's question (CoordAnswered): a run id or
	// "operator".
	From string `json:"from,omitempty"`
	// SteerID is the steer's id (CoordSteered).
	SteerID string `json:"steer_id,omitempty"`
	// Outcome is what became of a steer (CoordSteered).
	Outcome SteerOutcome `json:"outcome,omitempty"`
}

// CoordClaims is the value of a group's key in BucketCoordClaims: every
// claim of the group's runs. A claim is live while its holder's key in
// BucketCoordPeers exists, is queued or running and names the claim's
// Session; any other claim is stale (its run ended, its worker died, or a
// later attempt of the run has a session of its own): no call counts it,
// and the next write of the group drops it.
type CoordClaims struct {
	// Claims are the group's claims, ordered by holder, then pattern.
	Claims []CoordClaim `json:"claims"`
}

// CoordClaim is one claim: a path or glob, relative to the workspace,
// held by one run.
type CoordClaim struct {
	// Pattern is the claimed path or glob (path.Match syntax per segment,
	// "**" as a whole segment for any number of segments). It covers
	// every path it matches and everything under them.
	Pattern string `json:"pattern"`
	// RunID is the holder, stamped by the worker from the run's socket.
	RunID string `json:"run_id"`
	// Reason is the holder's reason, as it gave it (text, shown inert).
	Reason string `json:"reason,omitempty"`
	// Since is when the holder first claimed it.
	Since time.Time `json:"since"`
	// Session is the holder's coordination session (one attempt of the
	// run on one worker) that made the claim: the Session of the run's
	// presence in BucketCoordPeers.
	Session string `json:"session"`
}
