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
// answer" after its timeout; both are coordination events of the run. A
// run of a 40-second timeout asking for 600 seconds gets "no answer" once
// its remaining time (less 10 s) has passed, saying the wait was cut.
func TestQuestionsThatWait(t *testing.T) {
	needsDocker(t)
	env := coordUp(t, "--auth")
	const group, id = "qa", "qa-asker"
	const shortGroup, short = "qa-short", "qa-short"
	submitAgent(t, env.url, id, group, `ask operator 120 "Ship it?"; ask operator 2 "anyone there?"`)
	r := run(t, env.url, jetcrewBin, "submit", "--profile", "agent", "--id", short, "--group", shortGroup, "--timeout", "40s",
		`ask operator 600 "longer than my run?"`)
	require.Equal(t, 0, r.code, r.stderr)

	var qid string
	require.Eventually(t, func() bool {
		r := run(t, env.url, jetcrewBin, "questions")
		line := strings.TrimSpace(r.stdout)
		if r.code != 0 || line == "" {
			return false
		}
		for _, l := range strings.Split(line, "\n") {
			if f := strings.Fields(l); len(f) > 3 && f[1] == id {
				require.Equal(t, group, f[2], l)
				require.Contains(t, l, "Ship it?")
				qid = f[0]
			}
		}
		return qid != ""
	}, 2*time.Minute, 200*time.Millisecond, "the run's question never showed on jetcrew questions")

	r = run(t, env.url, jetcrewBin, "answer", qid, "yes, ship it")
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

	rep, _ = finishedAgent(t, env.url, short, shortGroup)
	require.Len(t, rep.Answers, 1)
	require.Equal(t, "no answer", rep.Answers[0].Status)
	require.Contains(t, rep.Answers[0].Note, "your run's remaining time")

	r = run(t, env.url, jetcrewBin, "questions")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout, "no question is left open")
	r = run(t, env.url, jetcrewBin, "answer", qid, "again")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no question waits under this id")
}
