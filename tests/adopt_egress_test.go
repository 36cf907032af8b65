package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/workertest"
)

// adoptEgressProfile is a metered profile (the key injected for
// inj.provider.test) with at most 4 model requests.
func adoptEgressProfile(image string) string {
	return fmt.Sprintf(`[profiles.budadopt]
image = %q
command = ["/bin/sh", "-c", "{prompt}"]
coordination = false
egress = ["inj.provider.test:443"]
egress_inject = [{ host = "inj.provider.test:443", header = "x-api-key", from_env = "JETCREW_TEST_PROVIDER_KEY" }]
max_model_requests = 4
`, image)
}

// adoptEgressScript sends 2 model requests, says PHASE1, waits (its worker
// leaves and the next one adopts the run meanwhile), then sends 3 more
// through the same relay (its connections reconnect to the adopter's
// socket), each line "R<n> status=...", and waits: the adopter must stop
// it for its budget.
func adoptEgressScript() string {
	return fmt.Sprintf(`m='%s'
echo "R1 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "R2 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo PHASE1
sleep 10
echo "R3 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "R4 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo "R5 $(egress-fixture post https://inj.provider.test/v1/messages "$m")"
echo DONE
sleep 60
`, messagesBody(false))
}

// TestAdoptEgressRun: a run metered by its egress proxy on real Docker,
// against the stand-in provider; its worker stops for an upgrade
// (Worker.Leave, what SIGUSR2 does: a worker process cannot resolve the
// stand-in's test names) after 2 model requests, and a worker started on
// the same engine with the same egress CA adopts it. Inside the jail the
// relay reconnects to the adopter's socket and the certificate it is
// shown is still trusted: the next 2 requests are served, the third
// refused as past max_model_requests 4, which counts the 2 before the
// adoption. The run ends failed for its budget in its first attempt, its
// container the one it started in; its usage is exactly what the
// stand-in served under both workers (4 answers, priced), each answer's
// usage event published once.
func TestAdoptEgressRun(t *testing.T) {
	t.Parallel()
	needsDocker(t)
	prices, err := usage.ParsePrices("adopt-egress-test", []byte(budgetPrices))
	require.NoError(t, err)
	e := startEgressWorkerOpts(t, egressOptions{profiles: adoptEgressProfile, prices: prices, publicNet: true})
	id := "eg-adopt-" + opsSuffix(t)
	e.submit(t, id, "budadopt", adoptEgressScript())
	before := waitState(t, e.url, id, func(st messages.RunState) bool { return st.Usage != nil && st.Usage.Requests == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.w.Leave(ctx))
	require.Equal(t, []string{"running"}, runContainers(t, id), "the run's container runs on")
	successor := e.cfg.ID + "-next"
	e.startSuccessor(t, successor)

	st := waitFinal(t, e.url, id)
	out, _ := egressRunOutput(t, e.js, id)
	require.Equal(t, messages.StateFailed, st.State, "%s\n%s", st.Reason, out)
	require.Contains(t, st.Reason, "budget reached: max_model_requests 4", out)
	require.Contains(t, out, "PHASE1\n")
	require.Contains(t, out, "DONE\n")
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, 1, st.Adoptions)
	require.Equal(t, successor, st.Worker)
	require.Equal(t, before.ContainerID, st.ContainerID, "the container the run started in")
	res := scriptLines(out)
	served := 0
	for i := 1; i <= 4; i++ {
		r := res[fmt.Sprintf("R%d", i)]
		require.True(t, strings.HasPrefix(r, "status=200 "+keyTag(providerKey)), "R%d: %s", i, r)
		served++
	}
	require.True(t, strings.HasPrefix(res["R5"], "status=429 "), "R5: %s", res["R5"])
	want := messages.UsageTotals{Requests: int64(served), Tokens: fixtureTokens.Add(fixtureTokens).Add(fixtureTokens).Add(fixtureTokens), Refused: 1}
	requireUsage(t, want, float64(served)*fixtureCostUSD, st.Usage)
	var usageEvents int
	for _, m := range workertest.Events(t, e.js, id) {
		if m.Subject() == messages.SubjectEvents(id, messages.EventUsage) {
			var ev messages.UsageEvent
			require.NoError(t, json.Unmarshal(m.Data(), &ev))
			require.Equal(t, fixtureTokens, ev.Tokens)
			usageEvents++
		}
	}
	require.Equal(t, served, usageEvents, "one usage event per answer, under either worker")
	require.Eventually(t, func() bool { return len(allRunContainers(t, id)) == 0 }, 30*time.Second, 100*time.Millisecond,
		"no container is left")
}
