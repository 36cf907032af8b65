package profile

import "fmt"

// Description is a profile's effective configuration as `jetcrew
// profiles check` prints it: every setting with its default applied, and
// what its backend would run (the prompt shown as "<prompt>").
type Description struct {
	Profile
	// StallTimeoutEffective and BridgeDeadlineEffective are the watchdog
	// bounds in force ("0s": off).
	StallTimeoutEffective   string `json:"stall_timeout_effective"`
	BridgeDeadlineEffective string `json:"bridge_deadline_effective"`
	// Argv is the container command for a run.
	Argv []string `json:"argv"`
	// Env are the variables the backend adds (names and fixed values).
	Env []string `json:"backend_env,omitempty"`
	// Files are the files the backend stages, with their modes.
	Files []string `json:"files,omitempty"`
	// MCPServers names the MCP servers the agent is given.
	MCPServers []string `json:"mcp_servers,omitempty"`
	// Unsupported lists what the CLI cannot honour.
	Unsupported []string `json:"unsupported,omitempty"`
}

// Describe returns p's effective configuration, or the error a run of it
// would fail with.
func (p Profile) Describe() (Description, error) {
	plan, err := p.Plan("<prompt>", p.CoordinationOn())
	if err != nil {
		return Description{}, err
	}
	d := Description{Profile: p, Argv: plan.ContainerArgv(), Env: plan.Env, MCPServers: plan.MCPServers,
		Unsupported: plan.Unsupported, StallTimeoutEffective: p.StallTimeoutDuration().String(), BridgeDeadlineEffective: "0s"}
	if p.BridgeRequired() {
		d.BridgeDeadlineEffective = p.BridgeDeadlineDuration().String()
	}
	for _, f := range plan.Files {
		d.Files = append(d.Files, fmt.Sprintf("%s (%04o)", f.Path, f.Mode.Perm()))
	}
	return d, nil
}
