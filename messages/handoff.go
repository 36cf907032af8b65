package messages

// A warm container's launcher waits for its run on a unix socket in the
// container's run directory: the worker connects nothing, the launcher
// connects to it when the container starts and blocks there until the
// worker hands it one run (a Handoff, one JSON object and a newline), then
// answers HandoffAck and becomes the run's process. Before the Handoff the
// worker probes it (HandoffProbe, answered HandoffAlive). The launcher and
// the worker are the same jetcrew binary (the worker stages its own), so
// this exchange never crosses versions.
const (
	// HandoffName is the hand-off socket's file name in the run's
	// directory.
	HandoffName = "handoff.sock"
	// ContainerHandoffPath is the hand-off socket's path inside the
	// container.
	ContainerHandoffPath = ContainerRunDir + "/" + HandoffName
	// HandoffAck is the launcher's answer once it has applied a Handoff,
	// just before it executes the run's command.
	HandoffAck = "ok\n"
	// HandoffProbe is what the worker writes, before a Handoff, to learn
	// whether the launcher still runs; HandoffAlive is the launcher's
	// answer, after which it waits for the Handoff again. A launcher that
	// does not answer (its container paused, itself stopped) is never
	// handed the run.
	HandoffProbe = "probe\n"
	HandoffAlive = "alive\n"
	// MaxHandoffBytes bounds a Handoff's JSON, in bytes.
	MaxHandoffBytes = 1 << 20
)

// Handoff is what the worker hands a warm container's launcher: the run's
// command, environment and working directory, exactly as a cold container
// of the run would have them in its configuration (its Cmd, Env and
// WorkingDir).
type Handoff struct {
	// Argv is the run's command; Argv[0] is looked up on the PATH of Env.
	Argv []string `json:"argv"`
	// Env are KEY=VALUE entries set over the launcher's own environment
	// (the image's and the warm container's).
	Env []string `json:"env"`
	// Dir is the working directory; "" keeps the container's.
	Dir string `json:"dir,omitempty"`
}
