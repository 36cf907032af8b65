package main

import (
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/coordination/bridgecmd"
)

// bridgeCmd is `jetcrew bridge [launch ...]`: the coordination bridge inside
// a run container (the MCP server on stdio, or the agent's launcher). The
// worker mounts this very binary at /opt/jetcrew/bridge, where it runs as
// the bridge by its name; main dispatches both before any other set-up so
// stdout carries JSON-RPC frames alone. This command is what --help lists.
func (a *app) bridgeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "bridge [launch [--home-seed DIR] [--stdin FILE] -- ARGV...]",
		Short: "Run the coordination bridge (inside a run container: MCP on stdio, or the agent's launcher)",
		Long: `bridge serves the jetcrew MCP tools (status, send, inbox) on stdin/stdout,
relaying every call over the run's socket (JETCREW_BRIDGE_SOCKET, default
/run/jetcrew/bridge.sock) to the worker. "bridge launch" starts an agent CLI:
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
