package bridgecmd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/jetcrew/jetcrew/messages"
)

// waitForRun implements `launch --handoff SOCKET`, a warm container's
// command: it connects to the hand-off socket the worker bound in the run
// directory and waits there, doing nothing but answer the worker's probes
// (readHandoff), until the worker hands it one run (messages.Handoff). It
// then sets the run's environment over its own, changes to the run's
// working directory, answers messages.HandoffAck and executes the run's command (itself `launch ...` for the agent CLIs, which
// then sets the run's secrets from its env file and connects its prompt).
// It returns only on failure: 1 when the socket cannot be reached or the
// hand-off is not one (the worker then discards the container), 0 when the
// worker closed the connection without a run (the pool is drained), 127
// when the command cannot be executed.
func waitForRun(socket string, stderr io.Writer) int {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: hand-off: %v\n", err)
		return 1
	}
	line, err := readHandoff(conn)
	switch {
	case errors.Is(err, io.EOF) && len(line) == 0:
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "jetcrew-bridge launch: hand-off: %v\n", err)
		return 1
	}
	var h messages.Handoff
	if err := json.Unmarshal(line, &h); err != nil || len(h.Argv) == 0 {
		fmt.Fprintln(stderr, "jetcrew-bridge launch: hand-off: not a run")
		return 1
	}
	env := overlayEnv(os.Environ(), h.Env)
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == "PATH" {
			_ = os.Setenv("PATH", v) // exec.LookPath reads it
		}
	}
	if h.Dir != "" {
		if err := os.Chdir(h.Dir); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: working directory: %v\n", err)
			return 1
		}
	}
	if _, err := io.WriteString(conn, messages.HandoffAck); err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: hand-off: %v\n", err)
		return 1
	}
	_ = conn.Close()
	path, err := exec.LookPath(h.Argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		return 127
	}
	err = unix.Exec(path, h.Argv, env)
	fmt.Fprintf(stderr, "jetcrew-bridge launch: exec %s: %v\n", path, err)
	return 127
}

// readHandoff returns the first line the worker writes on conn that is not
// a probe (messages.HandoffProbe), answering each probe
// messages.HandoffAlive: the hand-off, within messages.MaxHandoffBytes in
// all.
func readHandoff(conn net.Conn) ([]byte, error) {
	rd := bufio.NewReaderSize(io.LimitReader(conn, messages.MaxHandoffBytes+1), 64<<10)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil || string(line) != messages.HandoffProbe {
			return line, err
		}
		if _, err := io.WriteString(conn, messages.HandoffAlive); err != nil {
			return nil, err
		}
	}
}

// overlayEnv returns env with each KEY=VALUE of set put over it: an entry
// of env with the same key is replaced, in set's order.
func overlayEnv(env, set []string) []string {
	env = slices.Clone(env)
	for _, kv := range set {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, kv)
	}
	return env
}
