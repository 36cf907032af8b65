package coordination

import (
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// Names of the JetStream resources coordination uses: the wire contract,
// defined in package messages (so a client needs nothing else); these are
// the same values.
const (
	// StreamName is the limits-retention stream holding every coordination
	// message, subjects jetcrew.coord.>.
	StreamName = messages.StreamCoord
	// ViewStreamName mirrors StreamName for whoever reads the
	// conversations. StreamName's consumers are the runs' inboxes, which
	// only workers may create, change, read from or delete (see package
	// roles); everyone else follows the mirror.
	ViewStreamName = messages.StreamCoordView
	// BucketPeers is the presence key-value bucket: one key
	// "<pool>.<group>.<run_id>" per queued or running run that has a session,
	// holding a Presence document. Keys expire PeerTTL after their last
	// refresh.
	BucketPeers = messages.BucketCoordPeers
	// BucketClaims holds the groups' file claims: one key
	// "<pool>.<group>" (ClaimKey) per group with a claim, a messages.CoordClaims document
	// written with compare-and-set by the workers serving its runs.
	BucketClaims = messages.BucketCoordClaims
	// BucketQuestions holds the open questions of the runs' ask calls and
	// their answers (see messages.BucketCoordQuestions).
	BucketQuestions = messages.BucketCoordQuestions
	// SubjectPrefix prefixes every coordination subject:
	// jetcrew.coord.<pool>.<group>.<recipient>.
	SubjectPrefix = messages.SubjectCoordPrefix
	// HeaderFrom carries the sender's run id. The worker sets it on every
	// message a run sends, from the socket the message came through,
	// whatever the agent wrote. A message without it is from the operator.
	HeaderFrom = messages.HeaderFrom
	// InboxPrefix prefixes the name of a run's inbox consumer:
	// "inbox-<run_id>".
	InboxPrefix = "inbox-"
)

// Reserved recipients (the last subject token). Every other recipient is a
// run id; a run may therefore not be called "all" or "operator".
const (
	// RecipientAll addresses every run of the group but the sender.
	RecipientAll = messages.RecipientAll
	// RecipientOperator addresses the people watching the group; no run
	// reads it.
	RecipientOperator = messages.RecipientOperator
)

// Durations and sizes of the coordination resources.
const (
	// DuplicateWindow is JETCREW_COORD's duplicate window: a send repeated
	// with the same idempotency key within it sends nothing new.
	DuplicateWindow = 10 * time.Minute
	// MaxAge is how long coordination messages are kept.
	MaxAge = 7 * 24 * time.Hour
	// MaxMsgBytes is the largest message the stream stores, headers
	// included, in bytes. A larger operator publish is dropped by the
	// server (a `nats req` shows the error; a `nats pub` does not).
	MaxMsgBytes = 64 << 10
	// PeerTTL is how long a presence key lives without a refresh. A Session
	// refreshes its key every PeerTTL/3, so a worker that dies takes its
	// runs out of their groups' peer lists within PeerTTL.
	PeerTTL = time.Minute
)

// Paths inside a run container that mcp.json names: the layout is
// package messages' (messages.ContainerRunDir, messages.SocketName, ...).
const (
	// BridgePath is where the worker mounts the bridge binary, read-only
	// (messages.ContainerBridgePath).
	BridgePath = messages.ContainerBridgePath
	// MCPConfigName is the MCP configuration's file name in the run's
	// directory (messages.MCPConfigName).
	MCPConfigName = messages.MCPConfigName
)

// Subject returns the subject of a message to recipient in group g:
// jetcrew.coord.<pool>.<group>.<recipient>. recipient is a run id,
// RecipientAll or RecipientOperator. It does not validate its arguments
// (see messages.GroupRef.Validate).
func Subject(g messages.GroupRef, recipient string) string {
	return messages.SubjectCoord(g, recipient)
}

// SubjectGroup returns the wildcard matching every message of group g,
// jetcrew.coord.<pool>.<group>.>, what `nats sub` takes to show a
// conversation.
func SubjectGroup(g messages.GroupRef) string { return messages.SubjectCoordGroup(g) }

// InboxName returns the name of run id's durable inbox consumer,
// "inbox-<run_id>".
func InboxName(runID string) string {
	return InboxPrefix + runID
}

// ClaimKey returns group g's key in BucketClaims, "<pool>.<group>". One key
// holds the whole group's claims, so that checking a claim against every
// other and writing it is one compare-and-set: with a key per claim, two
// runs could each check, find nothing, and write overlapping claims.
func ClaimKey(g messages.GroupRef) string { return g.Key() }

// PeerKey returns run id's presence key in BucketPeers,
// "<pool>.<group>.<run_id>".
func PeerKey(g messages.GroupRef, runID string) string {
	return g.Key() + "." + runID
}

// peersOf returns the wildcard of group g's presence keys,
// "<pool>.<group>.*".
func peersOf(g messages.GroupRef) string { return g.Key() + ".*" }
