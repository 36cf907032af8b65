package egress

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetcrew/jetcrew/egress/policy"
	"github.com/stretchr/testify/require"
)

// A host of the ask list is put to the operator: the connection waits for
// the answer (several at once share one question), an allow lets it
// through and is kept for the run, a deny refuses it, no answer refuses it
// and is asked again; every answer is in the attempt's event, with who gave
// it. A host on neither list is refused without asking.
func TestAskOperator(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	p := port(t, srv.URL)
	lo := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	b := setup(t, table{"ask.example": lo, "deny.example": lo, "late.example": lo, "other.example": lo}, "127.0.0.1:"+p)
	var asked atomic.Int32
	release := make(chan struct{})
	late := atomic.Bool{}
	b.sess.AskFor(policy.Must("ask.example:"+p, "deny.example:"+p, "late.example:"+p), func(ctx context.Context, host string, port int) Decision {
		asked.Add(1)
		switch host {
		case "ask.example":
			<-release
			return Decision{Allow: true, By: "alice", Scope: "run"}
		case "deny.example":
			return Decision{By: "bob", Scope: "profile", Profile: "p"}
		}
		if late.Load() {
			return Decision{Allow: true, By: "carol", Scope: "run"}
		}
		return Decision{TimedOut: true, Wait: "2m0s"}
	})
	c := b.client()
	get := func(host string) (int, error) {
		resp, err := c.Get(fmt.Sprintf("http://%s:%s/", host, p))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	// Three connections at once wait for one question.
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = get("ask.example")
		}()
	}
	require.Eventually(t, func() bool { return asked.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the others are waiting, not asking
	require.EqualValues(t, 1, asked.Load())
	close(release)
	wg.Wait()
	require.Equal(t, []int{200, 200, 200}, codes)
	code, err := get("ask.example")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.EqualValues(t, 1, asked.Load(), "the run's answer is kept")

	code, _ = get("deny.example")
	require.Equal(t, http.StatusForbidden, code)
	code, _ = get("late.example")
	require.Equal(t, http.StatusForbidden, code, "no answer in time: refused")
	late.Store(true)
	code, _ = get("late.example")
	require.Equal(t, 200, code, "asked again after no answer")
	code, _ = get("other.example")
	require.Equal(t, http.StatusForbidden, code)
	require.EqualValues(t, 4, asked.Load(), "a host on no list is never asked")

	decisions := map[string][]string{}
	require.Eventually(t, func() bool {
		decisions = map[string][]string{}
		for _, ev := range b.recorded() {
			decisions[ev.Host] = append(decisions[ev.Host], fmt.Sprintf("%t %s", ev.Allowed, ev.Decision))
		}
		return len(decisions["ask.example"]) == 4 && len(decisions["late.example"]) == 2
	}, 5*time.Second, 10*time.Millisecond)
	for _, d := range decisions["ask.example"] {
		require.Equal(t, "true allowed by alice for the run", d)
	}
	require.Equal(t, []string{"false denied by bob for profile p"}, decisions["deny.example"])
	require.Equal(t, []string{"false no answer within 2m0s", "true allowed by carol for the run"}, decisions["late.example"])
	require.Equal(t, []string{"false "}, decisions["other.example"])
}

// A run puts at most MaxAsks questions: past them a connection to an
// ask-list host is refused without asking.
func TestAskBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, table{})
	b.sess.gate.ask.max = 2
	var asked atomic.Int32
	b.sess.AskFor(policy.Must("*.ask.example:443"), func(context.Context, string, int) Decision {
		asked.Add(1)
		return Decision{TimedOut: true, Wait: "1s"}
	})
	for i := range 4 {
		d, ok := b.sess.gate.ask.operator(context.Background(), fmt.Sprintf("h%d.ask.example", i), 443)
		require.True(t, ok)
		if i < 2 {
			require.True(t, d.TimedOut)
		} else {
			require.Equal(t, "not asked: the run asked an operator 2 times, its most", d.String())
		}
	}
	require.EqualValues(t, 2, asked.Load())
}
