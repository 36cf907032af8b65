package tests

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
)

// agentAnswer is one ask step's result in the fixture agent's report.
type agentAnswer struct {
	QuestionID string `json:"question_id"`
	Status     string `json:"status"`
	Answer     string `json:"answer"`
	From       string `json:"from"`
	Note       string `json:"note"`
}

// A real run's agent asks the operator through its bridge and waits; the
// question shows on `jetcrew questions`, `jetcrew answer` (as the operator
// role of an auth-enabled server) answers it, and the agent's ask returns
// the answer. Its second question, which nobody answers, returns "no
// answer" after its timeout; both are coordination events of the run.
func TestQuestionsThatWait(t *testing.T) {
	needsDocker(t)
	env := coordUp(t, "--auth")
	const group, id = "qa", "qa-asker"
	submitAgent(t, env.url, id, group, `ask operator 120 "Ship it?"; ask operator 2 "anyone there?"`)

	var qid string
	require.Eventually(t, func() bool {
		r := run(t, env.url, jetcrewBin, "questions")
		line := strings.TrimSpace(r.stdout)
		if r.code != 0 || line == "" {
			return false
		}
		f := strings.Fields(line)
		require.Equal(t, []string{id, group}, f[1:3], line)
		require.Contains(t, line, "Ship it?")
		qid = f[0]
		return true
	}, 2*time.Minute, 200*time.Millisecond, "the run's question never showed on jetcrew questions")

	r := run(t, env.url, jetcrewBin, "answer", qid, "yes, ship it")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, qid+": answered run "+id+"\n", r.stdout)

	rep, _ := finishedAgent(t, env.url, id, group)
	require.Len(t, rep.Answers, 2)
	require.Equal(t, agentAnswer{QuestionID: qid, Status: "answered", Answer: "yes, ship it", From: "operator"}, rep.Answers[0])
	require.Equal(t, "no answer", rep.Answers[1].Status)
	require.Contains(t, rep.Answers[1].Note, "timeout (2s)")

	evs := coordEvents(t, env.url, id)
	var kinds []coordination.EventKind
	for _, ev := range evs {
		switch ev.Kind {
		case coordination.EventAsked, coordination.EventAnswered, coordination.EventUnanswered:
			kinds = append(kinds, ev.Kind)
		}
	}
	require.Equal(t, []coordination.EventKind{coordination.EventAsked, coordination.EventAnswered, coordination.EventAsked, coordination.EventUnanswered}, kinds)

	r = run(t, env.url, jetcrewBin, "questions")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout, "no question is left open")
	r = run(t, env.url, jetcrewBin, "answer", qid, "again")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no question waits under this id")
}
