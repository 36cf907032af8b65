// Command jetcrew-bridge is the MCP server of a jetcrew run container (and
// the in-jail workspace commands, `jetcrew-bridge workspace exec|capture`,
// workspace.JailMain): the bridge command of package coordination/bridgecmd, which
// the jetcrew binary also runs (`jetcrew bridge`, or started as "bridge").
// Workers stage the jetcrew binary itself by default; this one is for
// operators who want a separate, smaller bridge (`jetcrew worker --bridge
// PATH`).
//
// Build it static: CGO_ENABLED=0 go build -o jetcrew-bridge ./cmd/jetcrew-bridge
package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/jetcrew/jetcrew/coordination/bridgecmd"
	"github.com/jetcrew/jetcrew/workspace"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	bridgecmd.Version = version
	// A worker may stage this binary for the in-jail workspace commands
	// too (Config.WorkspaceTool defaults to the bridge).
	if len(os.Args) > 1 && os.Args[1] == "workspace" {
		os.Exit(workspace.JailMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(bridgecmd.Main(os.Args[1:]))
}

// run is bridgecmd.Run, for this package's tests.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	return bridgecmd.Run(ctx, args, stdin, stdout, stderr, getenv)
}

// logLevel is bridgecmd.LogLevel, for this package's tests.
func logLevel(s string) slog.Level { return bridgecmd.LogLevel(s) }
