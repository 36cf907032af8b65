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

func (a operatorCmds) failedCmd() *cobra.Command {
	var (
		url    string
		pool   string
		asJSON bool
		all    bool
	)
	cmd := &cobra.Command{
		Use:   "failed [flags]",
		Short: "List dead letters: the requests of failed runs",
		Long: `failed lists the dead letters on stream JETCREW_FAILED, oldest first: one per
request of a run that ended failed or timed out, with its time, pool, run id,
final state, exit code, attempts and reason (the Jetcrew-* headers), and
what became of the run since (NOW): "failing" (still failed: replay it),
"replaying" (a replay waits or runs), "healed" (it succeeded since: a replay
healed it) or "cancelled", with its replay count.

A healed run's dead letters are resolved, and an archived run's ('jetcrew
failed archive RUN_ID') are put aside: both are left out unless --all, and a
line on stderr counts them.

With --json it prints a JSON array; each element also holds the request
itself, exactly as submitted ("request": the JSON document, or a string when
the body was not valid JSON).

'jetcrew replay RUN_ID' submits a dead letter again; 'jetcrew failed discard
RUN_ID' deletes a run's dead letters; 'jetcrew failed archive RUN_ID' keeps them
but out of the default list (as the console's dead letters page does).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runFailed(cmd.Context(), a.natsURL(url), pool, asJSON, all)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's dead letters (default: every pool)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().BoolVar(&all, "all", false, "also list resolved dead letters (their run succeeded since) and archived ones")
	cmd.AddCommand(a.discardCmd(), a.archiveCmd(true), a.archiveCmd(false))
	return cmd
}

func (a operatorCmds) discardCmd() *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "discard RUN_ID",
		Short: "Delete every dead letter of a run",
		Long: `discard deletes every dead letter of RUN_ID from JETCREW_FAILED, in whatever
pool (a purge of jetcrew.failed.*.RUN_ID, which the operator role may do).
The run can no longer be replayed; its state and output stay.`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := messages.ValidateToken("run id", id); err != nil {
				return usageError(err)
			}
			d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew failed discard")
			if err != nil {
				return err
			}
			defer closeNATS()
			n, err := d.Discard(cmd.Context(), id)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stderr, "discarded %d dead letter(s) of run %s\n", n, id)
			return nil
		},
	}
	natsFlag(cmd, &url)
	return cmd
}

// archiveCmd returns `jetcrew failed archive RUN_ID` (archive true) or
// `jetcrew failed unarchive RUN_ID` (false): dispatcher.Archive and
// Unarchive.
func (a operatorCmds) archiveCmd(archive bool) *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "archive RUN_ID",
		Short: "Archive a run's dead letters: kept, replayable, left out of the default list",
		Long: `archive marks RUN_ID's dead letters archived: they stay in JETCREW_FAILED
('jetcrew replay RUN_ID' still reads them) but 'jetcrew failed' and the
console's dead letters page leave them out unless asked (--all; the console's
Archived filter). The mark is an empty message on
jetcrew.failed.<pool>.<run_id>.archived, which the operator role may publish.
A dead letter stored after the mark (the run failed again) is not archived.`,
		Args: exactArgs("RUN_ID"),
	}
	verb, do := "archived", (*dispatcher.Dispatcher).Archive
	if !archive {
		cmd.Use = "unarchive RUN_ID"
		cmd.Short = "Take a run's dead letters out of the archive"
		cmd.Long = `unarchive takes RUN_ID's dead letters out of the archive ('jetcrew failed
archive'): one purge of its archive marks. A run that is not archived is
left as it is.`
		verb, do = "unarchived", (*dispatcher.Dispatcher).Unarchive
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id := args[0]
		if err := messages.ValidateToken("run id", id); err != nil {
			return usageError(err)
		}
		d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew failed "+cmd.Name())
		if err != nil {
			return err
		}
		defer closeNATS()
		if err := do(d, cmd.Context(), id); err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "%s the dead letters of run %s\n", verb, id)
		return nil
	}
	natsFlag(cmd, &url)
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
	// Fate is what became of the run since (dispatcher.FateOf); Resolved
	// is true when it needs nothing more (healed).
	Fate     dispatcher.Fate `json:"fate"`
	Resolved bool            `json:"resolved,omitempty"`
	// Archived is true when an operator archived the run's dead letters
	// (dispatcher.DeadLetter.Archived).
	Archived bool `json:"archived,omitempty"`
}

func (a operatorCmds) runFailed(ctx context.Context, url, pool string, asJSON, all bool) error {
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
	reqs, _, err := d.Requests(ctx, dispatcher.DefaultRequestRead)
	if err != nil && !errors.Is(err, dispatcher.ErrNotProvisioned) {
		return err
	}
	waiting := dispatcher.ReplaysWaiting(reqs)
	states := map[string]messages.RunState{}
	found := map[string]bool{}
	entries := make([]failedEntry, 0, len(dls))
	resolved, archived := 0, 0
	for _, dl := range dls {
		e := failedEntry{
			Sequence: dl.Sequence, Time: dl.Time, Pool: dl.Pool, RunID: dl.RunID, State: dl.State,
			ExitCode: dl.ExitCode, Attempts: dl.Attempts, Reason: dl.Reason, Worker: dl.Worker,
			Request: rawOrString(dl.Request), Archived: dl.Archived,
		}
		st, seen := states[dl.RunID]
		if !seen {
			st, err = d.Status(ctx, dl.RunID)
			if err != nil && !errors.Is(err, dispatcher.ErrRunNotFound) {
				return err
			}
			states[dl.RunID], found[dl.RunID] = st, err == nil
		}
		e.Now, e.Replays = st.State, st.Replays
		e.Fate = dispatcher.FateOf(st, found[dl.RunID], waiting[dl.RunID])
		e.Resolved = e.Fate.Resolved()
		switch {
		case e.Resolved:
			resolved++
		case e.Archived:
			archived++
		}
		if (e.Resolved || e.Archived) && !all {
			continue
		}
		entries = append(entries, e)
	}
	if resolved > 0 && !all {
		fmt.Fprintf(a.stderr, "%d resolved dead letter(s) not listed (their runs succeeded since): --all lists them\n", resolved)
	}
	if archived > 0 && !all {
		fmt.Fprintf(a.stderr, "%d archived dead letter(s) not listed: --all lists them\n", archived)
	}
	if asJSON {
		b, err := json.MarshalIndent(entries, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	if len(entries) == 0 && resolved+archived == 0 {
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
		now := string(e.Fate)
		if e.Replays > 0 {
			now += fmt.Sprintf(" (replays: %d)", e.Replays)
		}
		if e.Archived {
			now += ", archived"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Sequence, formatTime(e.Time), e.Pool, e.RunID,
			e.State, exit, e.Attempts, now, oneLine(e.Reason, 120))
	}
	return tw.Flush()
}
