package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// sender serves the operator's messages to one run or to a group's runs:
// a steer of a run, or a message to one run of a group or to all of them,
// sent as the operator.
type sender struct {
	*core
}

// toRun serves POST /runs/{id}/send (form field text): a steer of the
// run, as the operator (dispatcher.Steer, what `jetcrew send RUN_ID TEXT`
// does): written to a running agent's standard input when its CLI takes
// streamed input, and put in its inbox. Delivered goes back to the run's
// page; queued (inbox only) and refused say why, on a page of their own.
func (s *sender) toRun(w http.ResponseWriter, r *http.Request) {
	id, ok := s.runID(w, r)
	if !ok {
		return
	}
	back := "/runs/" + url.PathEscape(id)
	text := r.PostFormValue("text")
	if text == "" {
		s.message(w, r, http.StatusBadRequest, "Not sent", "the message is empty", back)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ActionTimeout)
	defer cancel()
	reply, err := s.d.Steer(ctx, id, text, "")
	switch {
	case err != nil:
		s.message(w, r, http.StatusBadGateway, "Not sent", err.Error(), back)
	case reply.Outcome == messages.SteerDelivered:
		http.Redirect(w, r, back, http.StatusSeeOther)
	case reply.Outcome == messages.SteerQueued:
		s.message(w, r, http.StatusOK, "Queued", "In the run's inbox, not written to its agent's input: "+reply.Reason, back)
	default:
		s.message(w, r, http.StatusConflict, "Not sent", "Refused ("+reply.Code+"): "+reply.Reason, back)
	}
}

// toGroup serves POST /groups/{pool}/{group}/send (form fields to, a
// run id or "all", and text): the text to that run of the group, or to all
// of them, as the operator (dispatcher.Send), then back to the group's
// page.
func (s *sender) toGroup(w http.ResponseWriter, r *http.Request) {
	g, err := groupRef(r)
	if err != nil {
		s.message(w, r, http.StatusBadRequest, "Bad group", err.Error(), "/runs")
		return
	}
	s.send(w, r, g, r.PostFormValue("to"), groupPath(g))
}

// send sends the form's text to recipient to of group and redirects to
// back. Who sends is the subject's, never the form's: the message goes on
// the operator's subject with no sender header.
func (s *sender) send(w http.ResponseWriter, r *http.Request, group messages.GroupRef, to, back string) {
	text := r.PostFormValue("text")
	switch {
	case text == "":
		s.message(w, r, http.StatusBadRequest, "Not sent", "the message is empty", back)
		return
	case len(text) > coordination.MaxMsgBytes:
		s.message(w, r, http.StatusBadRequest, "Not sent",
			fmt.Sprintf("the message is %d bytes; a group's stream keeps messages of at most %d", len(text), coordination.MaxMsgBytes), back)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ActionTimeout)
	defer cancel()
	if _, err := s.d.Send(ctx, group, to, text); err != nil {
		s.message(w, r, http.StatusBadGateway, "Not sent", err.Error(), back)
		return
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}
