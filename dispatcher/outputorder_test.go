package dispatcher

import (
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestOutputOrder(t *testing.T) {
	t.Parallel()
	out := func(run string, attempt int, seq uint64) WatchEvent {
		return WatchEvent{Type: messages.EventOutput, RunID: run, Attempt: attempt, Seq: seq, Data: []byte(run + "/" + strconv.Itoa(attempt) + "/" + strconv.FormatUint(seq, 10))}
	}
	ev := func(run string, typ messages.EventType) WatchEvent {
		return WatchEvent{Type: typ, RunID: run, Data: []byte(run + "/" + string(typ))}
	}
	many := func(from, to uint64) []WatchEvent {
		var evs []WatchEvent
		for s := from; s <= to; s++ {
			evs = append(evs, out("r", 1, s))
		}
		return evs
	}
	for _, tc := range []struct {
		name string
		in   []WatchEvent
		want []string
	}{
		{"in order", []WatchEvent{out("r", 1, 1), out("r", 1, 2), ev("r", messages.EventFinished)},
			[]string{"r/1/1", "r/1/2", "r/finished"}},
		{"a chunk stored late is put back", []WatchEvent{out("r", 1, 1), out("r", 1, 3), out("r", 1, 4), out("r", 1, 2), out("r", 1, 5)},
			[]string{"r/1/1", "r/1/2", "r/1/3", "r/1/4", "r/1/5"}},
		{"the first chunk stored late", []WatchEvent{out("r", 1, 2), out("r", 1, 1)},
			[]string{"r/1/1", "r/1/2"}},
		{"another event releases what waits, then goes", []WatchEvent{out("r", 1, 2), out("r", 1, 3), ev("r", messages.EventFinished), out("r", 1, 1)},
			[]string{"r/1/2", "r/1/3", "r/finished", "r/1/1"}},
		{"without seq: stream order", []WatchEvent{out("r", 1, 0), out("r", 1, 2), out("r", 1, 0), out("r", 1, 1)},
			[]string{"r/1/0", "r/1/0", "r/1/1", "r/1/2"}},
		{"runs and attempts apart", []WatchEvent{out("a", 1, 2), out("b", 1, 1), out("a", 2, 1), out("a", 1, 1)},
			[]string{"b/1/1", "a/2/1", "a/1/1", "a/1/2"}},
		{"a replay counts from 1 again", []WatchEvent{out("r", 1, 1), out("r", 1, 2), ev("r", messages.EventFinished), ev("r", messages.EventStarted), out("r", 1, 1)},
			[]string{"r/1/1", "r/1/2", "r/finished", "r/started", "r/1/1"}},
		{"a chunk that never comes is given up on", append(many(2, maxHeldOutput+2), out("r", 1, 1)),
			func() []string {
				// Past maxHeldOutput held, the oldest goes and the rest
				// follow it; the missing one comes late.
				var w []string
				for s := 2; s <= maxHeldOutput+2; s++ {
					w = append(w, "r/1/"+strconv.Itoa(s))
				}
				return append(w, "r/1/1")
			}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			fn := newOutputOrder().wrap(func(ev WatchEvent) error { got = append(got, string(ev.Data)); return nil })
			for _, ev := range tc.in {
				require.NoError(t, fn(ev))
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestOutputOrderCallbackError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	fn := newOutputOrder().wrap(func(WatchEvent) error { return boom })
	require.NoError(t, fn(WatchEvent{Type: messages.EventOutput, RunID: "r", Attempt: 1, Seq: 2}), "held, not passed")
	require.ErrorIs(t, fn(WatchEvent{Type: messages.EventOutput, RunID: "r", Attempt: 1, Seq: 1}), boom)
	require.Nil(t, newOutputOrder().wrap(nil))
}

// Watch passes stdout and stderr in Jetcrew-Seq order, the worker's read
// order, even when the stream stored a chunk (published again after a
// failed publish) after later ones; the finished event comes after all of
// the run's output.
func TestWatchOrdersOutputBySeq(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const id = "seq-run"
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventStarted, Attempt: 1})
	b.publishSeqOutput(t, id, messages.StreamStdout, 0, 1, "1\n")
	b.publishSeqOutput(t, id, messages.StreamStderr, 0, 2, "2\n")
	b.publishSeqOutput(t, id, messages.StreamStderr, 2, 4, "4\n")
	b.publishSeqOutput(t, id, messages.StreamStderr, 4, 5, "5\n")
	b.publishSeqOutput(t, id, messages.StreamStdout, 2, 3, "3\n")
	b.publishSeqOutput(t, id, messages.StreamStdout, 4, 7, "7\n")
	b.publishEvent(t, messages.Event{RunID: id, Type: messages.EventFinished, Attempt: 1, State: messages.StateSucceeded})

	var got []string
	_, err := b.d.Watch(t.Context(), id, func(ev WatchEvent) error {
		if ev.Type == messages.EventOutput {
			got = append(got, ev.Stream+":"+string(ev.Data))
		} else {
			got = append(got, string(ev.Type))
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"started", "stdout:1\n", "stderr:2\n", "stdout:3\n", "stderr:4\n", "stderr:5\n", "stdout:7\n", "finished"}, got)
}

// publishSeqOutput publishes an output event as a worker with Jetcrew-Seq
// does.
func (b *testBundle) publishSeqOutput(t *testing.T, id, stream string, offset int, seq uint64, data string) {
	t.Helper()
	m := nats.NewMsg(messages.SubjectEvents(id, messages.EventOutput))
	m.Data = []byte(data)
	m.Header.Set(messages.HeaderRunID, id)
	m.Header.Set(messages.HeaderStream, stream)
	m.Header.Set(messages.HeaderOffset, strconv.Itoa(offset))
	m.Header.Set(messages.HeaderSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(messages.HeaderAttempt, "1")
	_, err := b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
}
