package messages

import (
	"strings"
	"time"
)

// Questions that wait (issue 29): a run's ask tool puts a question to a
// peer, to its group or to the operator and waits for the answer.
const (
	// BucketCoordQuestions holds the questions waiting for an answer
	// (CoordQuestionKey: a CoordQuestion, written by the asker's worker and
	// deleted once answered, timed out or its run ended), the operators'
	// answers (CoordAnswerKey) and the peers' replies (CoordReplyKey), both
	// CoordAnswer documents. Every key carries a per-key TTL (the question's
	// Until plus CoordQuestionGrace; an answer's CoordAnswerTTL), so a dead
	// worker's questions leave the open list by themselves.
	BucketCoordQuestions = "jetcrew-coord-questions"
	// CoordQuestionGrace is how long a question's key outlives its Until:
	// room for the asker's worker to read a last-moment answer and delete
	// the key itself.
	CoordQuestionGrace = time.Minute
	// CoordAnswerTTL is how long an answer or reply key lives: the asker's
	// worker reads and deletes it at once; the TTL removes one whose asker
	// is gone.
	CoordAnswerTTL = 10 * time.Minute
	// CoordQuestionIDPrefix starts every question id: "q" and 16 lowercase
	// base32 characters.
	CoordQuestionIDPrefix = "q"
	// HeaderQuestion carries the question id on the coordination message
	// that puts a run's question to a peer, to its group or to the
	// operator (set by the asker's worker; a message on an operator
	// subject never carries a question).
	HeaderQuestion = "Jetcrew-Question"
	// HeaderChoices carries the question's choices, a JSON array of
	// strings, on the same message.
	HeaderChoices = "Jetcrew-Choices"
	// HeaderAnswerTo carries a question id on the message that puts an
	// answer in the asking run's inbox: the answer came after the ask
	// call returned "no answer" early (its MCP client sent no progress
	// token) while the question stayed open. Set by the asker's worker.
	HeaderAnswerTo = "Jetcrew-Answer-To"
)

// Coordination event kinds of questions (CoordEvent.QuestionID names the
// question).
const (
	// CoordAsked: the run asked a question (To, QuestionID, Bytes).
	CoordAsked CoordEventKind = "asked"
	// CoordReplied: the run replied to a peer's question (To: the asker,
	// QuestionID, Bytes).
	CoordReplied CoordEventKind = "replied"
	// CoordAnswered: the run's question got its answer (From: who answered,
	// a run id or "operator"; QuestionID, Bytes; MessageID when it came
	// after the ask call returned and was put in the run's inbox).
	CoordAnswered CoordEventKind = "answered"
	// CoordUnanswered: the run's question left the open list without an
	// answer (QuestionID, Reason: "timeout", "run ended" or "call ended").
	CoordUnanswered CoordEventKind = "unanswered"
)

// CoordQuestion is an open question: the value of its CoordQuestionKey.
// Everything in it is written by the asker's worker; Question and Choices
// are the agent's text, shown inert.
type CoordQuestion struct {
	// ID is the question id ("q" and 16 base32 characters), what reply and
	// jetcrew answer take.
	ID string `json:"id"`
	// RunID is the asking run, stamped by its worker from the run's socket.
	RunID string `json:"run_id"`
	// Group is the asking run's group, and Pool its pool (GroupRef;
	// DefaultPool when empty).
	Group string `json:"group"`
	Pool  string `json:"pool"`
	// To is a peer's run id, RecipientAll or RecipientOperator.
	To string `json:"to"`
	// Question is the question's text.
	Question string `json:"question"`
	// Choices, when set, are the answers the asker offers (an answer may
	// still be any text).
	Choices []string `json:"choices,omitempty"`
	// Time is when it was asked; Until when the asker stops waiting.
	Time  time.Time `json:"time"`
	Until time.Time `json:"until"`
	// Session is the asker's coordination session (its presence's).
	Session string `json:"session"`
}

// CoordAnswer is the answer to a question: the value of its CoordAnswerKey
// (an operator's) or CoordReplyKey (a peer's).
type CoordAnswer struct {
	// Answer is the answer's text, shown inert.
	Answer string `json:"answer"`
	// By is who answered: on a reply key, the replying run's id, stamped
	// by its worker; on an answer key, the operator's name as the answering
	// client gave it (the run is told "operator" whatever it says).
	By string `json:"by"`
	// Time is when it was given.
	Time time.Time `json:"time"`
}

// CoordQuestionKey returns question id's key in BucketCoordQuestions:
// "ask.<pool>.<group>.<run_id>.<id>", so that a group's and a run's
// questions are one wildcard each ("ask.<pool>.<group>.>",
// "ask.<pool>.<group>.<run_id>.*").
func CoordQuestionKey(g GroupRef, runID, id string) string {
	return "ask." + g.Key() + "." + runID + "." + id
}

// CoordQuestionByID returns the wildcard matching question id's key
// whatever its pool, group and run: "ask.*.*.*.<id>".
func CoordQuestionByID(id string) string { return "ask.*.*.*." + id }

// GroupRef returns the group of the asking run: its own when Group is its
// run id (a request's group is never its own id); a question without a
// pool is of DefaultPool.
func (q CoordQuestion) GroupRef() GroupRef {
	pool := q.Pool
	if pool == "" {
		pool = DefaultPool
	}
	return GroupRef{Pool: pool, Name: q.Group, Own: q.Group == q.RunID}
}

// CoordAnswerKey returns the key of an operator's answer to question id:
// "answer.<id>". Operators may write it (see package roles), nothing else
// of the bucket.
func CoordAnswerKey(id string) string { return "answer." + id }

// CoordReplyKey returns the key of a peer's reply to question id:
// "reply.<id>", written only by workers.
func CoordReplyKey(id string) string { return "reply." + id }

// ValidCoordQuestionID reports whether id has the form of a question id:
// CoordQuestionIDPrefix and 16 characters a-z or 2-7.
func ValidCoordQuestionID(id string) bool {
	rest, ok := strings.CutPrefix(id, CoordQuestionIDPrefix)
	if !ok || len(rest) != 16 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}
