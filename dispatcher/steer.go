package dispatcher

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetcrew/jetcrew/messages"
)

// Steer sends text to the agent of run runID, as the operator, with a
// request on jetcrew.steer.<run_id> carrying the steer's id in the
// Jetcrew-Steer-Id header (what `nats req -H Jetcrew-Steer-Id:ID
// jetcrew.steer.RUN_ID 'text'` sends), and returns what became of it
// (messages.SteerReply):
//
//   - messages.SteerDelivered: written to the agent CLI's standard input
//     as a user turn, and put in the run's inbox;
//   - messages.SteerQueued: in the run's inbox only (Reason says why);
//   - messages.SteerRefused: neither (Code and Reason say why).
//
// id makes the steer idempotent: a repeat with the same id is answered
// with the first one's outcome and delivers nothing new; "" draws a random
// one. A steer is refused without a request when its text breaks a rule
// (messages.ValidateSteer), and after one that no worker answers according
// to the run's state: unknown_run, ended (the run's final state named),
// not_running, or unavailable (no coordination session serves it). The
// error is for a request that failed otherwise (NATS unreachable, a reply
// that cannot be read). ctx bounds the wait; without a deadline Steer
// waits at most 30 seconds.
func (c *Coordination) Steer(ctx context.Context, runID, text, id string) (messages.SteerReply, error) {
	if err := messages.ValidateToken("run id", runID); err != nil {
		return messages.SteerReply{}, fmt.Errorf("steer: %w", err)
	}
	if id == "" {
		id = strings.ToLower(rand.Text())
	}
	r := messages.SteerReply{RunID: runID, ID: id, Outcome: messages.SteerRefused}
	if err := messages.ValidateSteerID(id); err != nil {
		r.Code, r.Reason = messages.SteerInvalid, err.Error()
		return r, nil
	}
	if code, err := messages.ValidateSteer(text); err != nil {
		r.Code, r.Reason = code, err.Error()
		return r, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRequestTimeout)
		defer cancel()
	}
	m := nats.NewMsg(messages.SubjectSteer(runID))
	m.Header.Set(messages.HeaderSteerID, id)
	m.Data = []byte(text)
	resp, err := c.js.Conn().RequestMsgWithContext(ctx, m)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return c.steerUnserved(ctx, r)
	case errors.Is(err, context.DeadlineExceeded):
		r.Code, r.Reason = messages.SteerUnavailable, "the worker serving the run did not answer in time"
		return r, nil
	case err != nil:
		return messages.SteerReply{}, fmt.Errorf("steer run %s: %w", runID, err)
	}
	var got messages.SteerReply
	if err := json.Unmarshal(resp.Data, &got); err != nil || got.Outcome == "" {
		return messages.SteerReply{}, fmt.Errorf("steer run %s: the reply %q is not a steer reply", runID, resp.Data)
	}
	return got, nil
}

// steerUnserved explains, from the run's state, why no worker answered a
// steer: the run is unknown, has ended, is not running yet, or has no
// coordination session.
func (c *Coordination) steerUnserved(ctx context.Context, r messages.SteerReply) (messages.SteerReply, error) {
	st, err := c.runs.Status(ctx, r.RunID)
	switch {
	case errors.Is(err, ErrRunNotFound):
		r.Code, r.Reason = messages.SteerUnknownRun, fmt.Sprintf("no run %s is known", r.RunID)
	case err != nil:
		return messages.SteerReply{}, fmt.Errorf("steer run %s: no worker answered, and its state cannot be read: %w", r.RunID, err)
	case st.State.Final():
		r.Code, r.Reason = messages.SteerEnded, fmt.Sprintf("run %s has ended (%s): a steer reaches only a running agent", r.RunID, st.State)
	case st.State != messages.StateRunning:
		r.Code, r.Reason = messages.SteerNotRunning, fmt.Sprintf("run %s is %s, not running: a steer reaches only a running agent", r.RunID, st.State)
	default:
		r.Code, r.Reason = messages.SteerUnavailable, fmt.Sprintf("run %s is running but no worker serves its coordination (coordination %q)", r.RunID, st.Coordination)
	}
	return r, nil
}
