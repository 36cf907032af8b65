package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// failing says every dead letter's run is still failing.
func failing(dl dispatcher.DeadLetter) deadLetter {
	return deadLetter{DeadLetter: dl, Fate: dispatcher.FateFailing}
}

// Issue 27, bug 3: a group's "Sample request (the latest)" is the latest
// dead letter's request, and the letters listed carry no request bodies.
func TestGroupDeadLettersSample(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	dls := []dispatcher.DeadLetter{
		{Sequence: 1, RunID: "a", Pool: "default", Reason: "exit 1", Time: t0, Request: []byte(`{"prompt":"older"}`)},
		{Sequence: 2, RunID: "b", Pool: "default", Reason: "exit 1", Time: t0.Add(time.Minute), Request: []byte(`{"prompt":"<latest>"}`)},
		{Sequence: 3, RunID: "c", Pool: "gpu", Reason: "timed out", Time: t0, Request: []byte(`{"prompt":"alone"}`)},
	}
	groups, resolved := groupDeadLetters(dls, failing, false)
	require.Zero(t, resolved)
	require.Len(t, groups, 2)
	require.Equal(t, "exit 1", groups[0].Reason)
	require.Equal(t, `{"prompt":"<latest>"}`, groups[0].Sample)
	require.Equal(t, `{"prompt":"alone"}`, groups[1].Sample)
	for _, g := range groups {
		for _, dl := range g.Letters {
			require.Nil(t, dl.Request, "only the sample carries a request")
		}
	}
}

// Issue 27, dead letters' lifecycle: each shows what became of its run; a
// run healed by a replay is hidden until asked for; an operator discards
// one after a confirmation; one table holds every group.
func TestDeadLettersLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	healed := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	still := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	other := b.submit(t, messages.RunRequest{Prompt: "exit 4"})
	for _, id := range []string{healed, still, other} {
		b.waitState(t, id, messages.StateFailed)
		require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), id); return err == nil }, 15*time.Second, 10*time.Millisecond)
	}
	_, body := b.get(t, "/dead-letters")
	require.Equal(t, 1, strings.Count(body, "<table"), "one aligned table for every reason")
	require.Contains(t, body, `<tr data-run="`+healed+`" class="fate-failing">`)
	require.Contains(t, body, "still failing")

	// The run succeeds (as a replay that healed it would).
	st, err := b.d.Status(t.Context(), healed)
	require.NoError(t, err)
	st.State, st.Replays, st.Reason, st.UpdatedAt = messages.StateSucceeded, 1, "", time.Now().UTC()
	b.putStates(t, st)
	_, body = b.get(t, "/dead-letters")
	require.NotContains(t, body, `data-run="`+healed+`"`, "a healed run's dead letter is hidden by default")
	require.Contains(t, body, `data-run="`+still+`"`)
	require.Contains(t, body, `href="/dead-letters?all=1" id="show-resolved">Show 1 resolved`)
	require.Contains(t, body, "Replay all 1 failing")
	_, body = b.get(t, "/dead-letters?all=1")
	require.Contains(t, body, `<tr data-run="`+healed+`" class="fate-healed">`)
	require.Contains(t, body, "replayed and healed")
	require.Contains(t, body, `id="hide-resolved"`)

	// Replaying: the run runs again.
	st2, err := b.d.Status(t.Context(), still)
	require.NoError(t, err)
	st2.State, st2.UpdatedAt = messages.StateRunning, time.Now().UTC()
	b.putStates(t, st2)
	_, body = b.get(t, "/dead-letters")
	require.Contains(t, body, `<tr data-run="`+still+`" class="fate-replaying">`)

	// Discard: asked first, then every dead letter of the run is gone.
	resp, body := b.post(t, "/dead-letters/discard", url.Values{"csrf": {b.c.csrf}, "run": {other}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `action="/dead-letters/discard"`)
	require.Contains(t, body, `name="confirm" value="yes"`, "asks first")
	_, err = b.d.LastDeadLetter(t.Context(), other)
	require.NoError(t, err, "nothing discarded before the confirmation")
	resp, body = b.post(t, "/dead-letters/discard", url.Values{"csrf": {b.c.csrf}, "run": {other}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Discarded 1 dead letter(s) of run "+other)
	_, err = b.d.LastDeadLetter(t.Context(), other)
	require.ErrorIs(t, err, dispatcher.ErrNoDeadLetter)
	_, body = b.get(t, "/dead-letters?all=1")
	require.NotContains(t, body, `data-run="`+other+`"`)
	require.Contains(t, body, `data-run="`+still+`"`, "the others stay")
}
