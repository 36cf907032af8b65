package main

import (
	"errors"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
	"github.com/jetcrew/jetcrew/workspace"
)

// workspaceFlags adds submit's workspace flags.
func workspaceFlags(cmd *cobra.Command, o *submitOptions) {
	f := cmd.Flags()
	f.StringVar(&o.workspace, "workspace", "", "directory the run works on: snapshotted (a git work tree with its history, or the directory as it is), uploaded to the jetcrew-uploads bucket unless a bucket holds its bytes, writable at /workspace")
	f.Int64Var(&o.wsMax, "workspace-max-bytes", workspace.DefaultMaxSnapshotBytes, "largest snapshot to upload, in bytes; a larger one is refused before anything is stored")
	f.DurationVar(&o.wsTTL, "workspace-ttl", workspace.DefaultWorkspaceTTL, "lifetime of snapshots in the jetcrew-workspaces and jetcrew-uploads buckets, used when submit creates them")
	f.StringVar(&o.gitURL, "git", "", "http(s) URL of a git remote the run works on instead of --workspace: the worker fetches --ref's commit, when the profile's git_remotes allow the URL")
	f.StringVar(&o.gitRef, "ref", "", "with --git, the branch, tag or full reference name to fetch (default: the remote's HEAD)")
	f.StringVar(&o.from, "from", "", "id of an earlier run whose tree at its end (its head: its commits, and what it left uncommitted, committed) the run starts from, built by the worker from stored objects: nothing is uploaded")
}

// gitWorkspace returns the request's workspace field for --git and --ref,
// nil without --git. --git with --workspace, or --ref without --git, is a
// usage error.
func (o submitOptions) gitWorkspace() (*messages.WorkspaceRef, error) {
	if o.from != "" {
		if o.gitURL != "" || o.gitRef != "" || o.workspace != "" {
			return nil, errors.New("--from and --git or --workspace name two workspaces: give one")
		}
		return &messages.WorkspaceRef{From: o.from}, nil
	}
	switch {
	case o.gitURL == "" && o.gitRef != "":
		return nil, errors.New("--ref needs --git")
	case o.gitURL == "":
		return nil, nil
	case o.workspace != "":
		return nil, errors.New("--git and --workspace name two workspaces: give one")
	}
	return &messages.WorkspaceRef{Git: &messages.GitSource{URL: o.gitURL, Ref: o.gitRef}}, nil
}

// addWorkerWorkspaceFlags adds the worker's workspace limits and bucket
// settings (worker and up).
func addWorkerWorkspaceFlags(fs *pflag.FlagSet, c *tree.Config) {
	fs.Int64Var(&c.MaxBytes, "workspace-max-bytes", workspace.DefaultMaxSnapshotBytes,
		"largest workspace snapshot, unpacked tree and captured change a run may have, each in bytes; a larger one fails the run")
	fs.IntVar(&c.GitFetches, "git-fetches", 2,
		"most git fetches (of profiles' git_remotes sources) and builds of a workspace from an earlier run's result (submit --from) this worker makes at once, together; each writes its pack to a file and holds up to a few times --workspace-max-bytes in memory")
	fs.DurationVar(&c.Buckets.WorkspaceTTL, "workspace-ttl", workspace.DefaultWorkspaceTTL, "lifetime of snapshots in jetcrew-workspaces and jetcrew-uploads (when the worker creates the buckets)")
	fs.Int64Var(&c.Buckets.WorkspaceBytes, "workspace-bucket-bytes", 0, "size cap of jetcrew-workspaces, and of jetcrew-uploads, in bytes, 0 for none (when the worker creates the buckets)")
	fs.DurationVar(&c.Buckets.ResultTTL, "result-ttl", workspace.DefaultResultTTL, "lifetime of run results in jetcrew-results (when the worker creates the bucket)")
	fs.Int64Var(&c.Buckets.ResultBytes, "result-bucket-bytes", 0, "size cap of jetcrew-results in bytes, 0 for none (when the worker creates the bucket)")
}
