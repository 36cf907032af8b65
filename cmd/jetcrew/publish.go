package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// remotesEnv names the remotes file when --remotes does not.
const remotesEnv = "JETCREW_REMOTES"

// publishRemote is one [remotes.NAME] table of the publisher's remotes
// file: the only git remotes publish pushes to.
type publishRemote struct {
	// URL is the remote's http(s) URL, never with credentials in it.
	URL string `toml:"url"`
	// TokenEnv names the environment variable holding the token (HTTP
	// basic auth password, and the pull request endpoint's bearer token);
	// empty for a remote that takes none.
	TokenEnv string `toml:"token_env"`
	// Username is the basic auth user name, "x-access-token" when empty.
	Username string `toml:"username"`
	// PRURL is the endpoint publish --pr POSTs {title, head, base, body}
	// to (a forge's "create a pull request" API); empty: --pr is refused.
	PRURL string `toml:"pr_url"`
	// PRBase is the pull request's base branch, "main" when empty.
	PRBase string `toml:"pr_base"`
}

// loadRemotes reads the remotes file at path: TOML, [remotes.NAME] tables,
// unknown keys refused.
func loadRemotes(path string) (map[string]publishRemote, error) {
	var f struct {
		Remotes map[string]publishRemote `toml:"remotes"`
	}
	md, err := toml.DecodeFile(path, &f)
	if err != nil {
		return nil, fmt.Errorf("remotes file %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("remotes file %s: unknown key %s", path, und[0])
	}
	for name, r := range f.Remotes {
		if err := messages.ValidateToken("remote name", name); err != nil {
			return nil, fmt.Errorf("remotes file %s: %w", path, err)
		}
		u, err := url.Parse(r.URL)
		switch {
		case r.URL == "":
			return nil, fmt.Errorf("remotes file %s: remote %s has no url", path, name)
		case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
			return nil, fmt.Errorf("remotes file %s: remote %s: url is not an http(s) URL", path, name)
		case u.User != nil:
			return nil, fmt.Errorf("remotes file %s: remote %s: url holds credentials: name an environment variable in token_env instead", path, name)
		}
		if r.PRURL != "" {
			u, err := url.Parse(r.PRURL)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
				return nil, fmt.Errorf("remotes file %s: remote %s: pr_url is not an http(s) URL without credentials", path, name)
			}
		}
	}
	return f.Remotes, nil
}

// remotesPath is --remotes, else $JETCREW_REMOTES, else remotes.toml in
// the user's configuration directory (jetcrew/).
func (a resultCmds) remotesPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if p := a.getenv(remotesEnv); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", errors.New("no remotes file: give --remotes or set " + remotesEnv)
	}
	return filepath.Join(dir, "jetcrew", "remotes.toml"), nil
}

// publishLong is `jetcrew publish --help`'s text.
const publishLong = `publish pushes the run's head (the commits apply would put on branch
jetcrew/RUN_ID: the run's own, the chain's of a run started from another, and
one for what it left uncommitted) as branch BRANCH of the git remote NAME of
the publisher's remotes file (--remotes, else $JETCREW_REMOTES, else
jetcrew/remotes.toml in the user's configuration directory):

  [remotes.origin]
  url = "https://git.example.com/acme/app.git"
  token_env = "GIT_TOKEN"   # the token, read from this variable here only
  username = "x-access-token"
  pr_url = "https://git.example.com/api/repos/acme/app/pulls"  # for --pr
  pr_base = "main"

Only the remotes of the file are pushed to; their URLs and tokens stay on
this side: no run ever sees them. The objects are built in a temporary bare
repository from the run's bundles and the history of the repository the
run was submitted from (--repo, as apply), and pushed with go-git over
http(s): no git hook and no git config of either side is run or read.

A remote branch that exists and is not an ancestor of the run's head (it
moved) is refused; --force replaces it, as long as it is still where publish
saw it (a lease). What was pushed is recorded as the run's publish event
(jetcrew.events.RUN_ID.publish), which "jetcrew result" shows. With --pr,
publish then POSTs {"title", "head", "base", "body"} (JSON) to the remote's
pr_url with the token as bearer: a forge's create-pull-request call.`

// publishFlags are publish's flags, as given.
type publishFlags struct {
	natsURL, repo, remotes, remote, branch, prTitle string
	force, pr                                       bool
}

func (a resultCmds) publishCmd() *cobra.Command {
	var pf publishFlags
	cmd := &cobra.Command{
		Use:   "publish [flags] RUN_ID --remote NAME --branch BRANCH",
		Short: "Push a workspace run's head as a branch to a configured git remote",
		Long:  publishLong,
		Example: `  jetcrew publish RUN_ID --remote origin --branch agent/fix-login
  jetcrew publish RUN_ID --remote origin --branch agent/fix-login --pr`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := a.publishRequest(args[0], pf)
			if err != nil {
				return err
			}
			return a.publish(cmd.Context(), pf.natsURL, q)
		},
	}
	natsFlag(cmd, &pf.natsURL)
	f := cmd.Flags()
	f.StringVar(&pf.repo, "repo", ".", "git repository the run was submitted from (it holds the run's base commit)")
	f.StringVar(&pf.remotes, "remotes", "", "the publisher's remotes file (default $"+remotesEnv+", else jetcrew/remotes.toml in the user's configuration directory)")
	f.StringVar(&pf.remote, "remote", "", "name of the remote in the remotes file")
	f.StringVar(&pf.branch, "branch", "", "branch of the remote to push to (created, or fast-forwarded)")
	f.BoolVar(&pf.force, "force", false, "replace the remote branch even when it is not an ancestor of the run's head (only if it has not moved since publish looked)")
	f.BoolVar(&pf.pr, "pr", false, "after the push, open a pull request through the remote's pr_url")
	f.StringVar(&pf.prTitle, "pr-title", "", "with --pr, the pull request's title (default: jetcrew run RUN_ID)")
	return cmd
}

// publishRequest checks publish's run id and flags pf before connecting,
// and finds the remote in the remotes file and its token in the
// environment.
func (a resultCmds) publishRequest(id string, pf publishFlags) (publishRequest, error) {
	if err := messages.ValidateToken("run id", id); err != nil {
		return publishRequest{}, usageError(err)
	}
	if pf.remote == "" || pf.branch == "" {
		return publishRequest{}, usageError(errors.New("publish needs --remote and --branch"))
	}
	path, err := a.remotesPath(pf.remotes)
	if err != nil {
		return publishRequest{}, usageError(err)
	}
	remotes, err := loadRemotes(path)
	if err != nil {
		return publishRequest{}, err
	}
	r, ok := remotes[pf.remote]
	if !ok {
		names := make([]string, 0, len(remotes))
		for n := range remotes {
			names = append(names, n)
		}
		sort.Strings(names)
		return publishRequest{}, fmt.Errorf("remote %q is not in %s (its remotes: %s): publish pushes only to those", pf.remote, path, strings.Join(names, ", "))
	}
	if pf.pr && r.PRURL == "" {
		return publishRequest{}, fmt.Errorf("remote %s has no pr_url in %s: --pr cannot open a pull request", pf.remote, path)
	}
	var token string
	if r.TokenEnv != "" {
		if token = a.getenv(r.TokenEnv); token == "" {
			return publishRequest{}, fmt.Errorf("remote %s: environment variable %s (its token_env) is empty", pf.remote, r.TokenEnv)
		}
	}
	return publishRequest{
		id: id, remote: pf.remote, r: r, token: token, repo: pf.repo, branch: pf.branch, force: pf.force, pr: pf.pr, prTitle: pf.prTitle,
	}, nil
}

// publishRequest is one publish, its flags checked.
type publishRequest struct {
	id, remote string
	r          publishRemote
	token      string
	repo       string
	branch     string
	force, pr  bool
	prTitle    string
}

func (a resultCmds) publish(ctx context.Context, natsURL string, q publishRequest) error {
	b, st, err := a.fetch(ctx, natsURL, q.id, messages.ResultBundle)
	if errors.Is(err, errNoResultObject) && st.WorkspaceResult != nil {
		return fmt.Errorf("run %s changed nothing: no commit to publish", q.id)
	}
	if err != nil {
		return err
	}
	earlier, err := a.chainBundles(ctx, natsURL, st)
	if err != nil {
		return err
	}
	p, err := workspace.Publish(ctx, workspace.PublishOptions{
		Repo: q.repo, Earlier: earlier, Bundle: b, RunID: q.id,
		URL: q.r.URL, Username: q.r.Username, Token: q.token, Branch: q.branch, Force: q.force,
	})
	if err != nil {
		return fmt.Errorf("publish run %s to %s (%s): %w", q.id, q.remote, q.r.URL, err)
	}
	how := "created"
	switch {
	case p.UpToDate:
		how = "already there"
	case p.Forced:
		how = "forced over " + shortID(p.Old.String())
	case !p.Old.IsZero():
		how = "fast-forward from " + shortID(p.Old.String())
	}
	fmt.Fprintf(visible(a.stdout), "pushed %s to %s %s (%s): %s\n", p.Commit, q.remote, q.branch, q.r.URL, how)
	ev := messages.PublishEvent{RunID: q.id, Time: time.Now().UTC(), Remote: q.remote, URL: q.r.URL, Branch: q.branch, Commit: p.Commit.String(), Forced: p.Forced}
	if !p.Old.IsZero() {
		ev.Old = p.Old.String()
	}
	if q.pr {
		title := q.prTitle
		if title == "" {
			title = "jetcrew run " + q.id
		}
		ev.PullRequest, err = openPullRequest(ctx, q.r, q.token, title, q.branch,
			fmt.Sprintf("The result of jetcrew run %s (%d commits, %d files changed).", q.id, st.WorkspaceResult.Commits, st.WorkspaceResult.FilesChanged))
		if err != nil {
			// Record the push all the same: it happened.
			if rerr := a.recordPublish(ctx, natsURL, ev); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
		fmt.Fprintf(visible(a.stdout), "pull request %s\n", visibleName(ev.PullRequest))
	}
	return a.recordPublish(ctx, natsURL, ev)
}

// recordPublish stores ev as the run's publish event.
func (a resultCmds) recordPublish(ctx context.Context, natsURL string, ev messages.PublishEvent) error {
	d, closeNATS, err := a.runDispatcher(natsURL, ev.RunID, "jetcrew publish")
	if err != nil {
		return fmt.Errorf("pushed, but not recorded: %w", err)
	}
	defer closeNATS()
	if err := d.RecordPublish(ctx, ev); err != nil {
		return fmt.Errorf("pushed, but not recorded: %w", err)
	}
	return nil
}

// maxPRResponse bounds how much of the pull request endpoint's answer is
// read.
const maxPRResponse = 1 << 20

// openPullRequest POSTs {"title","head","base","body"} to r.PRURL, with
// token as bearer when there is one, and returns the pull request's URL:
// the answer's html_url (a forge's JSON), else r.PRURL. A status other
// than 2xx is an error naming it, never the token.
func openPullRequest(ctx context.Context, r publishRemote, token, title, head, body string) (string, error) {
	base := r.PRBase
	if base == "" {
		base = "main"
	}
	data, err := json.Marshal(map[string]string{"title": title, "head": head, "base": base, "body": body})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.PRURL, bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("pull request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// No redirect: the bearer token goes to pr_url's host alone.
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("pull request: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, maxPRResponse))
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("pull request: %s answered %s", r.PRURL, resp.Status)
	}
	var got struct {
		HTMLURL string `json:"html_url"`
	}
	if json.Unmarshal(answer, &got) == nil && got.HTMLURL != "" {
		return got.HTMLURL, nil
	}
	return r.PRURL, nil
}

// printPublished writes the run's last publish event, if any, as result's
// last line. It is best effort: without the events stream, or without the
// right to read it, result shows the rest.
func (a resultCmds) printPublished(ctx context.Context, natsURL, id string) {
	d, closeNATS, err := a.runDispatcher(natsURL, id, "jetcrew result")
	if err != nil {
		return
	}
	defer closeNATS()
	ev, err := d.LastPublish(ctx, id)
	if err != nil || ev == nil {
		return
	}
	line := fmt.Sprintf("published %s to %s %s (%s) at %s", ev.Commit, ev.Remote, ev.Branch, ev.URL, ev.Time.Format(time.RFC3339))
	if ev.Forced {
		line += ", forced over " + shortID(ev.Old)
	}
	if ev.PullRequest != "" {
		line += ", pull request " + ev.PullRequest
	}
	fmt.Fprintln(visible(a.stdout), visibleName(line))
}
