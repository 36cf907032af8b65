package bridgecmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// launchCommand is the first argument that makes the bridge binary act as
// the agent's launcher instead of an MCP server:
//
//	/opt/jetcrew/bridge launch [--home-seed DIR] [--stdin FILE] [--egress-relay ADDR=SOCKET] -- ARGV...
//
// The worker starts agent CLIs this way. The launcher copies the files the
// worker staged under DIR (read-only, in the run's /run/jetcrew) into the
// writable $HOME, so a CLI that must write beside its configuration (Codex's
// CODEX_HOME, say) finds it there; connects FILE (the run's prompt) to
// standard input, so a long prompt never travels as an argument; and then
// replaces itself with ARGV (execve), so the agent is the process the init
// reaps and the signals reach.
const launchCommand = "launch"

// launch implements launchCommand. It returns only on failure, with exit
// code 127 when ARGV cannot be executed and 2 for bad arguments, as a shell
// does.
func launch(args []string, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("jetcrew-bridge launch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.String("home-seed", "", "directory whose files are copied into $HOME before the agent starts")
	stdin := fs.String("stdin", "", "file connected to the agent's standard input")
	relay := fs.String("egress-relay", "", "ADDR=SOCKET: relay TCP connections on ADDR to the egress proxy's unix SOCKET")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "jetcrew-bridge launch: no command given after --")
		return 2
	}
	if *seed != "" {
		home := getenv("HOME")
		if home == "" {
			fmt.Fprintln(stderr, "jetcrew-bridge launch: --home-seed needs $HOME")
			return 2
		}
		if err := copyTree(*seed, home); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: seed %s: %v\n", home, err)
			return 1
		}
	}
	if *relay != "" {
		if err := startEgressRelay(*relay, stderr); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
			return 1
		}
	}
	if *stdin != "" {
		f, err := os.Open(*stdin)
		if err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: stdin: %v\n", err)
			return 1
		}
		if err := unix.Dup3(int(f.Fd()), 0, 0); err != nil {
			fmt.Fprintf(stderr, "jetcrew-bridge launch: stdin: %v\n", err)
			return 1
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "jetcrew-bridge launch: %v\n", err)
		return 127
	}
	err = unix.Exec(path, argv, os.Environ())
	fmt.Fprintf(stderr, "jetcrew-bridge launch: exec %s: %v\n", path, err)
	return 127
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
