package bridgecmd

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	relaypkg "github.com/jetcrew/jetcrew/coordination/relay"
	"github.com/jetcrew/jetcrew/messages"
	"golang.org/x/sys/unix"
)

// launchCommand is the first argument that makes the bridge binary act as
// the agent's launcher instead of an MCP server:
//
//	/opt/jetcrew/bridge launch [--env-file FILE] [--home-seed DIR] [--stdin FILE [--steer FORMAT]] [--egress-relay ADDR=SOCKET] -- ARGV...
//	/opt/jetcrew/bridge launch --handoff SOCKET
//
// The worker starts agent CLIs this way. The launcher sets the variables
// the worker staged in FILE (a JSON array of "KEY=VALUE" strings: the run's
// secrets, bound at start and so never in the container's configuration)
// in the agent's environment, over the container's own, but never over
// HOME nor a JETCREW_ variable the container has (the worker's own);
// copies the files the
// worker staged under DIR (read-only, in the run's /run/jetcrew) into the
// writable $HOME, so a CLI that must write beside its configuration (Codex's
// CODEX_HOME, say) finds it there; connects FILE (the run's prompt) to
// standard input, so a long prompt never travels as an argument; and then
// replaces itself with ARGV (execve), so the agent is the process the init
// reaps and the signals reach. With --steer FORMAT it stays the CLI's
// parent instead, the prompt its first user turn and the operator's steers
// further ones (launchSteered, steer.go). With --handoff it is a warm container's
// command instead: it waits for its run on SOCKET (waitForRun).
const launchCommand = "launch"

// launch implements launchCommand; stdout is the process's standard output
// (the agent's, with --steer). It returns only on failure, with exit code
// 127 when ARGV cannot be executed and 2 for bad arguments, as a shell does
// (with --steer: when the agent ends, with its exit code).
func launch(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("jetcrew-bridge launch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.String("home-seed", "", "directory whose files are copied into $HOME before the agent starts")
	stdin := fs.String("stdin", "", "file connected to the agent's standard input")
	relay := fs.String("egress-relay", "", "ADDR=SOCKET: relay TCP connections on ADDR to the egress proxy's unix SOCKET")
	envFile := fs.String("env-file", "", "JSON array of KEY=VALUE strings set in the agent's environment")
	handoff := fs.String("handoff", "", "wait on this unix socket for the run to start (a warm container)")
	steer := fs.String("steer", "", "FORMAT: keep the agent's stdin open for steers, the --stdin file its first turn (claude-stream-json, kimi-stream-json)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *handoff != "" {
		if fs.NArg() > 0 || *seed != "" || *stdin != "" || *relay != "" || *envFile != "" || *steer != "" {
			fmt.Fprintln(stderr, "jetcrew-bridge launch: --handoff takes no other flag and no command")
			return 2
		}
		return waitForRun(*handoff, stderr)
	}
	env := os.Environ()
	if *envFile != "" {
		var err error
		if env, err = withEnvFile(env, *envFile); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: env file: %v\n", err)
			return 1
		}
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "jetcrew-bridge launch: no command given after --")
		return 2
	}
	format, steered := steerFormats[*steer]
	if *steer != "" && (!steered || *stdin == "") {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: --steer %q: want claude-stream-json or kimi-stream-json, with --stdin\n", *steer)
		return 2
	}
	if code := prepareLaunch(*seed, *relay, getenv, stderr); code != 0 {
		return code
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		return 127
	}
	if steered {
		socket := cmp.Or(getenv(relaypkg.EnvSocket), relaypkg.DefaultSocketPath)
		window, err := relaypkg.ReconnectWindowFrom(getenv)
		if err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		}
		client := relaypkg.NewClientWith(socket, relaypkg.ClientOptions{ReconnectWindow: window})
		defer client.Close()
		// stdout is the process's real standard output (Main points
		// os.Stdout at stderr).
		return launchSteered(path, argv, env, *stdin, format, client, stdout, stderr)
	}
	if *stdin != "" {
		if err := redirectStdin(*stdin); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: stdin: %v\n", err)
			return 1
		}
	}
	err = unix.Exec(path, argv, env)
	fmt.Fprintf(stderr, "jetcrew-bridge launch: exec %s: %v\n", path, err)
	return 127
}

// maxEnvFile bounds the env file launch reads, in bytes.
const maxEnvFile = 1 << 20

// withEnvFile returns env with the "KEY=VALUE" entries of the JSON array in
// the file at path set over it; an entry for HOME, or for a JETCREW_
// variable env already has (the worker sets those), is skipped, as are
// entries that are not KEY=VALUE with a valid name. The file holds secrets:
// it is read once, never echoed.
func withEnvFile(env []string, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxEnvFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxEnvFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxEnvFile)
	}
	var set []string
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("%s is not a JSON array of strings", path)
	}
	for _, kv := range set {
		k, _, ok := strings.Cut(kv, "=")
		has := slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if !ok || !messages.ValidEnvName(k) || k == "HOME" || has && strings.HasPrefix(k, "JETCREW_") {
			continue
		}
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		env = append(env, kv)
	}
	return env, nil
}

// copyTree copies the regular files and directories under src into dst,
// creating directories 0700 and files 0600 (0700 when executable), owned by
// the running user. It refuses symbolic links.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := os.FileMode(0o600)
			if info.Mode()&0o111 != 0 {
				mode = 0o700
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, data, mode)
		default:
			return errors.New(path + ": not a regular file or directory")
		}
	})
}

// prepareLaunch does what comes before the agent: HOME seeded from seed,
// the egress relay started. It returns the exit code of a failure (2 for
// a usage error), 0 when all went well.
func prepareLaunch(seed, relay string, getenv func(string) string, stderr io.Writer) int {
	if seed != "" {
		home := getenv("HOME")
		if home == "" {
			fmt.Fprintln(stderr, "jetcrew-bridge launch: --home-seed needs $HOME")
			return 2
		}
		if err := copyTree(seed, home); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: seed %s: %v\n", home, err)
			return 1
		}
	}
	if relay != "" {
		if err := startEgressRelay(relay, stderr); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
			return 1
		}
	}
	return 0
}

// redirectStdin makes the file at path this process's standard input,
// which the agent it execs inherits.
func redirectStdin(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return unix.Dup3(int(f.Fd()), 0, 0)
}
