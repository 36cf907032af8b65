package messages

import (
	"strconv"
	"strings"
	"time"
)

// The key-value buckets of hosts an operator approves live (profile key
// egress_ask).
const (
	// BucketEgressAsks holds the questions waiting for an operator
	// (EgressAskKey: an EgressAsk, deleted once answered or given up) and
	// the operators' answers (EgressAnswerKey: an EgressAnswer). Keys live
	// EgressAskMaxAge.
	BucketEgressAsks = "jetcrew-egress-asks"
	// BucketEgressApprovals holds the answers an operator gave for a
	// profile from now on (EgressApprovalKey: an EgressAnswer); they last
	// until deleted.
	BucketEgressApprovals = "jetcrew-egress-approvals"
	// EgressAskMaxAge is the MaxAge of BucketEgressAsks.
	EgressAskMaxAge = time.Hour
)

// EgressAsk is a connection of a run to a host of its profile's egress_ask
// list, held until an operator answers (the value of an EgressAskKey).
type EgressAsk struct {
	// ID names the question: "<run_id>.<n>", what jetcrew egress allow
	// and deny take.
	ID string `json:"id"`
	// RunID, Profile and Worker say whose connection it is.
	RunID   string `json:"run_id"`
	Profile string `json:"profile"`
	Worker  string `json:"worker,omitempty"`
	// Host and Port are what the run asked for.
	Host string `json:"host"`
	Port int    `json:"port"`
	// Time is when the question was put; Until when it is given up
	// (refused).
	Time  time.Time `json:"time"`
	Until time.Time `json:"until"`
}

// EgressAnswer is an operator's answer to an EgressAsk (the value of an
// EgressAnswerKey), or for a profile from now on (of an
// EgressApprovalKey).
type EgressAnswer struct {
	// Allow is true to allow the connection.
	Allow bool `json:"allow"`
	// Scope is "run" (this run's connections to the host) or "profile"
	// (every run of the profile from now on).
	Scope string `json:"scope"`
	// By names who answered, as the answering client said it.
	By string `json:"by"`
	// Time is when the answer was given.
	Time time.Time `json:"time"`
}

// EgressAskKey returns the key of question id ("<run_id>.<n>") in
// BucketEgressAsks: "ask.<run_id>.<n>".
func EgressAskKey(id string) string { return "ask." + id }

// EgressAnswerKey returns the key of the answer to question id:
// "answer.<run_id>.<n>".
func EgressAnswerKey(id string) string { return "answer." + id }

// EgressAskID returns the id of run runID's n-th question.
func EgressAskID(runID string, n int) string { return runID + "." + strconv.Itoa(n) }

// ParseEgressAskID splits a question id into its run id, or returns false
// for one that is not "<run_id>.<n>" with a valid run id.
func ParseEgressAskID(id string) (runID string, ok bool) {
	run, n, found := strings.Cut(id, ".")
	if !found || ValidateToken("run id", run) != nil {
		return "", false
	}
	if _, err := strconv.ParseUint(n, 10, 31); err != nil {
		return "", false
	}
	return run, true
}

// EgressApprovalKey returns the key of an answer for profile's runs from
// now on for host:port in BucketEgressApprovals:
// "<profile>.<host>.<port>" (the host's dots are key separators).
func EgressApprovalKey(profile, host string, port int) string {
	return profile + "." + host + "." + strconv.Itoa(port)
}
