package jail

import "strconv"

// Labels set on every container and volume jetcrew makes. Keys are
// reverse-DNS, as Docker recommends for labels; they are the identity the
// reconciler goes by (Nomad's driver does the same).
const (
	// LabelManaged marks a container as jetcrew's; its value is "true".
	LabelManaged = "io.jetcrew.managed"
	// LabelRunID carries the run id.
	LabelRunID = "io.jetcrew.run-id"
	// LabelWorker carries the id of the worker that created the container.
	LabelWorker = "io.jetcrew.worker"
	// LabelAttempt carries the delivery number the container belongs to.
	LabelAttempt = "io.jetcrew.attempt"
	// LabelCreated carries the creation time, RFC 3339 with nanoseconds.
	LabelCreated = "io.jetcrew.created"
	// LabelProfile carries the profile name.
	LabelProfile = "io.jetcrew.profile"
	// LabelInstall identifies the jetcrew installation (the JETCREW_RUNS
	// stream, by its creation time) that owns the container, so workers of
	// two installations sharing one Docker engine never reap each other's
	// containers.
	LabelInstall = "io.jetcrew.install"
	// LabelRole says what a container or volume is to its run: RoleRun,
	// RoleCapture, RoleWorkspace, RoleEgressProof, RoleRuntimeProof or
	// RoleWarm. Operators filter on it (`docker ps --filter
	// label=io.jetcrew.role=capture`); the reconciler treats every role
	// alike, but for a warm container of its own worker found when that
	// worker starts (an orphan at once).
	LabelRole = "io.jetcrew.role"
)

// Values of LabelRole.
const (
	// RoleRun is the run's own container, the one the agent runs in.
	RoleRun = "run"
	// RoleCapture is a workspace run's capture container, which holds the
	// workspace volume from staging to the capture (docs/workspaces.md).
	RoleCapture = "capture"
	// RoleWorkspace is a workspace run's tmpfs volume.
	RoleWorkspace = "workspace"
	// RoleEgressProof is the container a worker starts at start-up to
	// prove its egress rules.
	RoleEgressProof = "egress-proof"
	// RoleRuntimeProof is a container a worker starts (and removes) at
	// start-up to prove that an OCI runtime a profile names can start
	// containers on its engine.
	RoleRuntimeProof = "runtime-proof"
	// RoleWarm is a warm container (worker/warm): made for a profile,
	// before any run, it has no LabelRunID and keeps its role when a run
	// claims it (labels cannot change); the run's record names it by id.
	RoleWarm = "warm"
)

// ContainerName returns the name of the container for one delivery of a
// run's request: "jetcrew-<run id>-<request's stream sequence>-<delivery
// number>". Docker refuses a second container of the same name, so one
// delivery can never start two containers, and a replay (a new request
// message) never meets its predecessor's name.
func ContainerName(runID string, seq uint64, attempt int) string {
	return "jetcrew-" + runID + "-" + strconv.FormatUint(seq, 10) + "-" + strconv.Itoa(attempt)
}
