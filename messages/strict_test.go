package messages_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// Keys are matched exactly and once, at every depth, so that no other JSON
// reader of a request can see something else than what the worker acts on.
func TestDecodeRunRequestExactKeys(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"profile":"shell","prompt":"echo SAFE","Profile":"secret","PROMPT":"echo EVIL"}`: `key "Profile" is not "profile"`,
		`{"profile":"shell","prompt":"echo SAFE","prompt":"echo EVIL"}`:                    `key "prompt" appears twice`,
		`{"profile":"shell","env":{"A":"1","A":"2"}}`:                                      `key "env.A" appears twice`,
		`{"profile":"shell","labels":{"k":"1","k":"1"}}`:                                   `key "labels.k" appears twice`,
		`{"PROFILE":"shell"}`:                    `key "PROFILE" is not "profile"`,
		`{"profile":"shell","Env":{}}`:           `key "Env" is not "env"`,
		`{"profile":"shell","id":"all"}`:         "reserved",
		`{"profile":"shell","group":"Operator"}`: "reserved",
		`{"profile":"shell","pool":"ALL"}`:       "reserved",
	} {
		_, err := messages.DecodeRunRequest([]byte(body))
		require.ErrorIs(t, err, messages.ErrInvalidRequest, body)
		require.ErrorContains(t, err, want, body)
	}
	// Map keys differing in case are different variables, not duplicates.
	r, err := messages.DecodeRunRequest([]byte(`{"profile":"shell","env":{"path_x":"1","PATH_X":"2"}}`))
	require.NoError(t, err)
	require.Len(t, r.Env, 2)
}

// A refused request keeps the id it carries, whatever else is wrong with it
// (its failure is recorded where its submitter looks); an ambiguous,
// reserved or unreadable one gives none.
func TestSalvageRunID(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 300<<10)
	for body, want := range map[string]string{
		`{"id":"big-1","profile":"shell","prompt":"` + big + `"}`: "big-1",
		`{"prompt":"` + big + `","id":"late"}`:                    "late",
		`{"id":"k","Profile":"x","bogus":[1,{"id":"inner"}]}`:     "k",
		`{"id":"a","id":"b"}`:                                     "",
		`{"ID":"a"}`:                                              "",
		`{"id":"all"}`:                                            "",
		`{"id":"a.b"}`:                                            "",
		`{"id":7}`:                                                "",
		`{"id":"a"} {"id":"b"}`:                                   "",
		`{"id":"a",`:                                              "",
		`["id","a"]`:                                              "",
	} {
		require.Equal(t, want, messages.SalvageRunID([]byte(body)), body[:min(len(body), 60)])
	}
}

// FuzzSalvageRunID checks that no input panics SalvageRunID and that what it
// returns is always a valid, unreserved name.
func FuzzSalvageRunID(f *testing.F) {
	for _, s := range []string{`{"id":"a","profile":"p"}`, `{"id":"a","id":"b"}`, `{`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if id := messages.SalvageRunID(data); id != "" {
			require.NoError(t, messages.ValidateName("id", id))
		}
	})
}

// The digest ignores the white space around the object (a shell pipe's
// newline), nothing else.
func TestRequestDigest(t *testing.T) {
	t.Parallel()
	a := messages.RequestDigest([]byte(`{"id":"a","profile":"shell"}`))
	require.Equal(t, a, messages.RequestDigest([]byte(" {\"id\":\"a\",\"profile\":\"shell\"}\r\n")))
	require.NotEqual(t, a, messages.RequestDigest([]byte(`{"id":"a", "profile":"shell"}`)))
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, a)
}
