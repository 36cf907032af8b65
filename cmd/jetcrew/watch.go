package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

func (a runCmds) watchCmd() *cobra.Command {
	var (
		url         string
		quiet       bool
		keepWaiting bool
	)
	cmd := &cobra.Command{
		Use:   "watch [flags] RUN_ID",
		Short: "Follow a run's output and events until it finishes",
		Long: `watch follows a run's events from its first one, live, until the run
finishes: its stdout and stderr are copied byte for byte to watch's stdout
and stderr, and a line per lifecycle event goes to stderr (unless --quiet).
A run that already finished is replayed. A run id known nowhere (no state,
no event, no dead letter, no request in JETCREW_RUNS) is refused at once,
exit 1, unless --keep-waiting.

watch exits like 'submit --wait': 0 when the run succeeded, the run's exit
code when it failed with one, else 1.`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runWatch(cmd.Context(), url, args[0], quiet, keepWaiting)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print no lifecycle lines")
	cmd.Flags().BoolVar(&keepWaiting, "keep-waiting", false, "wait for a run id known nowhere yet (default: say so and exit 1)")
	return cmd
}

func (a runCmds) runWatch(ctx context.Context, url, id string, quiet, keepWaiting bool) error {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew watch")
	if err != nil {
		return err
	}
	defer closeNATS()
	// A run without state may still come (published by hand, not yet taken
	// by a worker): say so, and wait.
	if _, err := d.Status(ctx, id); errors.Is(err, dispatcher.ErrRunNotFound) {
		if err := a.checkKnown(ctx, d, id, keepWaiting); err != nil {
			return err
		}
		if !quiet {
			fmt.Fprintf(a.stderr, "--- run %s has no state yet; waiting for its events (Ctrl-C to stop)\n", id)
		}
	} else if err != nil {
		return err
	}
	return a.follow(ctx, d.Events, id, quiet)
}

// checkKnown refuses to wait for a run id known nowhere
// (dispatcher.RunKnown), unless keepWaiting.
func (a runCmds) checkKnown(ctx context.Context, d *dispatcher.Dispatcher, id string, keepWaiting bool) error {
	if keepWaiting {
		return nil
	}
	known, err := d.RunKnown(ctx, id)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("run %s is unknown: no state, no event, no dead letter and no request in %s; nothing will come (--keep-waiting waits anyway)", id, messages.StreamRuns)
	}
	return nil
}
