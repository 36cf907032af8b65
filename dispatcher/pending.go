package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetcrew/jetcrew/messages"
)

// MaxRequestScan is the most messages of JETCREW_RUNS RunKnown reads looking
// for a run's request. A longer queue is not read to its end: a run whose
// request lies beyond counts as known (its state comes once a worker takes
// it).
const MaxRequestScan = 2000

// RunKnown reports whether run id exists anywhere jetcrew keeps runs: a
// state in jetcrew-runs, an event in JETCREW_EVENTS, a dead letter, or a
// request in JETCREW_RUNS (found by its Nats-Msg-Id or its "id"; at most
// MaxRequestScan requests are read, and a queue longer than that counts as
// holding it). A run id known nowhere was never submitted, or everything of
// it expired: waiting for it would wait forever.
//
// The request is looked for first: a worker removes it (ack or term) only
// after it has recorded the run's state, dead letter or events, so a run
// whose request is gone by the time it is looked for is found by the
// looks after it; looked for last, a request taken and refused between
// the looks was found nowhere.
func (rs *RunStates) RunKnown(ctx context.Context, id string) (bool, error) {
	if queued, err := rs.requestQueued(ctx, id); err != nil || queued {
		return queued, err
	}
	if _, err := rs.Status(ctx, id); err == nil {
		return true, nil
	} else if !errors.Is(err, ErrRunNotFound) {
		return false, err
	}
	for _, sf := range []struct{ stream, filter string }{
		{messages.StreamEvents, messages.SubjectEventsAll(id)},
		{messages.StreamFailed, messages.SubjectFailed("*", id)},
	} {
		stream, err := rs.js.Stream(ctx, sf.stream)
		if err != nil {
			return false, fmt.Errorf("run %s: stream %s: %w", id, sf.stream, classify(err))
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(sf.filter))
		if err != nil {
			return false, fmt.Errorf("run %s: stream %s: %w", id, sf.stream, classify(err))
		}
		if len(info.State.Subjects) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// requestQueued looks for run id's request among the first MaxRequestScan
// messages of JETCREW_RUNS; a longer queue counts as holding it.
func (rs *RunStates) requestQueued(ctx context.Context, id string) (bool, error) {
	_, err := rs.findRequest(ctx, id, true)
	if errors.Is(err, ErrRunNotFound) {
		return false, nil
	}
	return err == nil, err
}

// QueuedRequest is a run request waiting in JETCREW_RUNS, as its message
// says: until a worker takes it, it is the only record of its run (a
// submitter writes no state). A request a worker has taken stays in the
// stream until its outcome is recorded: whoever shows queued runs keeps
// the requests whose run has no state.
type QueuedRequest struct {
	// Sequence is the message's sequence in JETCREW_RUNS.
	Sequence uint64
	// Pool is the pool it waits for; Replay is true on the pool's replay
	// subject (an operator's replay).
	Pool   string
	Replay bool
	// Stored is when the stream stored it.
	Stored time.Time
	// ID, Profile, Group and Labels are the request's; ID is its
	// Nats-Msg-Id when the body names none, and Profile, Group and Labels
	// are empty when the body does not decode. Group is what the request
	// asks for: a worker has not admitted the run to it yet.
	ID, Profile, Group string
	Labels             map[string]string
}

// State returns the queued run state r stands for: state queued, queued at
// Stored, and reason reason. Its Group is empty, as a worker's record of a
// run is until it admitted the run to its group: a request's group is a
// claim no worker has checked yet (the group's key), and a list of a
// group's runs shows only those admitted.
func (r QueuedRequest) State(reason string) messages.RunState {
	return messages.RunState{ID: r.ID, State: messages.StateQueued, Pool: r.Pool, Profile: r.Profile,
		Labels: r.Labels, QueuedAt: r.Stored, UpdatedAt: r.Stored, Reason: reason}
}

func newQueuedRequest(m *jetstream.RawStreamMsg) QueuedRequest {
	q := QueuedRequest{Sequence: m.Sequence, Stored: m.Time.UTC(), Replay: messages.IsReplaySubject(m.Subject)}
	q.Pool, _ = messages.PoolFromSubject(m.Subject)
	var req messages.RunRequest
	if json.Unmarshal(m.Data, &req) == nil {
		q.ID, q.Profile, q.Group, q.Labels = req.ID, req.Profile, req.Group, req.Labels
	} else {
		q.ID = messages.SalvageRunID(m.Data)
	}
	if q.ID == "" && !q.Replay {
		q.ID = m.Header.Get(jetstream.MsgIDHeader)
	}
	return q
}

// WaitingRuns returns the runs of reqs (Requests, oldest first) that no
// worker has taken, as queued states oldest first: those for which taken
// (has the run a state?) is false. Each one's Reason says its place in its
// pool's queue (WaitingReason).
func WaitingRuns(reqs []QueuedRequest, taken func(id string) bool) []messages.RunState {
	var out []messages.RunState
	pos := map[string]int{}
	for _, r := range reqs {
		if taken(r.ID) {
			continue // a worker took it, or it was cancelled: its state tells
		}
		pos[r.Pool]++
		out = append(out, r.State(WaitingReason(r.Pool, pos[r.Pool])))
	}
	return out
}

// WaitingReason is the reason of a run no worker has taken: "waiting for a
// worker: 2 in pool default's queue", or without the place when pos is 0
// (unknown).
func WaitingReason(pool string, pos int) string {
	if pos == 0 {
		return "waiting for a worker of pool " + pool
	}
	return "waiting for a worker: " + strconv.Itoa(pos) + " in pool " + pool + "'s queue"
}

// DefaultRequestRead is how many requests of JETCREW_RUNS the console and
// `jetcrew runs` read, oldest first, to show the queued runs: a backlog
// longer than that shows its first DefaultRequestRead (each read is one
// direct get).
const DefaultRequestRead = 100

// Requests returns the first limit run requests in JETCREW_RUNS (every
// pool, replays included), oldest first, and how many the stream holds in
// all. It reads them with direct gets (it creates no consumer: read access
// to the stream is enough). The error wraps ErrNotProvisioned when the
// stream does not exist.
func (rs *RunStates) Requests(ctx context.Context, limit int) ([]QueuedRequest, uint64, error) {
	stream, err := rs.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return nil, 0, fmt.Errorf("queued requests: stream %s: %w", messages.StreamRuns, classify(err))
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("queued requests: stream %s: %w", messages.StreamRuns, classify(err))
	}
	var out []QueuedRequest
	last := info.State.LastSeq
	for seq := info.State.FirstSeq; seq > 0 && seq <= last && len(out) < limit; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(messages.SubjectRunsPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // none left at or after seq
		}
		if err != nil {
			return nil, 0, fmt.Errorf("queued requests: read %s: %w", messages.StreamRuns, classify(err))
		}
		if m.Sequence > last {
			break // stored after we started
		}
		if q := newQueuedRequest(m); q.ID != "" {
			out = append(out, q)
		}
		seq = m.Sequence + 1
	}
	return out, info.State.Msgs, nil
}

// Request returns run id's request if it waits in JETCREW_RUNS, looked
// for among the first MaxRequestScan messages (by its id or Nats-Msg-Id).
// The error wraps ErrRunNotFound when it is not among them, and
// ErrNotProvisioned when the stream does not exist.
func (rs *RunStates) Request(ctx context.Context, id string) (QueuedRequest, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return QueuedRequest{}, fmt.Errorf("request: %w", err)
	}
	return rs.findRequest(ctx, id, false)
}

// findRequest reads JETCREW_RUNS from its first message for run id's
// request, at most MaxRequestScan messages. With assumeLong, a stream
// holding more than that counts as holding it (a zero QueuedRequest).
func (rs *RunStates) findRequest(ctx context.Context, id string, assumeLong bool) (QueuedRequest, error) {
	stream, err := rs.js.Stream(ctx, messages.StreamRuns)
	if err != nil {
		return QueuedRequest{}, fmt.Errorf("run %s: stream %s: %w", id, messages.StreamRuns, classify(err))
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return QueuedRequest{}, fmt.Errorf("run %s: stream %s: %w", id, messages.StreamRuns, classify(err))
	}
	if assumeLong && info.State.Msgs > MaxRequestScan {
		return QueuedRequest{}, nil // too long to read: assume it is there
	}
	last := info.State.LastSeq
	for seq, n := info.State.FirstSeq, 0; seq > 0 && seq <= last && n < MaxRequestScan; n++ {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(messages.SubjectRunsPrefix+".>"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return QueuedRequest{}, fmt.Errorf("run %s: read %s: %w", id, messages.StreamRuns, classify(err))
		}
		if m.Header.Get(jetstream.MsgIDHeader) == id || messages.SalvageRunID(m.Data) == id {
			q := newQueuedRequest(m)
			q.ID = id
			return q, nil
		}
		seq = m.Sequence + 1
	}
	return QueuedRequest{}, fmt.Errorf("run %s: %w among the first %d requests of %s", id, ErrRunNotFound, MaxRequestScan, messages.StreamRuns)
}
