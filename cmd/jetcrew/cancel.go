package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
)

func (a runCmds) cancelCmd() *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "cancel [flags] RUN_ID",
		Short: "Cancel a queued or running run",
		Long: `cancel asks the workers to cancel a run, with a request on
jetcrew.cancel.<run_id> (the same as ` + "`nats req jetcrew.cancel.<run_id> ''`" + `),
and prints what the worker that acted answered:

  cancelled      the run had not started; it is recorded cancelled and will
                 be skipped when its request is delivered
  stopping       the run was running; its container gets SIGTERM, then
                 SIGKILL after the worker's grace period, and the run ends
                 cancelled
  already_final  the run had already ended; nothing changed

A run id no worker has seen yet is recorded cancelled too. cancel exits 0 for
these, and 1 when the cancel failed or no worker answered.`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runCancel(cmd.Context(), url, args[0])
		},
	}
	natsFlag(cmd, &url)
	return cmd
}

func (a runCmds) runCancel(ctx context.Context, url, id string) error {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew cancel")
	if err != nil {
		return err
	}
	defer closeNATS()
	r, err := d.Cancel(ctx, id)
	if err != nil && !errors.Is(err, dispatcher.ErrCancelFailed) {
		return err
	}
	line := fmt.Sprintf("%s: %s", r.Result, r.Message)
	if r.Worker != "" {
		line += fmt.Sprintf(" (worker %s)", r.Worker)
	}
	if err != nil {
		return fmt.Errorf("cancel run %s: %s", id, line)
	}
	fmt.Fprintf(visible(a.stdout), "run %s %s\n", id, line)
	return nil
}
