package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/messages"
)

// Exit codes of jetcrew send beyond exitOK (delivered), exitFailure and
// exitUsage.
const (
	// exitSteerQueued: the steer is in the run's inbox only.
	exitSteerQueued = 3
	// exitSteerRefused: the steer was refused (the run is not running or
	// has ended, the text breaks a rule, rate limited, unavailable).
	exitSteerRefused = 4
)

func (a runCmds) sendCmd() *cobra.Command {
	var url, id string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "send [flags] RUN_ID TEXT",
		Short: "Steer a running agent: TEXT as its next user turn, and in its inbox",
		Long: `send steers a running agent, as the operator: a request on
jetcrew.steer.<run_id> (` + "`nats req -H Jetcrew-Steer-Id:ID jetcrew.steer.RUN_ID 'text'`" + `)
answered by the worker serving the run. TEXT ("-" reads it from standard
input) is plain text of at most 16 KiB. When the run's agent CLI takes
streamed input (claude, kimi), the worker's launcher writes TEXT to its
standard input as a user turn; for every backend TEXT is also put in the
run's inbox, and the agent is told on its next tool call that it waits.

send prints what became of it and exits with:

  0  delivered  written to the agent's input (and in its inbox)
  3  queued     in the run's inbox only; the line says why
  4  refused    neither: the run is not running, is finishing or has ended, the text
                breaks a rule, the run was steered too often, or no worker
                serves its coordination; the line gives the code and reason
  1  the request failed (NATS unreachable, an unreadable reply)

--id makes a retry safe: a steer repeated with the same id is answered with
the first one's outcome and delivers nothing new.`,
		Args: exactArgs("RUN_ID", "TEXT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runSend(cmd.Context(), url, args[0], args[1], id, asJSON)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&id, "id", "", "the steer's id (letters, digits, '-', '_'; at most 64): a retry with the same id delivers nothing new (default: a random one)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the worker's reply (a SteerReply) as JSON")
	return cmd
}

func (a runCmds) runSend(ctx context.Context, url, runID, text, id string, asJSON bool) error {
	if text == "-" {
		b, err := io.ReadAll(io.LimitReader(a.stdin, messages.MaxSteerBytes+1))
		if err != nil {
			return fmt.Errorf("read the text from standard input: %w", err)
		}
		text = string(b)
	}
	if id != "" {
		if err := messages.ValidateSteerID(id); err != nil {
			return usageError(err)
		}
	}
	d, closeNATS, err := a.runDispatcher(url, runID, "jetcrew send")
	if err != nil {
		return err
	}
	defer closeNATS()
	r, err := d.Steer(ctx, runID, text, id)
	if err != nil {
		return err
	}
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(a.stdout, "%s\n", b)
	} else {
		fmt.Fprintln(visible(a.stdout), describeSteer(r))
	}
	switch r.Outcome {
	case messages.SteerDelivered:
		return nil
	case messages.SteerQueued:
		return &exitError{code: exitSteerQueued}
	default:
		return &exitError{code: exitSteerRefused}
	}
}

// describeSteer is send's line for a reply.
func describeSteer(r messages.SteerReply) string {
	line := fmt.Sprintf("run %s: steer %s %s", r.RunID, r.ID, r.Outcome)
	if r.Code != "" {
		line += " (" + r.Code + ")"
	}
	if r.Duplicate {
		line += ", a repeat of an earlier steer"
	}
	if r.MessageID != "" {
		line += ", inbox message " + r.MessageID
	}
	if r.Reason != "" {
		line += ": " + r.Reason
	}
	return line
}
