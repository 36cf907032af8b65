package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/internal/origin"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/runstate"
)

// cancelQueue is the queue group of the cancel subscription: one worker
// answers each cancel request.
const cancelQueue = "jetcrew-cancel"

// cancelListener answers cancel requests (queue group: one worker
// decides) and internal stop requests (every worker: the one holding the
// run stops it), from Start to Stop.
type cancelListener struct {
	nc       *nats.Conn
	store    *runstate.Store
	workerID string
	// stopRun stops run id when this worker holds it
	// (runner.Runner.StopRun).
	stopRun func(id string) (messages.CancelReply, bool)
	// holds reports whether this worker holds run id live
	// (runner.Runner.Holds), for jetcrew.ctl.hold.<run_id>.
	holds func(id string) bool
	log   zerolog.Logger
	subs  []*nats.Subscription
}

// Start subscribes to cancel requests (queue group) and to internal stop
// requests.
func (c *cancelListener) Start(context.Context) error {
	cs, err := c.nc.QueueSubscribe(messages.SubjectCancelPrefix+".*", cancelQueue, c.onCancel)
	if err != nil {
		return fmt.Errorf("worker: subscribe to control subjects: %w", err)
	}
	ss, err := c.nc.Subscribe(messages.SubjectStopPrefix+".*", c.onStop)
	if err != nil {
		_ = cs.Unsubscribe()
		return fmt.Errorf("worker: subscribe to control subjects: %w", err)
	}
	hs, err := c.nc.Subscribe(messages.SubjectHoldPrefix+".*", c.onHold)
	if err != nil {
		_ = cs.Unsubscribe()
		_ = ss.Unsubscribe()
		return fmt.Errorf("worker: subscribe to control subjects: %w", err)
	}
	c.subs = []*nats.Subscription{cs, ss, hs}
	return nil
}

// Stop drains the subscriptions: the requests received are answered. It
// returns nil.
func (c *cancelListener) Stop(context.Context) error {
	for _, s := range c.subs {
		_ = s.Drain()
	}
	return nil
}

// delivered reports whether m reached a control subject through the server
// rather than from a requester: a consumer's delivery (its reply subject is
// an acknowledgement's, $JS.ACK.…) or a stream's RePublish
// (origin.Relayed). Neither is checked against the permissions of whoever
// configured it, so a reader allowed a consumer on any stream could
// otherwise cancel or stop any run.
func delivered(m *nats.Msg) bool {
	return strings.HasPrefix(m.Reply, "$JS.ACK.") || origin.Relayed(m.Header)
}

func lastToken(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

func reply(m *nats.Msg, r messages.CancelReply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}

// onCancel answers jetcrew.cancel.<run_id>. A queued run (or one no worker
// has seen yet) is marked cancelled in its state, so it is skipped when it
// is delivered; a running one is stopped by the worker that holds it; a
// final one is left alone. The state write is a compare-and-set, so a
// worker claiming the run at the same moment either sees the cancel or
// makes this request look again. What the server delivered or relayed to the
// subject (delivered) is no request: it is ignored.
func (c *cancelListener) onCancel(m *nats.Msg) {
	if delivered(m) {
		c.log.Warn().Str("subject", m.Subject).Msg("a cancel the server delivered or relayed, not a request: ignored")
		return
	}
	id := lastToken(m.Subject)
	if err := messages.ValidateToken("run id", id); err != nil {
		reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 5 {
		prev, rev, err := c.store.Load(ctx, id)
		switch {
		case err != nil && !runstate.IsNotFound(err):
			reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: "read run state: " + err.Error()})
			return
		case err != nil:
			// Unknown: perhaps published by a raw client and not yet seen.
			// Record the cancel so the request is skipped when it arrives.
			st := messages.RunState{Version: messages.StateVersion, ID: id, State: messages.StateCancelled,
				Reason: "cancelled before any worker saw the request", Worker: c.workerID}
			if ok, err := c.store.Finalize(ctx, messages.StateNone, st, rev); err != nil {
				reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: err.Error()})
				return
			} else if !ok {
				continue
			}
			reply(m, messages.CancelReply{RunID: id, Result: messages.CancelQueued, State: messages.StateCancelled, Worker: c.workerID,
				Message: "no worker had seen this run; it is recorded cancelled and will be skipped if it arrives"})
			return
		case prev.State.Final() && prev.State != messages.StateSucceeded && !prev.CancelPending:
			// A replay of it may be queued: mark the record so that one is
			// skipped. The run itself stays as it ended.
			if err := c.store.MarkCancelPending(ctx, prev, rev); err != nil {
				if errors.Is(err, runstate.ErrFenced) {
					continue
				}
				reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: "record cancel: " + err.Error()})
				return
			}
			reply(m, messages.CancelReply{RunID: id, Result: messages.CancelAlreadyFinal, State: prev.State, Worker: c.workerID,
				Message: fmt.Sprintf("run already %s; a replay of it that is still queued will be skipped", prev.State)})
			return
		case prev.State.Final():
			reply(m, messages.CancelReply{RunID: id, Result: messages.CancelAlreadyFinal, State: prev.State,
				Message: fmt.Sprintf("run already %s; nothing to cancel", prev.State)})
			return
		case prev.State == messages.StateRunning || claimedByDelivery(prev):
			// The worker holding it decides: before its container may
			// start, or stop it.
			if r, ok := c.askStop(id); ok {
				reply(m, r)
				return
			}
			// Its worker did not answer: it died or is cut off. Finalise
			// the state; that fences the old worker, and the redelivered
			// request will be acked without running.
			fallthrough
		default:
			st := prev
			st.State = messages.StateCancelled
			st.Reason = "cancelled while " + string(prev.State)
			st.FinishedAt = time.Now().UTC()
			ok, err := c.store.Finalize(ctx, prev.State, st, rev)
			if err != nil {
				reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: err.Error()})
				return
			}
			if !ok {
				continue
			}
			reply(m, messages.CancelReply{RunID: id, Result: messages.CancelQueued, State: messages.StateCancelled, Worker: c.workerID,
				Message: fmt.Sprintf("run was %s; it is cancelled and will not run", prev.State)})
			return
		}
	}
	reply(m, messages.CancelReply{RunID: id, Result: messages.CancelError, Message: "the run's state kept changing; try again"})
}

// askStop asks the worker holding run id to stop it, and returns its reply.
func (c *cancelListener) askStop(id string) (messages.CancelReply, bool) {
	resp, err := c.nc.Request(messages.SubjectStopPrefix+"."+id, nil, 2*time.Second)
	if err != nil {
		return messages.CancelReply{}, false
	}
	var r messages.CancelReply
	if json.Unmarshal(resp.Data, &r) != nil {
		return messages.CancelReply{}, false
	}
	return r, true
}

// onStop answers jetcrew.ctl.stop.<run_id> when this worker holds the run
// (runner.Runner.StopRun); other workers stay silent.
func (c *cancelListener) onStop(m *nats.Msg) {
	if delivered(m) {
		c.log.Warn().Str("subject", m.Subject).Msg("a stop request the server delivered or relayed, not a request: ignored")
		return
	}
	if r, ok := c.stopRun(lastToken(m.Subject)); ok {
		reply(m, r)
	}
}

// onHold answers jetcrew.ctl.hold.<run_id>, with an empty body, when this
// worker holds the run live; other workers stay silent.
func (c *cancelListener) onHold(m *nats.Msg) {
	if delivered(m) || c.holds == nil || !c.holds(lastToken(m.Subject)) {
		return
	}
	_ = m.Respond(nil)
}

// claimedByDelivery reports whether a queued record was written by a
// delivery that claimed the run (not by the submitter or a cancel): its
// worker may be about to start it, so a cancel asks that worker.
func claimedByDelivery(st messages.RunState) bool {
	return st.State == messages.StateQueued && st.StreamSeq != 0
}
