package profile

import (
	"regexp"
	"strconv"
)

// Answer is the first answer an agent CLI reported from its model in a
// run (its first assistant message or result), as the parser read it: a
// model's answer, or the model API's refusal of the request.
type Answer struct {
	// APIStatus is the HTTP status with which the model API refused the
	// request (Claude Code's api_error_status, or the status in its "API
	// Error: NNN" text); 0 when the model answered.
	APIStatus int
	// Text is the refusal's text, "" for a model's answer.
	Text string
}

// OnFirstAnswer sets f to be called once with the CLI's first model answer.
// f is called from the output goroutine, with Claude Code's first
// assistant event or result. A nil Parser ignores it.
func (p *Parser) OnFirstAnswer(f func(Answer)) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onAnswer = f
}

// reportAnswer passes a to onAnswer, the first time only; p.mu is held.
func (p *Parser) reportAnswer(a Answer) {
	if !p.answered && p.onAnswer != nil {
		p.answered = true
		p.onAnswer(a)
	}
}

// apiErrorRE reads the status of Claude Code's API error text: "API
// Error: 400 {...}".
var apiErrorRE = regexp.MustCompile(`^API Error: ([1-5][0-9][0-9])\b`)

// apiErrorStatus returns the HTTP status in an "API Error: NNN ..." text,
// 0 when text is no such error.
func apiErrorStatus(text string) int {
	m := apiErrorRE.FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
