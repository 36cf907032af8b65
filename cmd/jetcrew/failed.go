package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

func (a *app) failedCmd() *cobra.Command {
	var (
		url    string
		pool   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "failed [flags]",
		Short: "List dead letters: the requests of failed runs",
		Long: `failed lists the dead letters on stream JETCREW_FAILED, oldest first: one per
request of a run that ended failed or timed out, with its time, pool, run id,
final state, exit code, attempts and reason (the Jetcrew-* headers), and the
run's state now (a replayed run shows how its replay went).

With --json it prints a JSON array; each element also holds the request
itself, exactly as submitted ("request": the JSON document, or a string when
the body was not valid JSON).

'jetcrew replay RUN_ID' submits a dead letter again.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runFailed(cmd.Context(), a.natsURL(url), pool, asJSON)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's dead letters (default: every pool)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

// failedEntry is one line of `jetcrew failed`: a dead letter and the run's
// state now.
type failedEntry struct {
	Sequence uint64          `json:"sequence"`
	Time     time.Time       `json:"time"`
	Pool     string          `json:"pool"`
	RunID    string          `json:"run_id"`
	State    messages.State  `json:"state"`
	ExitCode *int            `json:"exit_code,omitempty"`
	Attempts int             `json:"attempts"`
	Reason   string          `json:"reason"`
	Worker   string          `json:"worker,omitempty"`
	Request  json.RawMessage `json:"request"`
	// Now is the run's state at the time of listing; empty when it has none.
	Now     messages.State `json:"current_state,omitempty"`
	Replays int            `json:"replays,omitempty"`
}

func (a *app) runFailed(ctx context.Context, url, pool string, asJSON bool) error {
	if pool != "" {
		if err := messages.ValidateToken("--pool", pool); err != nil {
			return usageError(err)
		}
	}
	d, closeNATS, err := a.dispatcher(url, "jetcrew failed")
	if err != nil {
		return err
	}
	defer closeNATS()
	dls, err := d.Failed(ctx, pool)
	if err != nil {
		return err
	}
	states := map[string]messages.RunState{}
	entries := make([]failedEntry, 0, len(dls))
	for _, dl := range dls {
		e := failedEntry{
			Sequence: dl.Sequence, Time: dl.Time, Pool: dl.Pool, RunID: dl.RunID, State: dl.State,
			ExitCode: dl.ExitCode, Attempts: dl.Attempts, Reason: dl.Reason, Worker: dl.Worker,
			Request: rawOrString(dl.Request),
		}
		st, seen := states[dl.RunID]
		if !seen {
			st, err = d.Status(ctx, dl.RunID)
			if err != nil && !errors.Is(err, dispatcher.ErrRunNotFound) {
				return err
			}
			states[dl.RunID] = st
		}
		e.Now, e.Replays = st.State, st.Replays
		entries = append(entries, e)
	}
	if asJSON {
		b, err := json.MarshalIndent(entries, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	if len(entries) == 0 {
		fmt.Fprintln(a.stderr, "no dead letters")
		return nil
	}
	return printFailed(a.stdout, entries)
}

// rawOrString returns b as a JSON value: itself when it is valid JSON, else
// a JSON string of it.
func rawOrString(b []byte) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

func printFailed(w io.Writer, entries []failedEntry) error {
	tw := tabwriter.NewWriter(visible(w), 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tPOOL\tRUN ID\tSTATE\tEXIT\tATTEMPTS\tNOW\tREASON")
	for _, e := range entries {
		exit := "-"
		if e.ExitCode != nil {
			exit = strconv.Itoa(*e.ExitCode)
		}
		now := string(e.Now)
		switch {
		case now == "":
			now = "-"
		case e.Replays > 0:
			now += fmt.Sprintf(" (replays: %d)", e.Replays)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Sequence, formatTime(e.Time), e.Pool, e.RunID,
			e.State, exit, e.Attempts, now, oneLine(e.Reason, 120))
	}
	return tw.Flush()
}
