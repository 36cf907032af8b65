package worker_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
)

func TestMetricsAndHealth(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.submit(t, messages.RunRequest{ID: "m1", Profile: "shell", Prompt: "out x"})
	b.submit(t, messages.RunRequest{ID: "m2", Profile: "shell", Prompt: "exit 2"})
	b.waitFinal(t, "m1")
	b.waitFinal(t, "m2")
	srv := httptest.NewServer(b.w.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := srv.Client().Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// A slot is freed just after the run's outcome is recorded: poll.
	require.Eventually(t, func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `jetcrew_runs_in_flight{pool="default",worker="w1"} 0`)
	}, 5*time.Second, 10*time.Millisecond)
	code, body := get("/metrics")
	require.Equal(t, 200, code)
	for _, want := range []string{
		`jetcrew_runs_started_total{pool="default",worker="w1"} 2`,
		`jetcrew_runs_finished_total{pool="default",state="succeeded",worker="w1"} 1`,
		`jetcrew_runs_finished_total{pool="default",state="failed",worker="w1"} 1`,
		`jetcrew_run_duration_seconds_count{pool="default",worker="w1"} 2`,
		`jetcrew_queue_wait_seconds_count{pool="default",worker="w1"} 2`,
		`jetcrew_runs_in_flight{pool="default",worker="w1"} 0`,
	} {
		require.Contains(t, body, want)
	}
	code, _ = get("/healthz")
	require.Equal(t, 200, code)
	code, _ = get("/readyz")
	require.Equal(t, 200, code)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, b.w.Stop(ctx))
	code, body = get("/readyz")
	require.Equal(t, 503, code)
	require.True(t, strings.HasPrefix(body, "not ready"))
}
