package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
)

// groupPage serves a group's page: its runs compared, its conversation live.
// The page (GET /groups/{pool}/{group}) also lists the questions its runs
// wait on an operator's answer for.
type groupPage struct {
	*core
	cache     *cache
	hub       *hub
	results   *results
	questions *questionDesk
}

// groupData is the group page's data.
type groupData struct {
	// Pool and Group name the group (messages.GroupRef).
	Pool, Group string
	// Runs are the group's runs, newest first.
	Runs []*messages.RunState
	// Questions are the group's questions waiting for an operator.
	Questions []questionRow
	// Attempts compares them, in the order they were submitted.
	Attempts attemptsData
}

// groupRef returns the request's {pool} and {group}, the group they name,
// or the error that they are not names.
func groupRef(r *http.Request) (messages.GroupRef, error) {
	g := messages.GroupRef{Pool: r.PathValue("pool"), Name: r.PathValue("group")}
	return g, g.Validate()
}

// groupParam returns the request's group (groupRef), or answers 400 and
// false.
func groupParam(w http.ResponseWriter, r *http.Request) (messages.GroupRef, bool) {
	g, err := groupRef(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return g, false
	}
	return g, true
}

// inGroup returns the filter of group g's runs: those a worker admitted
// to it (a run's state names its group once admitted), in its pool; a
// run alone in its own group is in no named group.
func inGroup(g messages.GroupRef) func(st *messages.RunState) bool {
	return func(st *messages.RunState) bool { return st.GroupRef() == g }
}

// groupPath returns the path of group g's page, /groups/<pool>/<group>.
func groupPath(g messages.GroupRef) string {
	return "/groups/" + url.PathEscape(g.Pool) + "/" + url.PathEscape(g.Name)
}

// serve answers GET /groups/{pool}/{group}: the group's runs compared
// (each one's outcome, duration, diffstat, usage and diff: its attempts,
// for submit --attempts); the conversation and state changes arrive over
// /live/group/{pool}/{group}.
func (p *groupPage) serve(w http.ResponseWriter, r *http.Request) {
	rev := p.cache.current()
	g, err := groupRef(r)
	if err != nil {
		p.message(w, r, http.StatusBadRequest, "Bad group", err.Error(), "/runs")
		return
	}
	runs := p.cache.filter(inGroup(g))
	p.render(w, r, "group", page{Title: "Group " + g.String(), Nav: "runs", Rev: rev,
		Data: groupData{Pool: g.Pool, Group: g.Name, Runs: runs, Attempts: p.attempts(r.Context(), g, runs), Questions: p.questions.ofGroup(r.Context(), g)}})
}

// groupRow is a run of a group as the group page's live stream sends it:
// the list's row and its attemptKey.
type groupRow struct {
	runRow
	Key string `json:"key"`
}

// live serves GET /live/group/{pool}/{group}: every message of the
// group as JETCREW_COORD_VIEW mirrors JETCREW_COORD (subjects
// jetcrew.coord.<pool>.<group>.>; readers may not consume JETCREW_COORD, whose
// consumers are the runs' inboxes), oldest first then live,
// as "message" server-sent events, and "state" events as the group's runs
// change state.
func (p *groupPage) live(w http.ResponseWriter, r *http.Request) {
	g, ok := groupParam(w, r)
	if !ok {
		return
	}
	serveLive(p.hub, w, r, inGroup(g),
		func(st messages.RunState) any { return groupRow{runRow: newRunRow(st), Key: attemptKey(&st)} },
		func(ctx context.Context) <-chan dispatcher.StreamMsg {
			return p.hub.followMessages(ctx, coordination.ViewStreamName, []string{coordination.SubjectGroup(g)})
		},
		func(m dispatcher.StreamMsg) (string, any) {
			if origin.Relayed(m.Header) {
				// Relayed into the group's subjects by the server (another
				// stream's RePublish, a source): no run reads it.
				return "", nil
			}
			return "message", groupMessage(m)
		})
}

// maxMessageText is how much of a message's body the group page shows,
// in runes.
const maxMessageText = 4096

// liveMessage is one message of a group's conversation.
type liveMessage struct {
	Seq  uint64 `json:"seq"`
	Time string `json:"time"`
	// From is the sender as the runs read it (coordination.Sender): the
	// run the worker stamped (header Jetcrew-From) on a run's message;
	// "operator" on an operator subject whatever the header says, and
	// when the header is absent or no run id.
	From string `json:"from"`
	// To is the recipient: a run id, "all" or "operator".
	To string `json:"to"`
	// Text is the body, made visible, at most maxMessageText runes.
	Text  string `json:"text"`
	Bytes int    `json:"bytes"`
}

func groupMessage(m dispatcher.StreamMsg) liveMessage {
	from, to := coordination.Sender(m.Subject, m.Header.Get(coordination.HeaderFrom))
	return liveMessage{
		Seq: m.Sequence, Time: clock(m.Time),
		From: visible(from), To: visible(to),
		Text: visible(shortText(string(m.Data), maxMessageText)), Bytes: len(m.Data),
	}
}

// coordLive fills le from a coordination event's JSON: the sender is the
// run the worker recorded the event for, the recipient the event's To.
func coordLive(le liveEvent, data []byte) liveEvent {
	var ce coordination.Event
	if err := json.Unmarshal(data, &ce); err != nil {
		le.Text = visible(string(data))
		return le
	}
	le.RunID, le.Kind, le.From, le.To = ce.RunID, visible(string(ce.Kind)), ce.RunID, visible(ce.To)
	switch ce.Kind {
	case coordination.EventSent:
		le.Text = fmt.Sprintf("message %s, %d bytes", visible(ce.MessageID), ce.Bytes)
		if ce.Duplicate {
			le.Text += " (duplicate, not sent again)"
		}
	case coordination.EventRead:
		le.Text = "read " + visible(strings.Join(ce.MessageIDs, ", "))
	case coordination.EventRefused:
		le.Text = "refused: " + visible(ce.Reason)
	case coordination.EventClaimed:
		le.Text = "claimed " + visible(strings.Join(ce.Paths, ", "))
		if ce.Reason != "" {
			le.Text += ": " + visible(ce.Reason)
		}
	case coordination.EventReleased:
		le.Text = "released " + visible(strings.Join(ce.Paths, ", "))
		if ce.Reason != "" {
			le.Text += " (" + visible(ce.Reason) + ")"
		}
	case coordination.EventSteered:
		le.From = coordination.RecipientOperator
		le.Text = fmt.Sprintf("steer %s %s, %d bytes", visible(ce.SteerID), visible(string(ce.Outcome)), ce.Bytes)
		if ce.Reason != "" {
			le.Text += ": " + visible(ce.Reason)
		}
	default:
		le.Text = questionEventText(ce)
	}
	return le
}
