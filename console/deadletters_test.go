package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	groups, n := groupDeadLetters(dls, failing, deadView{})
	require.Zero(t, n)
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
	resp, body := b.post(t, "/dead-letters/discard", url.Values{"csrf": {b.c.core.csrf}, "run": {other}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `action="/dead-letters/discard"`)
	require.Contains(t, body, `name="confirm" value="yes"`, "asks first")
	_, err = b.d.LastDeadLetter(t.Context(), other)
	require.NoError(t, err, "nothing discarded before the confirmation")
	resp, body = b.post(t, "/dead-letters/discard", url.Values{"csrf": {b.c.core.csrf}, "run": {other}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Discarded 1 dead letter(s) of run "+other)
	_, err = b.d.LastDeadLetter(t.Context(), other)
	require.ErrorIs(t, err, dispatcher.ErrNoDeadLetter)
	_, body = b.get(t, "/dead-letters?all=1")
	require.NotContains(t, body, `data-run="`+other+`"`)
	require.Contains(t, body, `data-run="`+still+`"`, "the others stay")
}

// Issue 27: an operator archives a run's dead letters (after a
// confirmation): kept, and replayable, but hidden from the default view
// and listed in the archive; unarchived, they are listed again; a dead
// letter stored after the mark (the run failed again) is not archived;
// discard takes the mark with the letters.
func TestDeadLettersArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	arch := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	keep := b.submit(t, messages.RunRequest{Prompt: "exit 3"})
	for _, id := range []string{arch, keep} {
		b.waitState(t, id, messages.StateFailed)
		require.Eventually(t, func() bool { _, err := b.d.LastDeadLetter(t.Context(), id); return err == nil }, 15*time.Second, 10*time.Millisecond)
	}
	_, body := b.get(t, "/dead-letters")
	require.Contains(t, body, `<button type="submit" class="archive-one" data-run="`+arch+`">Archive…</button>`)
	require.Contains(t, body, "none archived")

	resp, body := b.post(t, "/dead-letters/archive", url.Values{"csrf": {b.c.core.csrf}, "run": {arch}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `action="/dead-letters/archive"`)
	require.Contains(t, body, `name="confirm" value="yes"`, "asks first")
	_, body = b.get(t, "/dead-letters")
	require.Contains(t, body, `data-run="`+arch+`"`, "nothing archived before the confirmation")
	resp, body = b.post(t, "/dead-letters/archive", url.Values{"csrf": {b.c.core.csrf}, "run": {arch}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Archived the dead letters of run "+arch)

	_, body = b.get(t, "/dead-letters")
	require.NotContains(t, body, `data-run="`+arch+`"`, "an archived dead letter is hidden by default")
	require.Contains(t, body, `data-run="`+keep+`"`)
	require.Contains(t, body, `<a href="/dead-letters?archived=1" id="show-archived">Archived (1)</a>`)
	_, body = b.get(t, "/dead-letters?all=1")
	require.NotContains(t, body, `data-run="`+arch+`"`, "nor shown with the resolved ones")
	_, body = b.get(t, "/dead-letters?archived=1")
	require.Contains(t, body, `data-run="`+arch+`"`)
	require.NotContains(t, body, `data-run="`+keep+`"`, "the archive holds the archived only")
	require.Contains(t, body, `<button type="submit" class="unarchive-one" data-run="`+arch+`">Unarchive…</button>`)
	dl, err := b.d.LastDeadLetter(t.Context(), arch)
	require.NoError(t, err, "an archived dead letter is kept")
	dls, err := b.d.Failed(t.Context(), "")
	require.NoError(t, err)
	require.Len(t, dls, 2, "the mark is no dead letter")
	for _, d := range dls {
		require.Equal(t, d.RunID == arch, d.Archived, d.RunID)
	}
	require.NoError(t, b.d.Archive(t.Context(), arch), "archiving twice is a no-op")
	dls, err = b.d.Failed(t.Context(), "default")
	require.NoError(t, err)
	require.Len(t, dls, 2)

	// Unarchive: asked first, then listed again.
	resp, body = b.post(t, "/dead-letters/archive?undo=1", url.Values{"csrf": {b.c.core.csrf}, "run": {arch}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `action="/dead-letters/archive?undo=1"`)
	resp, body = b.post(t, "/dead-letters/archive?undo=1", url.Values{"csrf": {b.c.core.csrf}, "run": {arch}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	_, body = b.get(t, "/dead-letters")
	require.Contains(t, body, `data-run="`+arch+`"`, "unarchived, it is listed again")

	// A dead letter stored after the mark is not archived.
	require.NoError(t, b.d.Archive(t.Context(), arch))
	m := nats.NewMsg(messages.SubjectFailed("default", arch))
	m.Data = dl.Request
	_, err = b.js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
	_, body = b.get(t, "/dead-letters")
	require.Contains(t, body, `data-run="`+arch+`"`, "the run failed again after it was archived")

	// Discard takes the marks too.
	require.NoError(t, b.d.Archive(t.Context(), arch))
	_, err = b.d.Discard(t.Context(), arch)
	require.NoError(t, err)
	s, err := b.js.Stream(t.Context(), messages.StreamFailed)
	require.NoError(t, err)
	info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(messages.SubjectFailedPrefix+".>"))
	require.NoError(t, err)
	for subj := range info.State.Subjects {
		require.NotContains(t, subj, arch, "nothing of the discarded run is left")
	}
	require.ErrorIs(t, b.d.Archive(t.Context(), arch), dispatcher.ErrNoDeadLetter)
}
