package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/coordination/bridgecmd"
	"github.com/jetcrew/jetcrew/workspace"
)

// bridgeCmd is `jetcrew bridge [launch ...]`: the coordination bridge inside
// a run container (the MCP server on stdio, or the agent's launcher). The
// worker mounts this very binary at /opt/jetcrew/bridge, where it runs as
// the bridge by its name; main dispatches both before any other set-up so
// stdout carries JSON-RPC frames alone. This command is what --help lists.
func (a workerCmds) bridgeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "bridge [launch [--home-seed DIR] [--stdin FILE] -- ARGV...]",
		Short: "Run the coordination bridge (inside a run container: MCP on stdio, or the agent's launcher)",
		Long: `bridge serves the jetcrew MCP tools (status, send, inbox) on stdin/stdout,
relaying every call over the run's socket (JETCREW_BRIDGE_SOCKET, default
/run/jetcrew/bridge.sock) to the worker; while the worker is replaced, a call
waits up to 60s for the socket (JETCREW_BRIDGE_RECONNECT sets another window,
0 none). "bridge launch" starts an agent CLI:
it seeds $HOME, connects the prompt file to stdin and execs the CLI.
Workers run it inside run containers; see docs/backends.md.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := bridgecmd.Run(cmd.Context(), args, a.stdin, a.stdout, a.stderr, a.getenv); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}

// workspaceCmd is `jetcrew workspace exec|capture`: the in-jail workspace
// commands (workspace.JailMain), which main dispatches before any other
// set-up. This command is what --help lists.
func (a workerCmds) workspaceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "workspace exec|capture [flags] [-- ARGV...]",
		Short: "Unpack a run's workspace snapshot or capture its result (inside a run's jail)",
		Long: `workspace exec unpacks a snapshot into the run's /workspace as the run's user,
then execs ARGV; workspace capture writes what the run changed, as one tar
stream, on stdout. Workers run them inside run containers and capture
containers; see docs/workspaces.md.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := workspace.JailMain(args, a.stdout, a.stderr); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
}

// workspaceTool is the binary workers stage for the in-jail workspace
// commands: the bridge binary tests set, else this executable, whatever
// --bridge names (a separate bridge may lack the workspace commands).
func (a workerCmds) workspaceTool() string {
	if a.bridgePath != "" {
		return a.bridgePath
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}
