package coordination

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/jetcrew/jetcrew/messages"
)

// MCPServerName is the bridge's key in mcp.json (messages.MCPServerName);
// it equals bridge.Name.
const MCPServerName = messages.MCPServerName

// RunDirMode is the mode of a run's coordination directory: the run's
// non-root process may enter it and read mcp.json; only the worker writes.
const RunDirMode os.FileMode = 0o755

// MCPConfigMode is the mode of mcp.json (messages.MCPConfigMode).
const MCPConfigMode = messages.MCPConfigMode

// MCPConfig returns the content of a run's mcp.json: one stdio MCP server,
// MCPServerName, started as BridgePath with no arguments. The format is the
// mcpServers map that Claude Code's --mcp-config and other MCP clients read.
// Every call returns a fresh copy of the same document.
func MCPConfig() []byte { return bytes.Clone(mcpConfig()) }

// mcpConfig is MCPConfig's document, encoded once; callers must not modify
// it.
var mcpConfig = sync.OnceValue(func() []byte {
	type server struct {
		Type    string `json:"type"`
		Command string `json:"command"`
	}
	b, err := json.MarshalIndent(map[string]map[string]server{
		"mcpServers": {MCPServerName: {Type: "stdio", Command: BridgePath}},
	}, "", "  ")
	if err != nil {
		panic(err) // a constant document always encodes
	}
	return append(b, '\n')
})

// WriteMCPConfig writes MCPConfig to dir/mcp.json with mode MCPConfigMode,
// atomically replacing any earlier file. dir must exist.
func WriteMCPConfig(dir string) error {
	f, err := os.CreateTemp(dir, ".mcp-*.json")
	if err != nil {
		return fmt.Errorf("write %s: %w", MCPConfigName, err)
	}
	tmp := f.Name()
	_, err = f.Write(mcpConfig())
	err = errors.Join(err, f.Chmod(MCPConfigMode), f.Close())
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, MCPConfigName))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", MCPConfigName, err)
	}
	return nil
}

// StageRunDir prepares dir as a run's coordination directory, the one the
// worker bind-mounts read-only at messages.ContainerRunDir: it creates dir (and its
// missing parents, mode 0700) with mode RunDirMode and writes mcp.json
// (mode MCPConfigMode). The session's socket goes in the same directory:
// Host.Serve(ctx, run, filepath.Join(dir, messages.SocketName)).
//
// A directory it creates is new and empty, so mcp.json is written in
// place (no temporary file, no rename): what a run costs in file-system
// operations is most of the coordination-on run's cost in the noop
// benchmark. An existing dir (an earlier stage of the same directory) gets
// its mode set and mcp.json replaced atomically (WriteMCPConfig).
//
// The parent of dir should be reachable only by the worker (0700): the
// socket's mode is SocketMode (0666), and the directory is what keeps other
// users of the host away from it.
func StageRunDir(dir string) error {
	err := os.Mkdir(dir, RunDirMode)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(dir), 0o700); err == nil {
			err = os.Mkdir(dir, RunDirMode)
		}
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("stage run dir: %w", err)
	}
	fresh := err == nil
	// Mkdir's mode is filtered by the umask, and an existing dir may have
	// any mode: set it.
	if err := os.Chmod(dir, RunDirMode); err != nil {
		return fmt.Errorf("stage run dir: %w", err)
	}
	if !fresh {
		return WriteMCPConfig(dir)
	}
	return writeNewMCPConfig(filepath.Join(dir, MCPConfigName))
}

// writeNewMCPConfig creates path, which must not exist, holding MCPConfig
// with mode MCPConfigMode.
func writeNewMCPConfig(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, MCPConfigMode)
	if err != nil {
		return fmt.Errorf("write %s: %w", MCPConfigName, err)
	}
	_, err = f.Write(mcpConfig())
	// The create mode passes through the umask too.
	if err = errors.Join(err, f.Chmod(MCPConfigMode), f.Close()); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("write %s: %w", MCPConfigName, err)
	}
	return nil
}

// RemoveRunDir removes a run directory StageRunDir staged, with whatever
// it holds. A directory holding only mcp.json (the socket removed by the
// session's Detach) goes with two operations, where os.RemoveAll needs
// about ten; anything else is left to os.RemoveAll. A missing dir is no
// error.
func RemoveRunDir(dir string) error {
	if err := os.Remove(filepath.Join(dir, MCPConfigName)); err == nil || errors.Is(err, os.ErrNotExist) {
		if err := syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
	}
	return os.RemoveAll(dir)
}
