package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

func (a operatorCmds) replayCmd() *cobra.Command {
	var (
		url   string
		wait  bool
		quiet bool
	)
	cmd := &cobra.Command{
		Use:   "replay [flags] RUN_ID",
		Short: "Submit a failed run again, from its dead letter",
		Long: `replay submits a failed run again: it takes the run's latest dead letter on
JETCREW_FAILED (subject jetcrew.failed.<pool>.<run_id>) and publishes its
body, unchanged (a signed request with its signature), to the pool's replay
subject, jetcrew.runs.<pool>.replay. A worker runs it anew under the same run
id; the run's state counts it in "replays". The replay subject needs the
operator role: a signed request runs again only from there, never when
published again to jetcrew.runs.<pool>.

The request is published with Nats-Msg-Id replay-<run_id>-<dead letter
sequence>: replaying the same dead letter twice within the duplicate window
(2 minutes) publishes it once, and a replay is never mistaken for a duplicate
of the original submit.

replay refuses, exit code 1, publishing nothing, when the run succeeded (a
worker would refuse it as a duplicate) or is still queued or running.

With --wait it follows the replayed run like 'submit --wait' (its events
only, not the failed run's) and exits like it: 0 when the run succeeded, the
run's exit code when it failed with one, else 1.`,
		Example: `  jetcrew failed
  jetcrew replay --wait 01JXAMPLE0000000000000000`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runReplay(cmd.Context(), url, args[0], wait, quiet)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the replayed run to its end and exit with its outcome")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "with --wait, print no lifecycle lines")
	return cmd
}

func (a operatorCmds) runReplay(ctx context.Context, url, id string, wait, quiet bool) error {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew replay")
	if err != nil {
		return err
	}
	defer closeNATS()
	r, err := d.Replay(ctx, id)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("dead letter %d (%s, %s) published to %s as %s sequence %d",
		r.DeadLetter.Sequence, r.DeadLetter.State, oneLine(r.DeadLetter.Reason, 80),
		messages.SubjectReplay(r.Pool), messages.StreamRuns, r.Sequence)
	if r.Duplicate {
		what = fmt.Sprintf("dead letter %d was already replayed as %s sequence %d; not published again",
			r.DeadLetter.Sequence, messages.StreamRuns, r.Sequence)
	}
	if r.RunID == "" {
		fmt.Fprintf(visible(a.stdout), "replayed run %s: %s; the request carries no id, so the worker gives it a new one\n", id, what)
		if wait {
			return errors.New("--wait: a request without an id cannot be followed (its new id is derived by the worker; find it with `jetcrew failed` or `nats kv ls jetcrew-runs`)")
		}
		return nil
	}
	if !wait {
		fmt.Fprintf(visible(a.stdout), "replayed run %s: %s\n", r.RunID, what)
		return nil
	}
	if !quiet {
		fmt.Fprintf(visible(a.stderr), "--- replayed run %s: %s\n", r.RunID, what)
	}
	return a.followWith(ctx, r.RunID, quiet, func(fn func(dispatcher.WatchEvent) error) (messages.Event, error) {
		return d.WatchReplay(ctx, r, fn)
	})
}
