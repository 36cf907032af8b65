package bridgecmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
)

// With --steer FORMAT the launcher does not replace itself with the agent
// CLI: it starts the CLI as its child with a pipe on its standard input,
// writes the run's prompt there as the first user turn, and keeps the pipe
// open so that the operator's steers, which it long-polls from the worker
// over the run's socket (relay.PathSteerNext), reach the CLI as further user
// turns. It copies the CLI's standard output to its own, line by line,
// watching for the end of each turn: when a turn ends and every user
// message written (the prompt and each steer) has had its turn, it closes
// the pipe, and the CLI, out of input, finishes as it does after a plain
// prompt. It forwards
// SIGTERM, SIGINT, SIGHUP and SIGQUIT to the CLI and exits with its exit
// code (128+N for a signal), as a shell does.

// steerFormat is how one agent CLI takes user turns on its standard input.
type steerFormat struct {
	// turn encodes text as one user turn: a JSON line with its newline.
	turn func(text string) []byte
	// ended reports whether a line of the CLI's stdout ends a turn;
	// truncated says the line was longer than maxScanLine and only its
	// start is given.
	ended func(line []byte, truncated bool) bool
}

// steerFormats maps a --steer FORMAT to its format.
var steerFormats = map[string]steerFormat{
	messages.SteerInputClaude: {turn: claudeTurn, ended: claudeTurnEnded},
	messages.SteerInputKimi:   {turn: kimiTurn, ended: kimiTurnEnded},
}

// claudeTurn is one user message of Claude Code's stream-json input.
func claudeTurn(text string) []byte {
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type msg struct {
		Role    string `json:"role"`
		Content []part `json:"content"`
	}
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Message msg    `json:"message"`
	}{"user", msg{"user", []part{{"text", text}}}})
	return append(b, '\n')
}

// claudeTurnEnded: Claude Code ends each turn with a "result" event.
func claudeTurnEnded(line []byte, truncated bool) bool {
	if truncated {
		return bytes.HasPrefix(bytes.TrimSpace(line), []byte(`{"type":"result"`))
	}
	var v struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(line, &v) == nil && v.Type == "result"
}

// kimiTurn is one user message of Kimi CLI's stream-json input.
func kimiTurn(text string) []byte {
	b, _ := json.Marshal(struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}{"user", text})
	return append(b, '\n')
}

// kimiTurnEnded: Kimi CLI's turn ends with an assistant message that calls
// no tool (its agent loop stops there).
func kimiTurnEnded(line []byte, truncated bool) bool {
	if truncated {
		return false
	}
	var v struct {
		Role      string            `json:"role"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
	}
	return json.Unmarshal(line, &v) == nil && v.Role == "assistant" && len(v.ToolCalls) == 0
}

// Limits of the steered launcher.
const (
	// maxScanLine is how much of one stdout line the launcher keeps to
	// see whether it ends a turn, in bytes; the whole line is copied
	// through whatever its length.
	maxScanLine = 1 << 20
	// steerWriteTimeout bounds writing one turn to the CLI's input: a CLI
	// that does not read its input gets the steer in its inbox only.
	steerWriteTimeout = 2 * time.Second
	// quietAfterTurn closes the input when a turn ended with steers
	// written during it and the CLI printed nothing for this long: a CLI
	// that took them into the turn that just ended (rather than a turn of
	// their own) would otherwise wait for input forever.
	quietAfterTurn = 60 * time.Second
	// steerAckSendTimeout bounds sending one steer's acknowledgement, and
	// the "closed" report, to the worker.
	steerAckSendTimeout = 5 * time.Second
	// steerPollWait is each long poll's wait, in seconds.
	steerPollWait = 25
)

// agentInput is the write end of the CLI's standard input and the turn
// accounting that decides when to close it.
//
// Every user message written (the prompt, then each steer) is owed a turn;
// each turn's end pays one. The input closes only when a turn ends with
// nothing owed: a CLI need not start a turn for what it read once its
// input has ended, so closing while a written steer waits for its turn
// could lose it (the race of claude-code#79656). The write, the count and the decision to close
// are made under one lock, so a steer is either written and owed a turn
// before the input closes, or refused because it closed: never written to
// a closed input, never written and then cut off.
type agentInput struct {
	f steerFormat

	// quietFor is quietAfterTurn (shorter in tests).
	quietFor time.Duration

	mu       sync.Mutex
	w        *os.File
	closed   bool
	owed     int         // user messages written whose turn has not ended
	quiet    *time.Timer // quietFor's, while armed
	quietGen int         // counts arming and disarming: a stale timer closes nothing
	done     chan struct{}
}

func newAgentInput(w *os.File, f steerFormat) *agentInput {
	return &agentInput{w: w, f: f, quietFor: quietAfterTurn, done: make(chan struct{})}
}

// write writes one user message of text, owed a turn; it reports why not
// when the input is closed or the write failed.
func (in *agentInput) write(text string) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return errors.New("the agent's input is closed (its last turn ended)")
	}
	_ = in.w.SetWriteDeadline(time.Now().Add(steerWriteTimeout))
	if _, err := in.w.Write(in.f.turn(text)); err != nil {
		return fmt.Errorf("write to the agent's input: %w", err)
	}
	in.owed++
	if in.quiet != nil {
		in.armQuiet() // the silence starts again: a turn is due
	}
	return nil
}

// steer writes a steer as a user message owed a turn of its own.
func (in *agentInput) steer(text string) error { return in.write(text) }

// turnEnded pays one owed turn and closes the input when none is owed;
// otherwise it waits for their turns, or quietFor of silence (a CLI that
// took a steer into the turn that just ended owes it no turn of its own).
func (in *agentInput) turnEnded() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.owed > 0 {
		in.owed--
	}
	if in.owed == 0 {
		in.closeLocked()
		return
	}
	in.armQuiet()
}

// armQuiet (re)starts the quiet timer, which closes the input after
// quietFor unless disarmed or armed again meanwhile; in.mu is held.
func (in *agentInput) armQuiet() {
	in.disarmQuiet()
	gen := in.quietGen
	in.quiet = time.AfterFunc(in.quietFor, func() {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.quietGen == gen {
			in.closeLocked()
		}
	})
}

// disarmQuiet stops the quiet timer; in.mu is held.
func (in *agentInput) disarmQuiet() {
	if in.quiet != nil {
		in.quiet.Stop()
		in.quiet = nil
	}
	in.quietGen++
}

// activity disarms quietAfterTurn: the CLI printed something.
func (in *agentInput) activity() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.quiet != nil {
		in.disarmQuiet()
	}
}

// isClosed reports whether the input is closed.
func (in *agentInput) isClosed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.closed
}

func (in *agentInput) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.closeLocked()
}

func (in *agentInput) closeLocked() {
	if in.closed {
		return
	}
	in.closed = true
	_ = in.w.Close()
	in.disarmQuiet()
	close(in.done)
}

// copyOutput copies the CLI's stdout to out line by line, telling in of
// each line and of each turn's end; it closes the input when the output
// ends.
func copyOutput(r io.Reader, out io.Writer, in *agentInput) {
	defer in.close()
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	truncated := false
	for {
		chunk, err := br.ReadSlice('\n')
		if len(chunk) > 0 {
			_, _ = out.Write(chunk)
			if room := maxScanLine - len(line); room > 0 {
				line = append(line, chunk[:min(room, len(chunk))]...)
			}
			truncated = truncated || len(line) >= maxScanLine
		}
		switch {
		case err == nil:
			in.activity()
			if in.f.ended(bytes.TrimSpace(line), truncated) {
				in.turnEnded()
			}
			line, truncated = line[:0], false
		case errors.Is(err, bufio.ErrBufferFull):
		default:
			return
		}
	}
}

// pollSteers long-polls the worker for steers until the input closes, and
// writes each to it, acknowledging each; it then reports the input closed.
// While the worker is replaced, each poll waits for the socket to come back
// (c's reconnect window) and then polls the successor's session: a steer
// the cut poll carried was never written, and waits in the inbox; one put
// in the inbox later is handed out by the successor, once. A socket that
// cannot be reached past the window is tried again every second (the
// steers wait in the inbox meanwhile). It returns when the input closes or
// ctx ends; the "closed" report waits for the socket at most
// steerAckSendTimeout.
func pollSteers(ctx context.Context, c *relay.Client, in *agentInput, stderr io.Writer) {
	// The long poll in flight ends when the input closes.
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { // ends with pctx
		select {
		case <-in.done:
			stop()
		case <-pctx.Done():
		}
	}()
	warned := false
	for {
		if in.isClosed() {
			cctx, cancel := context.WithTimeout(context.Background(), steerAckSendTimeout)
			_, _ = c.SteerNext(cctx, relay.SteerNextRequest{Closed: true})
			cancel()
			return
		}
		if ctx.Err() != nil {
			return
		}
		resp, err := c.SteerNext(pctx, relay.SteerNextRequest{WaitSeconds: steerPollWait})
		if err != nil {
			if !warned && pctx.Err() == nil {
				fmt.Fprintf(stderr, "jetcrew-bridge launch: steering: %v (retrying)\n", err)
				warned = true
			}
			select {
			case <-time.After(time.Second):
			case <-pctx.Done():
			}
			continue
		}
		for _, sv := range resp.Steers {
			a := relay.SteerAck{ID: sv.ID, Delivered: true}
			if err := in.steer(sv.Text); err != nil {
				a = relay.SteerAck{ID: sv.ID, Reason: err.Error()}
			}
			// The acknowledgement is sent even when the CLI exits
			// meanwhile (ctx ends with it): a steer written to its input
			// was delivered, and the "closed" report that follows must
			// not answer it first.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), steerAckSendTimeout)
			_ = c.SteerAck(actx, a)
			cancel()
		}
	}
}

// launchSteered runs argv (its path resolved) as the CLI's process with
// env, the prompt file's text as its first turn in format; client calls
// the run's coordination socket; the CLI's stdout is copied to stdout. It
// returns the CLI's exit code.
func launchSteered(path string, argv, env []string, promptFile string, f steerFormat, client *relay.Client, stdout, stderr io.Writer) int {
	prompt, err := os.ReadFile(promptFile)
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: stdin: %v\n", err)
		return 1
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		return 1
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		return 1
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Stdin: inR, Stdout: outW, Stderr: os.Stderr}
	// Signals first, so none arrives between the start and the forwarding.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: exec %s: %v\n", path, err)
		return 127
	}
	_ = inR.Close()
	_ = outW.Close()
	in := newAgentInput(inW, f)
	if err := in.write(string(prompt)); err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: the prompt: %v\n", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	copied := make(chan struct{})
	var wg sync.WaitGroup
	// Each goroutine ends: the copy with the CLI's stdout (or when outR is
	// closed below), the polls when the input closes or ctx ends, the
	// forwarding with ctx.
	wg.Go(func() { defer close(copied); copyOutput(outR, stdout, in) })
	wg.Go(func() { pollSteers(ctx, client, in, stderr) })
	wg.Go(func() { forwardSignals(ctx, sigs, cmd.Process) })
	err = cmd.Wait()
	in.close()
	cancel()
	select {
	case <-copied:
	case <-time.After(2 * time.Second):
		// A process the CLI left behind holds its stdout open.
	}
	_ = outR.Close()
	wg.Wait()
	return exitCode(cmd.ProcessState, err)
}

// forwardSignals passes each signal on to p until ctx ends.
func forwardSignals(ctx context.Context, sigs <-chan os.Signal, p *os.Process) {
	for {
		select {
		case s := <-sigs:
			_ = p.Signal(s)
		case <-ctx.Done():
			return
		}
	}
}

// exitCode is a shell's exit code for a finished process: its own, or
// 128+N when signal N ended it.
func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return 127
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if err != nil && ps.ExitCode() < 0 {
		return 1
	}
	return ps.ExitCode()
}
