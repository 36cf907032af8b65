package runner

import (
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage"
)

// SpecInput is everything BuildSpec combines into a jail.ContainerSpec.
type SpecInput struct {
	// Profile is the resolved profile, defaults applied.
	Profile *profile.Profile
	// Request is the validated run request, its ID set.
	Request messages.RunRequest
	// Seq is the request message's JETCREW_RUNS stream sequence.
	Seq uint64
	// Attempt is the delivery number, from 1.
	Attempt int
	// WorkerID is the id of the worker creating the container.
	WorkerID string
	// Install identifies the installation (see jail.LabelInstall).
	Install string
	// Now is the creation time recorded in jail.LabelCreated.
	Now time.Time
	// Plan is the backend's plan for the run (profile.Profile.Plan).
	Plan profile.Plan
}

// BuildSpec turns a profile and a run request into the run container's
// spec, before its stages add theirs (mounts, environment, a command
// prefix). It is a pure function of its input (no Docker calls), so every
// rule of the jail can be tested without a daemon.
func BuildSpec(in SpecInput) jail.ContainerSpec {
	p, r := in.Profile, in.Request
	cmd := in.Plan.ContainerArgv()

	// Later entries win in Docker's env list, so the order is: the
	// request's non-secret env, the profile's fixed env, the backend's,
	// then jetcrew's own variables, which nothing can override. The
	// profile's secrets (env_from_host) are not here: the launcher sets
	// them at start (the secrets stage), so they are in no container
	// configuration.
	env := make([]string, 0, len(r.Env)+len(p.Env)+len(in.Plan.Env)+4)
	env = appendSorted(env, r.Env)
	env = appendSorted(env, p.Env)
	env = append(env, in.Plan.Env...)
	env = append(env,
		"HOME="+p.Home,
		"JETCREW_RUN_ID="+r.ID,
		"JETCREW_GROUP="+r.GroupOrID(),
		"JETCREW_PROFILE="+p.Name,
	)
	spec := ProfileSpec(p)
	spec.Name = jail.ContainerName(r.ID, in.Seq, in.Attempt)
	spec.Cmd = cmd
	spec.Env = env
	spec.Labels = map[string]string{
		jail.LabelManaged: "true",
		jail.LabelRunID:   r.ID,
		jail.LabelWorker:  in.WorkerID,
		jail.LabelAttempt: strconv.Itoa(in.Attempt),
		jail.LabelCreated: in.Now.UTC().Format(time.RFC3339Nano),
		jail.LabelProfile: p.Name,
		jail.LabelInstall: in.Install,
		jail.LabelRole:    jail.RoleRun,
	}
	return spec
}

// ProfileSpec returns the part of a container's spec that the profile
// alone decides: image, user, working directory, network, OCI runtime,
// limits and the tmpfs at /tmp and HOME. It has no name, command,
// environment or labels.
func ProfileSpec(p *profile.Profile) jail.ContainerSpec {
	uid, gid := p.Owner()
	return jail.ContainerSpec{
		Image:       p.Image,
		User:        p.User,
		WorkingDir:  p.WorkDir,
		Network:     p.Network,
		OCIRuntime:  p.Runtime,
		MemoryBytes: p.MemoryMiB << 20,
		NanoCPUs:    int64(p.CPUs * 1e9),
		PidsLimit:   p.Pids,
		Tmpfs: jail.TmpfsMounts{
			{Target: "/tmp", SizeBytes: p.TmpMiB << 20, Mode: 0o1777},
			{Target: p.Home, SizeBytes: p.HomeMiB << 20, Mode: 0o700, UID: uid, GID: gid},
		},
		// The engine keeps the run's output (bounded) so that a successor
		// of its worker can adopt the run and publish what was written
		// while no worker watched (runner's adopt.go).
		OutputLogBytes: jail.DefaultOutputLogBytes,
	}
}

func appendSorted(env []string, m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env
}

// merge adds what a Prestarter's resp adds to the container to spec, and
// what it adds to the receipt (its mounts' entries, its files, its launch
// variables' names) to adds.
func merge(spec *jail.ContainerSpec, adds *receiptAdds, resp *stage.PrestartResponse) {
	spec.Env = append(spec.Env, resp.Env...)
	for _, m := range resp.Mounts {
		spec.Mounts = append(spec.Mounts, m.Mount)
		adds.Mounts = append(adds.Mounts, messages.ReceiptMount{Target: m.Target, ReadOnly: m.ReadOnly, Role: m.Role, Digest: m.Digest})
	}
	adds.Files = append(adds.Files, resp.Files...)
	adds.LaunchEnv = append(adds.LaunchEnv, resp.LaunchEnvNames...)
	if len(resp.Wrap) > 0 {
		spec.Cmd = append(slices.Clip(resp.Wrap), spec.Cmd...)
	}
	if resp.WorkingDir != "" {
		spec.WorkingDir = resp.WorkingDir
	}
}
