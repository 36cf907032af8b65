package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// Questions the runs put to the operator (their ask tool), with an answer
// box: on /questions, on a run's page (its own) and on a group's page (the
// group's). Everything of a question is the agent's text: made visible,
// and escaped by the templates.

// questionRow is one open question as the pages show it.
type questionRow struct {
	ID, RunID, Group, Pool string
	// Question is the question's text, made visible (control characters
	// shown as pictures).
	Question string
	// Choices are the answers the run offers, made visible. The answer
	// sent is the choice as the run wrote it (ChoiceValues).
	Choices      []string
	ChoiceValues []string
	// Since and Until are when it was asked and when the run gives up.
	Since, Until time.Time
}

func newQuestionRow(q messages.CoordQuestion) questionRow {
	r := questionRow{ID: q.ID, RunID: visible(q.RunID), Group: visible(q.Group), Pool: visible(q.Pool), Question: visible(q.Question), Since: q.Time, Until: q.Until}
	for _, c := range q.Choices {
		r.Choices = append(r.Choices, visible(c))
		r.ChoiceValues = append(r.ChoiceValues, c)
	}
	return r
}

// questionsBox is what the "questions-box" template takes: the questions,
// and where the answer form sends the operator back to.
type questionsBox struct {
	Rows     []questionRow
	CSRF     string
	Back     string
	ReadOnly bool
	// MaxBytes is the longest answer (dispatcher.MaxAnswerBytes).
	MaxBytes int
}

// newQuestionsBox is the template function "questionsBox".
func newQuestionsBox(rows []questionRow, csrf string, readOnly bool, back string) questionsBox {
	return questionsBox{Rows: rows, CSRF: csrf, Back: back, ReadOnly: readOnly, MaxBytes: dispatcher.MaxAnswerBytes}
}

// questionDesk serves the questions runs put to the operator, and answers.
// It serves the questions page (GET /questions) and its answer form, and
// the question boxes of the overview, a run's page and a group's page.
// However many pages are open, it lists the questions at most once per
// memoMaxAge (a listing is a key-value watch of the questions bucket); an
// answer given here forgets that read.
type questionDesk struct {
	*core
	last memo[[]messages.CoordQuestion]
}

// open returns the questions to the operator that keep: every one (keep
// nil), or those keep says.
func (qd *questionDesk) open(ctx context.Context, keep func(messages.CoordQuestion) bool) ([]questionRow, error) {
	qs, err := qd.read(ctx)
	if err != nil {
		return nil, err
	}
	var rows []questionRow
	for _, q := range qs {
		if keep == nil || keep(q) {
			rows = append(rows, newQuestionRow(q))
		}
	}
	return rows, nil
}

// read returns the open questions to the operator
// (dispatcher.OpenQuestions) as read at most memoMaxAge ago. A failed read
// is logged. The slice is shared: read only.
func (qd *questionDesk) read(ctx context.Context) ([]messages.CoordQuestion, error) {
	return qd.last.get(ctx, func(ctx context.Context) ([]messages.CoordQuestion, error) {
		qs, err := qd.d.OpenQuestions(ctx)
		if err != nil {
			qd.cfg.Log.Warn().Err(err).Msg("console: read the runs' questions")
		}
		return qs, err
	})
}

// ofRun returns run id's open questions to the operator; none when they
// cannot be read.
func (qd *questionDesk) ofRun(ctx context.Context, id string) []questionRow {
	rows, _ := qd.open(ctx, func(q messages.CoordQuestion) bool { return q.RunID == id })
	return rows
}

// ofGroup returns the open questions to the operator of group g's runs;
// none when they cannot be read.
func (qd *questionDesk) ofGroup(ctx context.Context, g messages.GroupRef) []questionRow {
	rows, _ := qd.open(ctx, func(q messages.CoordQuestion) bool { return q.GroupRef() == g })
	return rows
}

// questionEventText is the timeline text of a question's coordination
// event (asked, replied, answered, unanswered), or the kind of any other.
func questionEventText(ce messages.CoordEvent) string {
	id := visible(ce.QuestionID)
	switch ce.Kind {
	case messages.CoordAsked:
		return fmt.Sprintf("asked question %s, %d bytes", id, ce.Bytes)
	case messages.CoordReplied:
		return fmt.Sprintf("replied to question %s, %d bytes", id, ce.Bytes)
	case messages.CoordAnswered:
		return fmt.Sprintf("question %s answered by %s, %d bytes", id, visible(ce.From), ce.Bytes)
	case messages.CoordUnanswered:
		return fmt.Sprintf("question %s: no answer (%s)", id, visible(ce.Reason))
	}
	return visible(string(ce.Kind))
}

// questionsData is the questions page's data.
type questionsData struct {
	Rows []questionRow
	// Answered is the question just answered from a console page.
	Answered string
	// Operator is who the console answers as (Config.Operator).
	Operator string
	Error    string
}

// serve answers GET /questions: every question a run waits on an
// operator's answer for, oldest first, each with an answer box.
func (qd *questionDesk) serve(w http.ResponseWriter, r *http.Request) {
	d := questionsData{Operator: qd.cfg.Operator}
	rows, err := qd.open(r.Context(), nil)
	if err != nil {
		d.Error = err.Error()
	}
	d.Rows = rows
	if id := r.URL.Query().Get("answered"); messages.ValidCoordQuestionID(id) {
		d.Answered = id
	}
	qd.render(w, r, "questions", page{Title: "Questions waiting for an operator", Nav: "questions", Data: d})
}

// questionsAlert says how many questions wait: the overview's alert line.
func questionsAlert(n int) string {
	if n == 1 {
		return "1 question of a run waits for an operator's answer"
	}
	return fmt.Sprintf("%d questions of runs wait for an operator's answer", n)
}

// answerBack is where the answer form sends the operator back to: a run's
// page (/runs/<id>) or a group's (/groups/<pool>/<group>), or /questions
// (anything else).
func answerBack(back string) string {
	if rest, ok := strings.CutPrefix(back, "/runs/"); ok && messages.ValidateToken("name", rest) == nil {
		return back
	}
	if rest, ok := strings.CutPrefix(back, "/groups/"); ok {
		pool, group, _ := strings.Cut(rest, "/")
		if (messages.GroupRef{Pool: pool, Name: group}).Validate() == nil {
			return back
		}
	}
	return "/questions"
}

// answer serves POST /questions/answer (form fields id, text or
// choice, back): dispatcher.AnswerQuestion as Config.Operator, what
// `jetcrew answer ID TEXT` does, then back to the page it came from.
func (qd *questionDesk) answer(w http.ResponseWriter, r *http.Request) {
	back := answerBack(r.PostFormValue("back"))
	id := r.PostFormValue("id")
	if !messages.ValidCoordQuestionID(id) {
		qd.message(w, r, http.StatusBadRequest, "Bad question id", fmt.Sprintf("%q is not a question id", visible(id)), back)
		return
	}
	text := r.PostFormValue("choice")
	if text == "" {
		text = strings.TrimSpace(r.PostFormValue("text"))
	}
	ctx, cancel := context.WithTimeout(r.Context(), qd.cfg.ActionTimeout)
	defer cancel()
	_, err := qd.d.AnswerQuestion(ctx, id, text, qd.cfg.Operator)
	qd.last.forget()
	switch {
	case errors.Is(err, dispatcher.ErrNoQuestion):
		qd.message(w, r, http.StatusConflict, "Not answered",
			id+": no question waits under this id any more: it was answered elsewhere, or the run stopped waiting (its timeout, or its end)", back)
		return
	case errors.Is(err, dispatcher.ErrAnswered):
		qd.message(w, r, http.StatusConflict, "Not answered", id+": another operator answered it first", back)
		return
	case err != nil:
		qd.message(w, r, http.StatusBadRequest, "Not answered", err.Error(), back)
		return
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, back+sep+"answered="+url.QueryEscape(id), http.StatusSeeOther)
}
