package messages

import "io/fs"

// The run container's layout: where the worker mounts and stages what a run
// sees, and where the bridge and the agent CLIs find it. Defined once here,
// shared by the worker, the bridge and the backends.
const (
	// ContainerBridgePath is where the worker mounts the bridge binary,
	// read-only.
	ContainerBridgePath = "/opt/jetcrew/bridge"
	// ContainerRunDir is where the worker mounts the run's directory,
	// read-only.
	ContainerRunDir = "/run/jetcrew"
	// SocketName is the bridge socket's file name in the run's directory.
	SocketName = "bridge.sock"
	// MCPConfigName is the MCP configuration's file name in the run's
	// directory.
	MCPConfigName = "mcp.json"
	// ContainerSocketPath is the bridge socket's path inside the container.
	ContainerSocketPath = ContainerRunDir + "/" + SocketName
	// ContainerMCPConfigPath is mcp.json's path inside the container.
	ContainerMCPConfigPath = ContainerRunDir + "/" + MCPConfigName
	// MCPServerName is the bridge's key in mcp.json and in the agent
	// CLIs' own MCP settings: the agent sees its tools as
	// mcp__jetcrew__status and so on.
	MCPServerName = "jetcrew"
	// ContainerPromptPath is the run's prompt, staged read-only; agent CLIs
	// read it on standard input.
	ContainerPromptPath = ContainerRunDir + "/prompt"
	// ContainerHomeSeedPath holds files the launcher copies into the
	// writable HOME before the agent starts.
	ContainerHomeSeedPath = ContainerRunDir + "/home"
)

// MCPConfigMode is the mode of the run's mcp.json: readable by all,
// writable by none.
const MCPConfigMode fs.FileMode = 0o444
