package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// ErrRequestGone is wrapped by Asked's error when neither JETCREW_RUNS nor
// JETCREW_FAILED holds the run's request any more: a worker removes the
// request when the run ends, and only a run that failed, timed out or
// stalled leaves it in a dead letter. Nothing else keeps the prompt.
var ErrRequestGone = errors.New("the run's request is no longer kept")

// Where Asked found a run's request (AskedRequest.From).
const (
	// AskedFromQueue: its message in JETCREW_RUNS, where it stays while
	// the run waits or runs.
	AskedFromQueue = "queue"
	// AskedFromDeadLetter: its latest dead letter in JETCREW_FAILED.
	AskedFromDeadLetter = "dead letter"
)

// AskedRequest is what a run was asked to do, as the fleet still holds it.
type AskedRequest struct {
	// Body is the request byte for byte as submitted (at most
	// messages.MaxRequestMsgBytes: the stream refuses a larger one).
	Body []byte
	// Request is Body decoded, and Decoded says whether it decoded (a run
	// that failed because its request was malformed has only Body).
	Request messages.RunRequest
	Decoded bool
	// From is AskedFromQueue or AskedFromDeadLetter.
	From string
}

// Asked returns the request of the run whose state is st (a state a
// worker wrote, or a queued one made from its request): while the run is
// not final, its message in JETCREW_RUNS (at st.StreamSeq, else looked for
// among the first MaxRequestScan messages while the run is queued); else,
// or when that is gone or cannot be read, its latest dead letter. A final
// run's request is not looked for in JETCREW_RUNS: its worker removes it
// there moments after the final state, and the page of a run that
// succeeded says the same before and after. A message is taken only when it names the run (its id or
// Nats-Msg-Id) and, when st records one, has st's RequestDigest: a later
// request reusing the id is not this run's. The error wraps ErrRequestGone
// when neither holds it; it is never ErrNotProvisioned (a stream missing
// holds nothing).
func (rs *RunStates) Asked(ctx context.Context, st *messages.RunState) (AskedRequest, error) {
	if err := messages.ValidateToken("run id", st.ID); err != nil {
		return AskedRequest{}, fmt.Errorf("request: %w", err)
	}
	ours := func(id string, body []byte) bool {
		return (id == st.ID || messages.SalvageRunID(body) == st.ID) &&
			(st.RequestDigest == "" || messages.RequestDigest(body) == st.RequestDigest)
	}
	var (
		body []byte
		err  error
	)
	from := AskedFromQueue
	if !st.State.Final() {
		body, err = rs.queuedBody(ctx, st, ours)
	}
	if body == nil {
		from = AskedFromDeadLetter
		dl, derr := lastDeadLetter(ctx, rs.js, st.ID)
		switch {
		case derr == nil && ours(dl.RunID, dl.Request):
			body, err = dl.Request, nil
		case derr != nil && !errors.Is(derr, ErrNoDeadLetter) && !errors.Is(derr, ErrNotProvisioned):
			err = errors.Join(err, derr)
		}
	}
	if body == nil && err != nil {
		return AskedRequest{}, err
	}
	if body == nil {
		return AskedRequest{}, fmt.Errorf("run %s (%s): %w", st.ID, st.State, ErrRequestGone)
	}
	a := AskedRequest{Body: body, From: from}
	a.Decoded = json.Unmarshal(body, &a.Request) == nil
	return a, nil
}

// queuedBody returns the body of st's request message in JETCREW_RUNS, or
// nil when the stream no longer holds it.
func (rs *RunStates) queuedBody(ctx context.Context, st *messages.RunState, ours func(id string, body []byte) bool) ([]byte, error) {
	seq := st.StreamSeq
	if seq == 0 {
		if st.State != messages.StateQueued {
			return nil, nil // no worker saw a request of it: none to look for
		}
		q, err := rs.findRequest(ctx, st.ID, false)
		switch {
		case errors.Is(err, ErrRunNotFound), errors.Is(err, ErrNotProvisioned):
			return nil, nil
		case err != nil:
			return nil, err
		}
		seq = q.Sequence
	}
	stream, err := rs.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		if err = classify(err); errors.Is(err, ErrNotProvisioned) {
			return nil, nil
		}
		return nil, fmt.Errorf("request of run %s: stream %s: %w", st.ID, messages.StreamRuns, err)
	}
	m, err := stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // taken and done with: acked or refused
	}
	if err != nil {
		return nil, fmt.Errorf("request of run %s: read %s: %w", st.ID, messages.StreamRuns, classify(err))
	}
	if !ours(m.Header.Get(jetstream.MsgIDHeader), m.Data) {
		return nil, nil
	}
	return m.Data, nil
}

// RecordedPrompt returns the latest started event of run id, which carries
// the prompt its worker recorded (messages.Event.Prompt: masked as the
// run's output is, at most messages.MaxEventPrompt bytes; PromptBytes its
// whole size when cut): what the run was asked once its request is gone.
// One direct get of jetcrew.events.<run_id>.started. The error wraps
// ErrRequestGone when there is none (the run never started, its events
// expired), and ErrNotProvisioned when the stream does not exist.
func (rs *RunStates) RecordedPrompt(ctx context.Context, id string) (messages.Event, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return messages.Event{}, fmt.Errorf("prompt: %w", err)
	}
	stream, err := rs.js.Stream(ctx, messages.StreamEvents)
	if err != nil {
		return messages.Event{}, fmt.Errorf("prompt of run %s: stream %s: %w", id, messages.StreamEvents, classify(err))
	}
	m, err := stream.GetLastMsgForSubject(ctx, messages.SubjectEvents(id, messages.EventStarted))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return messages.Event{}, fmt.Errorf("run %s: %w (no started event)", id, ErrRequestGone)
	}
	if err != nil {
		return messages.Event{}, fmt.Errorf("prompt of run %s: %w", id, classify(err))
	}
	var ev messages.Event
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return messages.Event{}, fmt.Errorf("started event of run %s: %w", id, err)
	}
	return ev, nil
}
