package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

func (a runCmds) statusCmd() *cobra.Command {
	var (
		url    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status [flags] RUN_ID",
		Short: "Print a run's state",
		Long: `status prints the state of a run from the jetcrew-runs bucket: its id, state,
exit code, attempts, profile, worker, times and why it ended as it did.
With --json it prints the state record itself (docs/wire.md, "Run state").

A run no worker has taken yet has no state: its request, waiting in
JETCREW_RUNS, is printed as a queued state. A run known nowhere exits 1
with "run not found".`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runStatus(cmd.Context(), url, args[0], asJSON)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state record as JSON")
	return cmd
}

func (a runCmds) runStatus(ctx context.Context, url, id string, asJSON bool) error {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew status")
	if err != nil {
		return err
	}
	defer closeNATS()
	st, err := d.Status(ctx, id)
	if errors.Is(err, dispatcher.ErrRunNotFound) {
		// No worker has taken it yet: its request may be waiting.
		if req, rerr := d.Request(ctx, id); rerr == nil {
			st, err = req.State(dispatcher.WaitingReason(req.Pool, 0)), nil
		}
	}
	if err != nil {
		return err
	}
	if asJSON {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	return printState(a.stdout, st)
}

// printState writes st for people, one field a line.
func printState(w io.Writer, st messages.RunState) error {
	tw := tabwriter.NewWriter(visible(w), 0, 0, 2, ' ', 0)
	row := func(k, format string, v ...any) { fmt.Fprintf(tw, "%s:\t%s\n", k, fmt.Sprintf(format, v...)) }
	row("id", "%s", st.ID)
	row("state", "%s", st.State)
	if st.ExitCode != nil {
		row("exit code", "%d", *st.ExitCode)
	}
	if st.Reason != "" {
		row("reason", "%s", st.Reason)
	}
	row("attempts", "%d", st.Attempts)
	if st.Replays > 0 {
		row("replays", "%d", st.Replays)
	}
	row("profile", "%s", st.Profile)
	row("pool", "%s", st.Pool)
	if st.Group != "" && st.Group != st.ID {
		row("group", "%s", st.Group)
	}
	if st.Worker != "" {
		row("worker", "%s", st.Worker)
	}
	if st.ContainerID != "" {
		row("container", "%s", shortID(st.ContainerID))
		if st.Warm {
			row("warm", "%s", "yes (started in a warm container)")
		}
	}
	row("queued", "%s", formatTime(st.QueuedAt))
	if !st.StartedAt.IsZero() {
		row("started", "%s", formatTime(st.StartedAt))
	}
	if !st.FinishedAt.IsZero() {
		took := ""
		if !st.StartedAt.IsZero() {
			took = fmt.Sprintf(" (ran %s)", st.FinishedAt.Sub(st.StartedAt).Round(time.Millisecond))
		}
		row("finished", "%s%s", formatTime(st.FinishedAt), took)
	}
	row("output", "%d bytes", st.OutputBytes)
	if e := st.Egress; e != nil {
		failed := ""
		if e.UpstreamFailed > 0 {
			failed = fmt.Sprintf(", %d upstream failures", e.UpstreamFailed)
		}
		row("egress", "%d allowed, %d refused, %d bytes up, %d bytes down%s", e.Allowed, e.Refused, e.BytesUp, e.BytesDown, failed)
	}
	if u := st.Usage; u != nil {
		row("usage", "%s", describeUsage(*u))
	}
	if st.Budget != "" {
		row("budget", "%s", st.Budget)
	}
	if st.Result != "" {
		row("result", "%s", oneLine(st.Result, 200))
	}
	if len(st.Labels) > 0 {
		keys := make([]string, 0, len(st.Labels))
		for k := range st.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]string, len(keys))
		for i, k := range keys {
			pairs[i] = k + "=" + st.Labels[k]
		}
		row("labels", "%s", strings.Join(pairs, " "))
	}
	row("updated", "%s", formatTime(st.UpdatedAt))
	return tw.Flush()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05.000 MST")
}

// oneLine shortens s to at most n bytes on one line.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
