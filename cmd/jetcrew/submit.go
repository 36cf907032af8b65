package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

type submitOptions struct {
	url     string
	profile string
	id      string
	group   string
	pool    string
	timeout time.Duration
	env     []string
	labels  []string
	wait    bool
	quiet   bool
	// workspace is --workspace: a directory to snapshot for the run.
	workspace string
	wsMax     int64
	wsTTL     time.Duration
	// gitURL and gitRef are --git and --ref: a git remote the worker
	// fetches as the run's workspace.
	gitURL, gitRef string
	// from is --from: an earlier run whose tree at its end the run starts
	// from.
	from string
	// session is followup's: the request's session.from names from, so
	// the run resumes the earlier run's agent session.
	session bool
	signKey string // --sign-key: NKey user seed file signing the request
	// groupSecret is --group-secret: the file of the secret the group's
	// key is derived from (groupsecret.go).
	groupSecret string
	// keepWaiting is --keep-waiting: wait while jetcrew's streams do not
	// exist yet and, with --wait, while no live worker serves the pool.
	keepWaiting bool
	// attempts is --attempts: how many runs of the prompt to submit in
	// one group (attempts.go); 0 for one run.
	attempts int
	// profiles is --profiles: the profiles the attempts are spread over,
	// round-robin; profileSet says --profile was given.
	profiles   []string
	profileSet bool
}

// submitLong is `jetcrew submit --help`'s text.
const submitLong = `submit publishes a run request to jetcrew.runs.<pool> and prints the run's id
on stdout. PROMPT is handed to the profile's command (for the built-in shell
profile, the shell script); "-" reads it from stdin.

With --wait it follows the run instead: the run's stdout and stderr are
copied, byte for byte, to submit's stdout and stderr (control characters shown
escaped when they are a terminal), a line per lifecycle event goes to stderr
(unless --quiet), and while the run is queued a line gives its age and its
pool's depth. When no live worker serves the pool, submit says so within
seconds and exits 1, the run staying queued (--keep-waiting waits instead).
Otherwise submit exits 0 when the run succeeded, with the run's exit code
when it failed with one, else 1. The id
is then printed on stderr, in the "submitted" line.

With --workspace DIR the run works on a snapshot of DIR, writable at
/workspace (its working directory): for a git work tree, what git would keep
(tracked files, untracked files that are not ignored, uncommitted changes)
and HEAD's history; otherwise the directory as it is. The snapshot is one
object named by its SHA-256, uploaded to the jetcrew-uploads Object Store
bucket unless jetcrew-workspaces (which only workers write, once they have
checked a snapshot's bytes) or jetcrew-uploads holds its bytes already
(read back and hashed, not taken from the object's record). When the run ends,
what it changed is kept: see jetcrew result, diff, apply and artifacts.

With --git URL [--ref REF] the run works on a commit of a git remote
instead: the worker fetches REF (a branch, tag or full reference name;
default the remote's HEAD) with its history, when the profile's git_remotes
allow URL, into the same snapshot format (cached per commit), and the run's
state records the commit. result, diff, apply and artifacts work the same.

With --from RUN_ID the run starts from an earlier run's tree at its end: its
head (its commits, and the commit jetcrew made of what it left uncommitted)
with the whole history, built by the worker from the earlier run's snapshot
and result (nothing is uploaded). The earlier run must be
finished, in the same pool, with a complete workspace result of a git
work tree, and the profiles must allow it (from_profiles, feeds). submit
reads the earlier run's state first and refuses a run it cannot read or
that has no result. "jetcrew apply" of the last run of a chain gives one
branch with every run's commits.

A request that breaks a rule (see docs/wire.md) is refused before anything is
published, with exit code 2. Submitting an id again within the stream's
duplicate window (2 minutes) publishes nothing: submit says so and exits 1
without following the first run (use "jetcrew replay ID" to run a failed run
again, or a new --id). An id whose run recorded another request is refused
the same way.

With --attempts N (1 to 16) it submits N runs of the prompt on one
workspace, snapshotted and uploaded once (every run names the same
snapshot), in one coordination group: the group is --group, else --id,
else a new id, and the runs are GROUP-1 to GROUP-N (ID-1 to ID-N with
--id). --profiles a,b,… spreads the attempts over those profiles in turn
(attempt 1 takes a, attempt 2 b, …); without --attempts it submits one
attempt per profile. submit prints the run ids on stdout, one a line, and
the group on stderr. With --wait it follows every run at once, printing a
finished line per run as it ends (not the runs' output), and exits 0 when
every attempt succeeded, else 1. Compare them with "jetcrew compare GROUP"
and take one with "jetcrew apply RUN_ID".

A group (--group, or the group of --attempts) is a group of the run's pool,
joined only with its creator's key: the request carries the key that the
group secret gives for the pool and the group, and is signed by it. The
secret is --group-secret FILE, else the file $JETCREW_GROUP_SECRET names,
else jetcrew/group.secret in the configuration directory, made on first use;
share it with whoever may add runs to your groups (docs/security.md, "Groups
and pools"). A run that names no group is alone in a group of its own.`

func (a submitCmds) submitCmd() *cobra.Command {
	var o submitOptions
	cmd := &cobra.Command{
		Use:   "submit [flags] PROMPT",
		Short: "Submit a run request",
		Long:  submitLong,
		Example: `  jetcrew submit 'echo hello'
  jetcrew submit --wait --timeout 1m --env GREETING=hi 'echo $GREETING'
  echo 'uname -a' | jetcrew submit --wait -
  jetcrew submit --wait --workspace . 'sed -i s/foo/bar/ main.go'
  jetcrew submit --wait --from RUN_ID 'make test'
  jetcrew submit --wait --attempts 3 --profiles claude,codex --workspace . 'fix the flaky test'
  jetcrew submit --wait --profile reviewer --git https://git.example.com/org/repo.git --ref main 'make test'`,
		Args: exactArgs("PROMPT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.profileSet = cmd.Flags().Changed("profile")
			return a.runSubmit(cmd.Context(), o, args[0])
		},
	}
	f := cmd.Flags()
	runFlags(cmd, &o, "shell", `pool whose workers take the run (default "default")`)
	workspaceFlags(cmd, &o)
	f.IntVar(&o.attempts, "attempts", 0, fmt.Sprintf("submit this many runs (1 to %d) of the prompt on one workspace, uploaded once, in one group: runs GROUP-1, GROUP-2, … (see jetcrew compare)", maxAttempts))
	f.StringSliceVar(&o.profiles, "profiles", nil, "with --attempts, profiles the attempts take in turn, comma-separated (default --attempts: one per profile)")
	return cmd
}

// runFlags registers the flags submit and followup share on cmd, into o:
// the connection, the profile (defaulting to profile), id, group, pool
// (pool's help), timeout, env, labels, --wait, --quiet, --sign-key and
// --keep-waiting.
func runFlags(cmd *cobra.Command, o *submitOptions, profile, pool string) {
	f := cmd.Flags()
	natsFlag(cmd, &o.url)
	f.StringVar(&o.profile, "profile", profile, "profile to run with (defined by the worker)")
	f.StringVar(&o.id, "id", "", "run id (default: a new ULID); submitting an id again is deduplicated")
	f.StringVar(&o.group, "group", "", "coordination group (default: the run id)")
	f.StringVar(&o.pool, "pool", "", pool)
	f.DurationVar(&o.timeout, "timeout", 0, "longest wall time of the run, e.g. 90s (default: the profile's, else the worker's)")
	f.StringArrayVar(&o.env, "env", nil, "NAME=VALUE environment variable for the run, repeatable (never secrets)")
	f.StringArrayVar(&o.labels, "label", nil, "KEY=VALUE label copied into the run's state, repeatable")
	f.BoolVar(&o.wait, "wait", false, "follow the run to its end and exit with its outcome")
	f.BoolVarP(&o.quiet, "quiet", "q", false, "with --wait, print no lifecycle lines")
	f.StringVar(&o.signKey, "sign-key", "", "file holding an NKey user seed (SU…) to sign the request with, for profiles with signed_by (docs/security.md)")
	f.StringVar(&o.groupSecret, "group-secret", "", "with a group, the file of the secret its key is derived from (default $"+groupSecretEnv+", else jetcrew/group.secret in the configuration directory, made on first use)")
	f.BoolVar(&o.keepWaiting, "keep-waiting", false, "wait while the installation is still being provisioned and, with --wait, while no live worker serves the pool (default: say so and exit 1)")
}

// request builds the run request from the flags and the prompt.
func (o submitOptions) request(prompt string) (messages.RunRequest, error) {
	env, err := parsePairs("--env", o.env)
	if err != nil {
		return messages.RunRequest{}, err
	}
	labels, err := parsePairs("--label", o.labels)
	if err != nil {
		return messages.RunRequest{}, err
	}
	ws, err := o.gitWorkspace()
	if err != nil {
		return messages.RunRequest{}, err
	}
	var session *messages.SessionRef
	if o.session {
		session = &messages.SessionRef{From: o.from}
	}
	return messages.RunRequest{
		Session:   session,
		ID:        o.id,
		Profile:   o.profile,
		Prompt:    prompt,
		Pool:      o.pool,
		Group:     o.group,
		Timeout:   messages.Duration(o.timeout),
		Env:       env,
		Labels:    labels,
		Workspace: ws,
	}, nil
}

// parsePairs reads repeated KEY=VALUE flag values into a map; nil when
// there are none.
func parsePairs(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flag, v)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%s %s given more than once", flag, k)
		}
		m[k] = val
	}
	return m, nil
}

func (a submitCmds) runSubmit(ctx context.Context, o submitOptions, prompt string) error {
	if prompt == "-" {
		b, err := io.ReadAll(io.LimitReader(a.stdin, messages.MaxRequestBytes+1))
		if err != nil {
			return fmt.Errorf("read prompt from stdin: %w", err)
		}
		prompt = string(b)
	}
	if o.attempts != 0 || len(o.profiles) > 0 {
		key, err := signingKey(o.signKey)
		if err != nil {
			return usageError(err)
		}
		return a.runAttempts(ctx, o, prompt, key)
	}
	req, err := o.request(prompt)
	if err != nil {
		return usageError(err)
	}
	// The client's one check of the request, before connecting: a bad
	// request is a usage error, and nothing is uploaded or published.
	enc, err := dispatcher.Encode(req)
	if err != nil {
		return usageError(err)
	}
	encs := []dispatcher.Encoded{enc}
	if err := a.groupKeyed(o, encs); err != nil {
		return usageError(err)
	}
	enc = encs[0]
	key, err := signingKey(o.signKey)
	if err != nil {
		return usageError(err)
	}
	d, closeNATS, err := a.dispatcher(a.natsURL(o.url), "jetcrew submit")
	if err != nil {
		return err
	}
	defer closeNATS()
	ids, err := a.submitRequests(ctx, d, o, []dispatcher.Encoded{enc}, key, nil)
	if err != nil {
		// A duplicate publish or a used id: say so, follow nothing, exit 1.
		return err
	}
	id, req := ids[0], enc.Request()
	a.log.Debug().Str("run_id", id).Str("profile", req.Profile).Str("pool", req.Pool).Msg("run submitted")
	if !o.wait {
		fmt.Fprintln(a.stdout, id)
		return nil
	}
	if !o.quiet {
		fmt.Fprintf(a.stderr, "--- submitted run %s (profile %s, pool %s)\n", id, req.Profile, req.Pool)
	}
	return a.followQueued(ctx, d, id, req.Pool, o.keepWaiting, o.quiet)
}

// signingKey loads the NKey seed in keyFile that submit signs the request
// with; nil, for an unsigned request, when keyFile is empty. A key that
// cannot be read is an error before anything is published.
func signingKey(keyFile string) (nkeys.KeyPair, error) {
	if keyFile == "" {
		return nil, nil
	}
	kp, err := dispatcher.LoadSigningKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("--sign-key: %w", err)
	}
	return kp, nil
}
