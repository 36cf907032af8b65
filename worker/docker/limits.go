package docker

import (
	"strconv"

	"github.com/docker/docker/api/types/container"
)

// RunNofile is the open-file limit (RLIMIT_NOFILE, soft and hard) of every
// process in a run container. Each process of a run can hold at most this
// many descriptors, connections to its bridge socket included; the worker
// bounds its own side separately (coordination.MaxConnsPerSession). 1024 is
// the usual Linux default soft limit: enough for an agent CLI, far below
// the engine's default of about a million.
const RunNofile = 1024

// outputLogFiles is how many files the local log driver spreads a
// container's kept output over (its max-file): the oldest quarter rotates
// out at a time.
const outputLogFiles = 4

// runLogConfig returns the log configuration of a container that keeps
// at most keep bytes of its output (jail.ContainerSpec.OutputLogBytes).
// For 0 it is driver "none": the engine keeps nothing on disk, and `docker
// logs` of the container shows nothing. Otherwise it is Docker's "local"
// driver (a file per container, binary framing that keeps every byte,
// invalid UTF-8 and CR included) in outputLogFiles files of keep/4 bytes
// each (max-size, rounded up; max-file), uncompressed, so that a worker
// adopting the container reads its output back (Runtime.Adopt). The
// worker reads output through attach or logs either way, and publishes it
// itself (docs/jail.md).
func runLogConfig(keep int64) container.LogConfig {
	if keep <= 0 {
		return container.LogConfig{Type: "none"}
	}
	per := (keep + outputLogFiles - 1) / outputLogFiles
	return container.LogConfig{Type: "local", Config: map[string]string{
		"max-size": strconv.FormatInt(per, 10),
		"max-file": strconv.Itoa(outputLogFiles),
		"compress": "false",
	}}
}

// runUlimits returns the resource limits set on every run container.
func runUlimits() []*container.Ulimit {
	return []*container.Ulimit{{Name: "nofile", Soft: RunNofile, Hard: RunNofile}}
}
