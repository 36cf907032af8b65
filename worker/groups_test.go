package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// keyedSubmit publishes req keyed to its group by secret, as submit
// --group does.
func keyedSubmit(t *testing.T, d *dispatcher.Dispatcher, secret dispatcher.GroupSecret, req messages.RunRequest) {
	t.Helper()
	e, err := dispatcher.Encode(req)
	require.NoError(t, err)
	key, err := secret.Key(e.Request().GroupRef())
	require.NoError(t, err)
	e, err = e.WithGroupKey(key)
	require.NoError(t, err)
	_, err = d.SubmitEncoded(t.Context(), e, nil)
	require.NoError(t, err)
}

// groupSecret writes a new group secret under the test's directory.
func groupSecret(t *testing.T) dispatcher.GroupSecret {
	t.Helper()
	s, err := dispatcher.CreateGroupSecret(t.TempDir() + "/group.secret")
	require.NoError(t, err)
	return s
}

// A run that asks to join a group it may not (another key, none) fails
// before anything starts: the reason says why, a dead
// letter keeps the request, its state names no group, and it never had a
// container. The group's own runs run.
func TestGroupRefusedRunFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d, err := dispatcher.New(b.nc)
	require.NoError(t, err)
	owner, intruder := groupSecret(t), groupSecret(t)

	keyedSubmit(t, d, owner, messages.RunRequest{ID: "crew-1", Profile: "shell", Prompt: "out one", Group: "crew"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "crew-1").State)
	b.submit(t, messages.RunRequest{ID: "solo", Profile: "shell", Prompt: "out alone"})
	require.Equal(t, messages.StateSucceeded, b.waitFinal(t, "solo").State)

	refused := map[string]string{
		"crew-3":  "has another key",
		"crew-4":  "has a key",
		"crew-2b": "",
	}
	keyedSubmit(t, d, intruder, messages.RunRequest{ID: "crew-3", Profile: "shell", Prompt: "out in", Group: "crew"})
	b.submit(t, messages.RunRequest{ID: "crew-4", Profile: "shell", Prompt: "out in", Group: "crew"})
	// The owner's second attempt joins.
	keyedSubmit(t, d, owner, messages.RunRequest{ID: "crew-2b", Profile: "shell", Prompt: "out two", Group: "crew"})
	for id, why := range refused {
		st := b.waitFinal(t, id)
		if why == "" {
			require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
			require.Equal(t, "crew", st.Group)
			continue
		}
		require.Equal(t, messages.StateFailed, st.State, id)
		require.Contains(t, st.Reason, coordination.ErrGroupRefused.Error()+": ", id)
		require.Contains(t, st.Reason, why, id)
		require.Empty(t, st.Group, "%s: a run refused its group is not one of the group's", id)
		dl := b.deadLetter(t, "default", id)
		require.Contains(t, dl.Header.Get(messages.HeaderError), why, id)
	}
	for _, spec := range b.rt.Starts() {
		require.NotContains(t, strings.Join(spec.Cmd, " "), "out in", "a refused run had a container")
	}
	require.Len(t, b.rt.Starts(), 3)
	// A group named after a run alone in its own group is another group:
	// the run's own group keeps no record to refuse it by, and needs none.
	keyedSubmit(t, d, intruder, messages.RunRequest{ID: "joiner", Profile: "shell", Prompt: "out other", Group: "solo"})
	st := b.waitFinal(t, "joiner")
	require.Equal(t, messages.StateSucceeded, st.State, st.Reason)
	require.Equal(t, messages.GroupRef{Pool: "default", Name: "solo"}, st.GroupRef())
	st = b.waitFinal(t, "solo")
	require.Equal(t, messages.GroupRef{Pool: "default", Name: "solo", Own: true}, st.GroupRef())
}

// A failed run of a keyed group, replayed by an operator from its dead
// letter, is admitted again: the dead letter keeps the group signature.
func TestKeyedGroupReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d, err := dispatcher.New(b.nc)
	require.NoError(t, err)
	keyedSubmit(t, d, groupSecret(t), messages.RunRequest{ID: "k-1", Profile: "shell", Prompt: "out once; exit 3", Group: "k"})
	st := b.waitFinal(t, "k-1")
	require.Equal(t, messages.StateFailed, st.State)
	require.Equal(t, "k", st.Group)
	dl := b.deadLetter(t, "default", "k-1")
	require.NotEmpty(t, dl.Header.Get(messages.HeaderGroupSignature), "the dead letter keeps the group signature")

	_, err = d.Replay(t.Context(), "k-1")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, _ := b.state(t, "k-1")
		return st.Replays == 1 && st.State.Final()
	}, 20*time.Second, 20*time.Millisecond)
	st, _ = b.state(t, "k-1")
	require.Equal(t, "exit code 3", st.Reason, "the replay ran: admitted to its group again")
	require.Len(t, b.rt.Starts(), 2)
}

// A group's runs share one record, its first run's.
func TestGroupRecordedOncePerGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d, err := dispatcher.New(b.nc)
	require.NoError(t, err)
	s := groupSecret(t)
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		keyedSubmit(t, d, s, messages.RunRequest{ID: id, Profile: "shell", Prompt: "out hi", Group: "m"})
	}
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		require.Equal(t, messages.StateSucceeded, b.waitFinal(t, id).State)
	}
	kv, err := b.js.KeyValue(context.Background(), messages.BucketGroups)
	require.NoError(t, err)
	keys, err := kv.Keys(t.Context())
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"default.m"}, keys, "one record for the group, none for a run's own group")
	e, err := kv.Get(t.Context(), "default.m")
	require.NoError(t, err)
	var rec messages.GroupRecord
	require.NoError(t, json.Unmarshal(e.Value(), &rec))
	require.Equal(t, messages.GroupKeyed, rec.Kind)
	require.Contains(t, []string{"m-1", "m-2", "m-3"}, rec.Creator)
}
