package main

// Following a run: its output copied to the terminal, a line per lifecycle
// event, and the exit code its end gives the program.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// follow copies the events of run id to the terminal until it finishes and
// returns the error that gives the program the run's exit code.
func (a *app) follow(ctx context.Context, events *dispatcher.Events, id string, quiet bool) error {
	return a.followWith(ctx, id, quiet, func(fn func(dispatcher.WatchEvent) error) (messages.Event, error) {
		return events.Watch(ctx, id, fn)
	})
}

// followWith is follow with the watch to use: Watch, or WatchReplay for a
// replayed run.
func (a *app) followWith(ctx context.Context, id string, quiet bool, watch func(fn func(dispatcher.WatchEvent) error) (messages.Event, error)) error {
	p := &runPrinter{stdout: a.stdout, stderr: a.stderr, quiet: quiet, atLineStart: true}
	fin, err := watch(p.print)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: exitInterrupted, err: fmt.Errorf("stopped following run %s; it goes on (jetcrew watch %s)", id, id)}
		}
		return err
	}
	code := runExitCode(fin)
	if code == exitOK {
		return nil
	}
	if !quiet {
		// The finished line already said why.
		return &exitError{code: code}
	}
	return &exitError{code: code, err: fmt.Errorf("run %s %s", id, describeOutcome(fin))}
}

// runExitCode maps a run's finished event to submit's exit code: 0 when it
// succeeded, its exit code when it failed with one (1 to 255), else 1.
func runExitCode(fin messages.Event) int {
	if fin.State == messages.StateSucceeded {
		return exitOK
	}
	if fin.State == messages.StateFailed && fin.ExitCode != nil && *fin.ExitCode > 0 && *fin.ExitCode < 256 {
		return *fin.ExitCode
	}
	return exitFailure
}

// describeOutcome says how a run ended: "succeeded", "failed (exit code 3)".
func describeOutcome(ev messages.Event) string {
	s := string(ev.State)
	switch {
	case ev.Reason != "":
		s += " (" + ev.Reason + ")"
	case ev.ExitCode != nil && ev.State != messages.StateSucceeded:
		s += fmt.Sprintf(" (exit code %d)", *ev.ExitCode)
	}
	return s
}

// runPrinter writes a run's events: output bytes as they are to stdout or
// stderr, and unless quiet a line per lifecycle event to stderr.
type runPrinter struct {
	stdout, stderr io.Writer
	quiet          bool
	// atLineStart is false when the last output byte was not a newline, so
	// the next lifecycle line starts a line of its own.
	atLineStart bool
}

func (p *runPrinter) print(ev dispatcher.WatchEvent) error {
	if ev.Type == messages.EventOutput {
		w := p.stdout
		if ev.Stream == messages.StreamStderr {
			w = p.stderr
		}
		if len(ev.Data) == 0 {
			return nil
		}
		if _, err := outputWriter(w, false).Write(ev.Data); err != nil {
			return fmt.Errorf("write run output: %w", err)
		}
		p.atLineStart = ev.Data[len(ev.Data)-1] == '\n'
		return nil
	}
	if p.quiet {
		return nil
	}
	switch ev.Type {
	case messages.EventEgress:
		return p.printEgress(ev)
	case messages.EventUsage:
		return p.printUsage(ev)
	case messages.EventBudget:
		return p.printBudget(ev)
	}
	line := "--- " + describeEvent(ev)
	if !p.atLineStart {
		line = "\n" + line
		p.atLineStart = true
	}
	_, err := fmt.Fprintln(visible(p.stderr), line)
	return err
}

// describeEvent is the lifecycle line of an event, without the prefix.
func describeEvent(ev dispatcher.WatchEvent) string {
	e := ev.Event
	var b strings.Builder
	b.WriteString(string(ev.Type))
	switch ev.Type {
	case messages.EventStarted:
		fmt.Fprintf(&b, ": attempt %d", max(e.Attempt, ev.Attempt))
		if e.Worker != "" {
			fmt.Fprintf(&b, " on worker %s", e.Worker)
		}
		if e.ContainerID != "" {
			fmt.Fprintf(&b, ", container %s", shortID(e.ContainerID))
		}
		if e.Warm {
			b.WriteString(" (warm)")
		}
	case messages.EventFinished:
		b.WriteString(": " + describeOutcome(e))
		if e.Usage != nil {
			b.WriteString("; model usage: " + describeUsage(*e.Usage))
		}
		if ev.FromState {
			b.WriteString(" [from the run's state: its finished event is gone]")
		}
	case messages.EventAdopted:
		fmt.Fprintf(&b, ": attempt %d goes on on worker %s, taken over from %s after %s unwatched",
			max(e.Attempt, ev.Attempt), e.Worker, e.AdoptedFrom, (time.Duration(e.GapMS) * time.Millisecond).Round(10*time.Millisecond))
	case messages.EventDuplicate, messages.EventCancel:
		if e.Reason != "" {
			b.WriteString(": " + e.Reason)
		}
	}
	return b.String()
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
