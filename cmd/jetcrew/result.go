package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/workspace"
)

// resultCmds returns result, diff, apply, publish, artifacts and compare:
// what a workspace run changed (docs/workspaces.md).
func (a resultCmds) commands() []*cobra.Command {
	return []*cobra.Command{a.resultCmd(), a.diffCmd(), a.applyCmd(), a.publishCmd(), a.artifactsCmd(), a.compareCmd()}
}

func (a resultCmds) resultCmd() *cobra.Command {
	var url string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "result [flags] RUN_ID",
		Short: "Print what a workspace run changed",
		Long: `result prints the outcome of a run that had a workspace (submit --workspace):
its state, the base commit (the submitted HEAD) and the head commit (the run's
commits, plus one for the changes it left uncommitted), the diffstat, the
stored result objects and the artifacts, and the last push of it to a git
remote (jetcrew publish). With --json it prints the run
state's workspace_result record (docs/wire.md).`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.resultState(cmd.Context(), url, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				b, _ := json.MarshalIndent(st.WorkspaceResult, "", "  ")
				_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
				return err
			}
			if err := printResult(a.stdout, st); err != nil {
				return err
			}
			a.printPublished(cmd.Context(), url, args[0])
			return nil
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the workspace_result record as JSON")
	return cmd
}

// resultState returns the state of run id, which must have a workspace
// result.
func (a resultCmds) resultState(ctx context.Context, url, id string) (messages.RunState, error) {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew result")
	if err != nil {
		return messages.RunState{}, err
	}
	defer closeNATS()
	st, err := d.Status(ctx, id)
	if err != nil {
		return st, err
	}
	if st.WorkspaceResult == nil {
		return st, fmt.Errorf("run %s is %s and has no workspace result (no --workspace, or not ended yet)", id, st.State)
	}
	return st, nil
}

// printResult writes a run's workspace result for people: everything shown
// escaped (visible), and every name the run chose (its files' paths, its
// objects and artifacts, the error naming them) as one field (visibleName).
func printResult(w io.Writer, st messages.RunState) error {
	r := st.WorkspaceResult
	w = visible(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, v ...any) { fmt.Fprintf(tw, "%s:\t%s\n", k, fmt.Sprintf(format, v...)) }
	row("run", "%s", st.ID)
	row("state", "%s", describeOutcome(messages.Event{State: st.State, Reason: st.Reason, ExitCode: st.ExitCode}))
	if g := st.WorkspaceGit; g != nil {
		row("source", "%s %s", g.URL, cmp.Or(g.Ref, "HEAD"))
	}
	if f := st.WorkspaceFrom; f != nil {
		row("from", "run %s", visibleName(f.Run))
	}
	if se := st.Session; se != nil && se.Resumed {
		row("session", "resumed %s of run %s", visibleName(se.ID), visibleName(se.From))
	} else if se != nil {
		row("session", "fresh: %s", visibleName(se.Fresh))
	}
	if r.SessionError != "" {
		row("session kept", "no: %s", visibleName(r.SessionError))
	}
	if r.Base != "" {
		row("base", "%s", r.Base)
	}
	if r.Head != "" {
		row("head", "%s (%d new commits)", r.Head, r.Commits)
	}
	row("changed", "%d files, %d insertions(+), %d deletions(-)", r.FilesChanged, r.Insertions, r.Deletions)
	if r.Error != "" {
		row("error", "%s", visibleName(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Files {
		if f.Binary {
			fmt.Fprintf(w, "  %s | binary\n", visibleName(f.Path))
		} else {
			fmt.Fprintf(w, "  %s | +%d -%d\n", visibleName(f.Path), f.Insertions, f.Deletions)
		}
	}
	for _, o := range r.Objects {
		fmt.Fprintf(w, "object %s (%d bytes, sha256 %s)\n", visibleName(o.Name), o.Size, visibleName(o.SHA256))
	}
	for _, o := range r.Artifacts {
		fmt.Fprintf(w, "artifact %s (%d bytes)\n", visibleName(o.Name), o.Size)
	}
	// Quoted: the names hold control characters.
	for _, p := range r.Refused {
		fmt.Fprintf(w, "refused %s\n", strconv.Quote(p))
	}
	if n := r.RefusedCount - len(r.Refused); n > 0 {
		fmt.Fprintf(w, "refused: %d more\n", n)
	}
	return nil
}

// fetch returns the result object kind of run id.
func (a resultCmds) fetch(ctx context.Context, url, id, kind string) ([]byte, messages.RunState, error) {
	d, closeNATS, err := a.runDispatcher(url, id, "jetcrew "+kind)
	if err != nil {
		return nil, messages.RunState{}, err
	}
	defer closeNATS()
	return d.ResultObject(ctx, id, kind)
}

func (a resultCmds) diffCmd() *cobra.Command {
	var url string
	cmd := &cobra.Command{
		Use:   "diff [flags] RUN_ID",
		Short: "Print the patch of everything a workspace run changed",
		Long: `diff prints the patch from the workspace as submitted (HEAD plus the
uncommitted changes it was submitted with) to the run's head, binary files
included, as "git apply" reads it in the work tree it was submitted from. A
run that changed nothing prints nothing. Piped or redirected, the patch is
exact; on a terminal, what a terminal would obey (escape sequences, other
control characters, bidi controls, bytes that are not UTF-8) is shown
escaped (\x1b, \u202e), so a hostile run cannot disguise its change.`,
		Example: `  jetcrew diff RUN_ID | git apply`,
		Args:    exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, st, err := a.fetch(cmd.Context(), url, args[0], messages.ResultPatch)
			if errors.Is(err, errNoResultObject) && st.WorkspaceResult != nil {
				return nil
			}
			if err != nil {
				return err
			}
			_, err = outputWriter(a.stdout, false).Write(b)
			return err
		},
	}
	natsFlag(cmd, &url)
	return cmd
}

func (a resultCmds) applyCmd() *cobra.Command {
	var url, repo string
	cmd := &cobra.Command{
		Use:   "apply [flags] RUN_ID",
		Short: "Create branch jetcrew/RUN_ID with a workspace run's commits",
		Long: `apply adds the run's commits (its own, plus one for the changes it left
uncommitted) to the git repository in the current directory (or --repo) and
creates branch jetcrew/RUN_ID at the run's head. It never changes the current
branch, the index or the work tree: look with "git log jetcrew/RUN_ID", merge
or check it out yourself. The repository must hold the run's base commit (the
HEAD it was submitted from). Applying the same run twice is a no-op.

For a run started from another (submit --from), apply first adds the
commits of the runs it was started from, up the chain (without branches of
their own), so the branch holds every run's commits on the HEAD the first
run was submitted from.`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, st, err := a.fetch(cmd.Context(), url, args[0], messages.ResultBundle)
			if errors.Is(err, errNoResultObject) && st.WorkspaceResult != nil {
				return fmt.Errorf("run %s changed nothing: no branch to create", args[0])
			}
			if err != nil {
				return err
			}
			earlier, err := a.chainBundles(cmd.Context(), url, st)
			if err != nil {
				return err
			}
			ref, head, err := workspace.ApplyChain(repo, earlier, b, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(visible(a.stdout), "branch %s at %s (%d commits on %s)\n", ref.Short(), head, st.WorkspaceResult.Commits, visibleName(shortID(st.WorkspaceResult.Base)))
			return nil
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&repo, "repo", ".", "git repository to add the branch to")
	return cmd
}

func (a resultCmds) artifactsCmd() *cobra.Command {
	var url, get, out string
	cmd := &cobra.Command{
		Use:   "artifacts [flags] RUN_ID",
		Short: "List or fetch the files a workspace run left in .jetcrew/artifacts",
		Long: `artifacts lists the regular files the run left under .jetcrew/artifacts of its
workspace, with sizes and SHA-256, one a line, tab-separated; a name's
control characters (tab and newline included) and bidi controls are shown
escaped (\t, \u202e). With --get NAME it writes that file to stdout (exact
when piped, escaped on a terminal, as diff), or to -o FILE (exact).`,
		Args: exactArgs("RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if get == "" {
				st, err := a.resultState(cmd.Context(), url, args[0])
				if err != nil {
					return err
				}
				for _, o := range st.WorkspaceResult.Artifacts {
					fmt.Fprintf(a.stdout, "%s\t%d\t%s\n", visibleName(o.Name), o.Size, visibleName(o.SHA256))
				}
				return nil
			}
			b, _, err := a.fetch(cmd.Context(), url, args[0], messages.ResultArtifacts)
			if err != nil {
				return err
			}
			return a.writeArtifact(b, get, out)
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().StringVar(&get, "get", "", "artifact to fetch (its path under .jetcrew/artifacts)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "with --get, write to this file instead of stdout")
	return cmd
}

// writeArtifact copies file name of the artifacts tar to out, or to stdout
// when out is empty: exact when stdout is a pipe or a file, escaped on a
// terminal (outputWriter, in one write so no character is split).
func (a resultCmds) writeArtifact(tarball []byte, name, out string) error {
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fmt.Errorf("no artifact %q (list them with jetcrew artifacts RUN_ID)", name)
		}
		if err != nil {
			return err
		}
		if h.Name != name || h.Typeflag != tar.TypeReg {
			continue
		}
		if out == "" {
			data, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			_, err = outputWriter(a.stdout, false).Write(data)
			return err
		}
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

// errNoResultObject is dispatcher.ErrNoResult, named here for the commands.
var errNoResultObject = dispatcher.ErrNoResult

// maxChain bounds how many earlier runs apply follows (submit --from).
const maxChain = 1000

// chainBundles returns the bundles of the runs st's run was started from
// (its workspace_from, then that run's, …), oldest first; a run of the
// chain that changed nothing has none.
func (a resultCmds) chainBundles(ctx context.Context, url string, st messages.RunState) ([][]byte, error) {
	var chain [][]byte
	seen := map[string]bool{st.ID: true}
	for from := st.WorkspaceFrom; from != nil; {
		if seen[from.Run] || len(seen) > maxChain {
			return nil, fmt.Errorf("run %s: the chain of earlier runs loops or passes %d runs", st.ID, maxChain)
		}
		seen[from.Run] = true
		b, src, err := a.fetch(ctx, url, from.Run, messages.ResultBundle)
		switch {
		case errors.Is(err, errNoResultObject) && src.WorkspaceResult != nil:
		case err != nil:
			return nil, fmt.Errorf("run %s was started from run %s: %w", st.ID, from.Run, err)
		default:
			chain = append(chain, b)
		}
		from = src.WorkspaceFrom
	}
	slices.Reverse(chain)
	return chain, nil
}
