package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// askedReadTimeout bounds reading a run's request for its page.
const askedReadTimeout = 3 * time.Second

// askedView is what the run page shows of what a run was asked to do:
// its request's prompt (or, when the request does not decode, its body),
// the other fields of the request, and the command its profile ran.
type askedView struct {
	// Found is true when the request was read; From says where.
	Found bool
	From  string
	// Prompt is the request's prompt, made visible; Raw, when the
	// request does not decode, its body made visible instead.
	Prompt, Raw string
	// Facts are the request's other fields: timeout, workspace, env
	// names.
	Facts []fact
	// Missing says why the request is not shown.
	Missing string
	// Command is the receipt's argv, shell-quoted and made visible:
	// "<prompt>" stands where the prompt was passed.
	Command string
}

// asked reads what run st was asked to do (dispatcher.Asked): from
// JETCREW_RUNS while it waits or runs, else its dead letter.
func (p *runPage) asked(ctx context.Context, st *messages.RunState) askedView {
	var v askedView
	if st.Receipt != nil && len(st.Receipt.Argv) > 0 {
		v.Command = visible(shellJoin(st.Receipt.Argv))
	}
	ctx, cancel := context.WithTimeout(ctx, askedReadTimeout)
	defer cancel()
	a, err := p.d.Asked(ctx, st)
	switch {
	case errors.Is(err, dispatcher.ErrRequestGone):
		return p.recordedPrompt(ctx, st, v)
	case err != nil:
		v.Missing = visible("Its request could not be read: " + err.Error())
		return v
	}
	v.Found = true
	v.From = "its request in JETCREW_RUNS"
	if a.From == dispatcher.AskedFromDeadLetter {
		v.From = "its dead letter in JETCREW_FAILED"
	}
	if !a.Decoded {
		v.Raw = visible(string(a.Body))
		return v
	}
	r := a.Request
	v.Prompt = visible(r.Prompt)
	if r.Timeout > 0 {
		v.Facts = append(v.Facts, fact{Label: "Timeout", Text: time.Duration(r.Timeout).String()})
	}
	if w := r.Workspace; w != nil {
		if w.Git != nil {
			v.Facts = append(v.Facts, fact{Label: "Workspace", Text: visible(w.Git.URL + " " + cmp.Or(w.Git.Ref, "HEAD"))})
		} else {
			v.Facts = append(v.Facts, fact{Label: "Workspace", Text: visible(w.BucketOrDefault() + "/" + w.Name + " (" + w.Digest + ")")})
		}
	}
	if len(r.Env) > 0 {
		names := make([]string, 0, len(r.Env))
		for k := range r.Env {
			names = append(names, k)
		}
		slices.Sort(names)
		v.Facts = append(v.Facts, fact{Label: "Env", Text: visible(strings.Join(names, " "))})
	}
	return v
}

// recordedPrompt fills v from the prompt run st's worker recorded on its
// latest started event (dispatcher.RecordedPrompt), for a run whose
// request is gone (it succeeded or was cancelled).
func (p *runPage) recordedPrompt(ctx context.Context, st *messages.RunState, v askedView) askedView {
	ev, err := p.d.RecordedPrompt(ctx, st.ID)
	switch {
	case errors.Is(err, dispatcher.ErrRequestGone):
		v.Missing = "Its request is no longer kept (a worker removes it from JETCREW_RUNS when the run ends; only a run that failed, " +
			"timed out or stalled leaves it in a dead letter), and the run has no started event that recorded its prompt " +
			"(it never started, or its events expired)."
		return v
	case err != nil:
		v.Missing = visible("Its prompt could not be read: " + err.Error())
		return v
	}
	v.Found, v.From = true, "its started event in JETCREW_EVENTS: the prompt as its worker recorded it, secrets masked"
	v.Prompt = visible(ev.Prompt)
	if ev.PromptBytes > 0 {
		v.Facts = append(v.Facts, fact{Label: "Prompt", Text: fmt.Sprintf("its first %d of %d bytes", len(ev.Prompt), ev.PromptBytes)})
	}
	return v
}

// shellJoin returns argv as a POSIX shell would read it back, each
// argument single-quoted unless it is plain.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && !strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) || a == "<prompt>" {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// command is one copyable jetcrew command of a run's page.
type command struct {
	// Kind names it ("watch", "cancel", ...): the page's script shows or
	// hides it as the run's state changes.
	Kind string
	// Text is the command line.
	Text string
	// Hidden is true when it does not apply to the run now.
	Hidden bool
}

// runCommands returns the commands the run page offers to copy for st:
// watch always, cancel while it is not final, replay once it failed,
// timed out or stalled.
func runCommands(st *messages.RunState) []command {
	return []command{
		{Kind: "watch", Text: "jetcrew watch " + st.ID},
		{Kind: "cancel", Text: "jetcrew cancel " + st.ID, Hidden: st.State.Final()},
		{Kind: "replay", Text: "jetcrew replay " + st.ID, Hidden: !st.State.Unsuccessful()},
	}
}
