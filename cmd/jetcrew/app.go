package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

// app is the command line program with its outside world: standard streams,
// environment and the container runtime, so tests can replace them.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// getenv reads the environment (NATS_URL).
	getenv func(string) string
	// newRuntime returns the container runtime workers use and a function
	// that releases it; the Docker runtime outside tests.
	newRuntime func(ctx context.Context, log zerolog.Logger) (jail.Runtime, func() error, error)
	// force is closed when a graceful stop must be cut short (a second
	// interrupt). Nil means never.
	force <-chan struct{}
	// bridgePath is the bridge binary workers stage into runs whose
	// profile has coordination on, unless --bridge names one; empty means
	// the worker's default, the running executable itself.
	bridgePath string

	// natsConfigRoot returns where the NATS CLI keeps its configuration
	// when XDG_CONFIG_HOME is not set (contextRoot): natsCLIConfigRoot
	// outside tests.
	natsConfigRoot func() (string, error)
	// groupSecretRoot returns the directory the default group secret is
	// under (groupsecret.go): contextRoot outside tests.
	groupSecretRoot func() (string, error)

	// conn are the NATS connection options (connopts.go).
	conn connOptions
	// refuse ends the running command with a cause: a permissions
	// violation the server reported to a client command (see
	// app.dispatcher).
	refuse context.CancelCauseFunc

	logLevel string
	log      zerolog.Logger
}

func newApp() *app {
	a := &app{
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
		getenv:     os.Getenv,
		newRuntime: newDockerRuntime,
		log:        zerolog.Nop(),
		// The NATS CLI's own resolution (contextRoot).
		natsConfigRoot: natsCLIConfigRoot,
	}
	a.groupSecretRoot = a.contextRoot
	return a
}

// Exit codes other than a run's own.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// exitError ends the program with code. When err is nil the reason has
// already been printed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// usageError marks a mistake in the command line: exit code 2.
func usageError(err error) error { return &exitError{code: exitUsage, err: err} }

// run executes the command line args (without the program name) and returns
// the process exit code.
func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCmd()
	root.SetArgs(args)
	ctx, refuse := context.WithCancelCause(ctx)
	defer refuse(nil)
	a.refuse = refuse
	err := root.ExecuteContext(ctx)
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		err = cause
	}
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		err = ee.err
	} else if strings.HasPrefix(err.Error(), "unknown command") {
		code = exitUsage
	}
	if err != nil {
		fmt.Fprintf(visible(a.stderr), "jetcrew: %v\n", err)
		if code == exitUsage {
			path := root.CommandPath()
			if c, _, err := root.Find(args); err == nil {
				path = c.CommandPath()
			}
			fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", path)
		}
	}
	return code
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "jetcrew",
		Short: "Run commands and AI agents in hardened containers, fed by NATS JetStream",
		Long: `jetcrew runs commands and AI agents in hardened Docker containers, fed by
NATS JetStream. Start a server and a worker with 'jetcrew up', then submit
runs with 'jetcrew submit'.

Logs go to stderr: JSON, or human-readable when stderr is a terminal.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(a.stderr, a.logLevel)
			if err != nil {
				return usageError(err)
			}
			a.log = log
			return nil
		},
	}
	root.Version = versionString()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error")
	a.addConnFlags(root.PersistentFlags())
	sub, runs, ops, res, srv, wrk := submitCmds{a}, runCmds{a}, operatorCmds{a}, resultCmds{a}, serveCmds{a}, workerCmds{a}
	root.AddCommand(wrk.bridgeCmd(), wrk.workspaceCmd(), srv.upCmd(), wrk.workerCmd(), sub.submitCmd(), sub.followupCmd(), runs.statusCmd(), runs.watchCmd(),
		runs.cancelCmd(), runs.sendCmd(), runs.budgetCmd(), ops.egressCmd(), ops.failedCmd(), ops.replayCmd(), wrk.profilesCmd(), srv.rolesCmd(), srv.uiCmd(), runs.runsCmd(), ops.workersCmd())
	root.AddCommand(res.commands()...)
	root.AddCommand(ops.questionCmds()...)
	return root
}

// The commands by concern: each is a type over the app whose methods build
// and run the commands of that concern, with the receiver name a (the app,
// seen through one concern). What every command uses (the streams, the
// connection, following a run's output) stays on app itself.
type (
	// submitCmds submit runs: submit (one run, or --attempts) and followup.
	submitCmds struct{ *app }
	// runCmds look at and steer runs: status, watch, runs, cancel, send and budget.
	runCmds struct{ *app }
	// operatorCmds are the operator's work: failed runs, replays, questions, egress asks, workers.
	operatorCmds struct{ *app }
	// resultCmds read and take workspace results: result, diff, apply, publish, artifacts, compare.
	resultCmds struct{ *app }
	// serveCmds serve an installation: up (server, worker, console), ui and roles.
	serveCmds struct{ *app }
	// workerCmds run and equip workers: worker, profiles, and the bridge and workspace tools.
	workerCmds struct{ *app }
)

// exactArgs is cobra.ExactArgs with a usage error naming the arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return usageError(fmt.Errorf("missing argument %s", strings.Join(names[len(args):], " ")))
		case len(args) > len(names):
			return usageError(fmt.Errorf("want the argument(s) %s, got %d arguments (quote a prompt with spaces)", strings.Join(names, " "), len(args)))
		}
		return nil
	}
}

// noArgs refuses positional arguments with a usage error.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError(fmt.Errorf("unexpected argument %q", args[0]))
	}
	return nil
}
