// Command jetcrew runs commands and AI agents in hardened Docker containers,
// fed by NATS JetStream.
//
//	jetcrew up                      an embedded NATS server and a worker, in one process
//	jetcrew worker                  a worker against any NATS server
//	jetcrew submit 'echo hi'        submit a run (--wait follows it to its end; --attempts N: N runs in a group)
//	jetcrew followup RUN_ID 'more'  a follow-up: starts from the run's tree, resumes its agent's session
//	jetcrew status RUN_ID           a run's state
//	jetcrew watch RUN_ID            follow a run's output and events
//	jetcrew cancel RUN_ID           cancel a queued or running run
//	jetcrew send RUN_ID TEXT        steer a running agent: TEXT as its next user turn, and in its inbox
//	jetcrew budget RUN_ID +USD      raise a run's (or --group's) model budget
//	jetcrew egress pending          connections of runs waiting for an operator (egress_ask)
//	jetcrew egress allow ID         allow one (--profile: for the profile from now on)
//	jetcrew egress deny ID          deny one
//	jetcrew questions               runs' questions waiting for an operator (their ask tool), one a line
//	jetcrew answer QUESTION_ID TEXT answer one
//	jetcrew runs                    list runs (--state, --pool, --group, --label ...)
//	jetcrew workers                 list live workers: pool, concurrency, heartbeat, warm pools
//	jetcrew failed                  list dead letters (failed runs' requests; --all: healed ones too)
//	jetcrew failed discard RUN_ID   delete a run's dead letters
//	jetcrew failed archive RUN_ID   put a run's dead letters aside (failed --all lists them)
//	jetcrew failed unarchive RUN_ID take them out of the archive
//	jetcrew replay RUN_ID           submit a failed run again from its dead letter
//	jetcrew result RUN_ID           what a workspace run changed
//	jetcrew diff RUN_ID             the patch of everything a workspace run changed
//	jetcrew apply RUN_ID            branch jetcrew/RUN_ID with a workspace run's commits
//	jetcrew publish RUN_ID          push a workspace run's head as a branch to a configured git remote
//	jetcrew artifacts RUN_ID        list or fetch the files a workspace run left
//	jetcrew compare GROUP           a group's attempts side by side (submit --attempts); RUN_A RUN_B: their interdiff
//	jetcrew ui                      serve the web console (also served by up)
//	jetcrew profiles check FILE     check a profile file, print each profile's effective configuration
//	jetcrew roles permissions       the roles' permissions as nats-server variables
//	jetcrew roles users DIR         NATS users per role for a real server
//	jetcrew bridge                  the coordination bridge, inside a run container
//	jetcrew workspace exec|capture  unpack and capture a workspace, inside the jail
//	jetcrew --version               the build: version, commit, Go version
//
// Every command that connects takes the NATS CLI's connection options
// (--context, --creds, --nkey, --tlsca, ...); docs/security.md.
//
// docs/cli.md documents every command and flag; docs/wire.md the protocol.
package main

import (
	"cmp"
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/jetcrew/jetcrew/coordination/bridgecmd"
	"github.com/jetcrew/jetcrew/workspace"
)

func main() {
	// The bridge, by name (mounted at /opt/jetcrew/bridge in a run) or as
	// `jetcrew bridge`: before anything else, so stdout carries JSON-RPC
	// frames alone.
	bridgecmd.Version = cmp.Or(commit, "dev")
	if bridgecmd.IsBridgeName(os.Args[0]) {
		os.Exit(bridgecmd.Main(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "bridge" {
		os.Exit(bridgecmd.Main(os.Args[2:]))
	}
	// The in-jail workspace commands, inside a run's container: nothing
	// else set up, nothing printed but their own output.
	if len(os.Args) > 1 && os.Args[1] == "workspace" {
		os.Exit(workspace.JailMain(os.Args[2:], os.Stdout, os.Stderr))
	}
	ctx, cancel := context.WithCancel(context.Background())
	force := make(chan struct{})
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	// The first signal starts a graceful stop, the second cuts the drain
	// short, the third exits at once. The goroutine ends with the process.
	go func() {
		<-sigs
		cancel()
		<-sigs
		close(force)
		<-sigs
		os.Exit(130)
	}()

	a := newApp()
	a.force = force
	os.Exit(a.run(ctx, os.Args[1:]))
}
