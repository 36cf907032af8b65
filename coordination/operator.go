package coordination

import (
	"strings"

	"github.com/jetcrew/jetcrew/messages"
)

// OperatorSuffix ends the subject of a message an operator sends to the runs
// of a group: jetcrew.coord.<pool>.<group>.<recipient>.operator
// (SubjectFromOperator). Runs read it as from "operator" whatever its
// headers say. Only workers may publish on the five-token subjects runs'
// messages travel on; an operator's
// NATS user is allowed only these (see package roles), so nobody outside a
// run's bridge can speak as that run.
const OperatorSuffix = messages.RecipientOperator

// SubjectFromOperator returns the subject of an operator's message to
// recipient (a run id or RecipientAll) in group g:
// jetcrew.coord.<pool>.<group>.<recipient>.operator. It does not validate
// its arguments; "*" makes the wildcard a permission needs.
func SubjectFromOperator(g messages.GroupRef, recipient string) string {
	return messages.SubjectCoordFromOperator(g, recipient)
}

// inboxFilters are the subjects a run's inbox reads: messages to the run and
// to "all", from runs and from the operator.
func inboxFilters(run RunInfo) []string {
	g := run.GroupRef()
	return []string{
		Subject(g, run.RunID), Subject(g, RecipientAll),
		SubjectFromOperator(g, run.RunID), SubjectFromOperator(g, RecipientAll),
	}
}

// Sender returns who sent a coordination message on subject with the
// Jetcrew-From header from, and to whom, exactly as a run's inbox delivers
// it: a message on an operator subject (SubjectFromOperator) is from
// RecipientOperator whatever from says (the worker re-stamps it), as is one
// without a valid run id in from; to is the recipient token (a run id,
// RecipientAll or RecipientOperator), never the operator suffix. Whoever
// shows a conversation (the console) derives the sender here, so that it
// shows what the runs read and never a header a publisher chose.
func Sender(subject, from string) (sentBy, to string) {
	rest := strings.TrimPrefix(subject, SubjectPrefix+".")
	toks := strings.Split(rest, ".")
	if len(toks) == 4 && toks[3] == OperatorSuffix {
		return RecipientOperator, toks[2]
	}
	to = toks[len(toks)-1]
	if from == "" || messages.ValidateToken("from", from) != nil {
		from = RecipientOperator
	}
	return from, to
}
