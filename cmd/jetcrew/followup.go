package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
)

// followupCmd is `jetcrew followup RUN_ID PROMPT`: submit --from RUN_ID
// plus the agent CLI's own session (docs/workspaces.md, "Follow-ups");
// with --fresh without the session.
func (a submitCmds) followupCmd() *cobra.Command {
	var o submitOptions
	var fresh bool
	cmd := &cobra.Command{
		Use:   "followup [flags] RUN_ID PROMPT",
		Short: "Submit a follow-up turn on a finished run, resuming its agent's session",
		Long: `followup submits PROMPT as a follow-up of run RUN_ID: a run that starts from
RUN_ID's tree at its end (as submit --from RUN_ID does) and resumes the agent
CLI's own session of RUN_ID, so the agent remembers what it did. It takes
submit's flags (--wait, --profile, --label, ...); the profile defaults to
RUN_ID's, and so does the pool.

The worker restores the session files RUN_ID kept (a result object beside its
patch and bundle, masked like its output) into the new run's HOME and starts
the CLI with its documented resume flag: Claude Code --resume, Codex exec
resume, opencode --session (docs/backends.md). A backend that cannot resume,
a follow-up with another profile than RUN_ID's (a session is never fed to
another profile), or a RUN_ID that kept no session starts a fresh session on
RUN_ID's tree: the run's state says why ("jetcrew status", field session).
A session the worker cannot restore, or that does not hold the session id
RUN_ID reported, starts fresh too, saying so; one the model API refuses at
its first answer (a turn cut short mid-thinking) fails the follow-up, naming
the API's error.

--fresh starts the agent without RUN_ID's session, on RUN_ID's tree (submit
--from RUN_ID with RUN_ID's profile and pool): the way on from a session the
model refuses. The run keeps a session of its own, which a follow-up of it
resumes. PROMPT "-" reads it from stdin.`,
		Example: `  jetcrew followup --wait RUN_ID 'now add a test for it'
  jetcrew followup --wait --label turn=2 RUN_ID 'rename the flag'
  jetcrew followup --wait --fresh RUN_ID 'start over: the tests still fail'`,
		Args: exactArgs("RUN_ID", "PROMPT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.profileSet = cmd.Flags().Changed("profile")
			return a.runFollowup(cmd.Context(), o, args[0], args[1], !fresh)
		},
	}
	runFlags(cmd, &o, "", "pool whose workers take the run (default: RUN_ID's)")
	cmd.Flags().BoolVar(&fresh, "fresh", false, "start the agent without RUN_ID's session, on RUN_ID's tree")
	return cmd
}

// runFollowup reads run from's state (the submitter must be able to read
// it), takes its profile and pool unless given, and submits the follow-up,
// resuming from's session when session is true.
func (a submitCmds) runFollowup(ctx context.Context, o submitOptions, from, prompt string, session bool) error {
	d, closeNATS, err := a.dispatcher(a.natsURL(o.url), "jetcrew followup")
	if err != nil {
		return err
	}
	st, err := d.Status(ctx, from)
	closeNATS()
	if err != nil {
		return fmt.Errorf("followup %s: %w", from, err)
	}
	if o.profile == "" {
		o.profile = st.Profile
	}
	if o.pool == "" {
		o.pool = st.Pool
	}
	o.from, o.session = from, session
	return a.runSubmit(ctx, o, prompt)
}
