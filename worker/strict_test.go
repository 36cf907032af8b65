package worker_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

// A request is read exactly as any other JSON parser or person reads it: a
// key that is not exactly a documented name, or that appears twice, makes it
// invalid. Its failure is recorded under the id it
// carries, whatever else is wrong with it (item 5), unless that id is
// ambiguous or reserved (item 6).
func TestStrictRawRequestsKeepTheirID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// Past messages.MaxRequestBytes but within the stream's message size
	// limit (a larger message is refused at publish, see
	// TestRunsStreamRefusesOversizedRequest).
	big := strings.Repeat("y", messages.MaxRequestBytes)
	cases := []struct {
		body   string
		id     string // expected run id; "" means derived
		reason string
	}{
		{`{"profile":"shell","prompt":"echo SAFE","Profile":"secret","PROMPT":"echo EVIL","id":"case1"}`, "case1", `key "Profile" is not "profile"`},
		{`{"id":"dup1","profile":"shell","prompt":"echo SAFE","prompt":"echo EVIL"}`, "dup1", `key "prompt" appears twice`},
		{`{"id":"dup2","profile":"shell","env":{"A":"1","A":"2"}}`, "dup2", `key "env.A" appears twice`},
		{`{"id":"dup3","profile":"shell","labels":{"k":"1","k":"2"}}`, "dup3", `appears twice`},
		{`{"id":"d4","id":"d5","profile":"shell"}`, "", `key "id" appears twice`},
		{`{"ID":"d6","profile":"shell"}`, "", `key "ID" is not "id"`},
		{`{"id":"big-1","profile":"shell","prompt":"` + big + `"}`, "big-1", "largest allowed"},
		{`{"id":"big-2","profile":"shell","bogus":"` + big + `"}`, "big-2", "largest allowed"},
		{`{"id":"all","profile":"shell"}`, "", "reserved"},
		{`{"id":"Operator","profile":"shell"}`, "", "reserved"},
		{`{"id":"res1","profile":"shell","group":"operator"}`, "res1", "reserved"},
		{`{"id":"res2","profile":"shell","pool":"all"}`, "res2", "reserved"},
	}
	for _, c := range cases {
		ack := b.publish(t, "default", c.body)
		id := c.id
		if id == "" {
			id = b.derivedID(t, ack.Sequence)
		}
		st := b.waitFinal(t, id)
		require.Equal(t, messages.StateFailed, st.State, c.body[:min(len(c.body), 80)])
		require.Contains(t, st.Reason, c.reason, c.body[:min(len(c.body), 80)])
		require.Equal(t, c.body, string(b.deadLetter(t, "default", id).Data))
	}
	require.Empty(t, b.rt.Starts(), "no invalid request ran")
}
