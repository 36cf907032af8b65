package worker

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jetcrew/jetcrew/coordination"
	"github.com/jetcrew/jetcrew/messages"
)

// ContainerName returns the name of the container for one delivery of a run's
// request: "jetcrew-<run id>-<request's stream sequence>-<delivery number>".
// Docker refuses a second container of the same name, so one delivery can
// never start two containers, and a replay (a new request message) never
// meets its predecessor's name.
func ContainerName(runID string, seq uint64, attempt int) string {
	return "jetcrew-" + runID + "-" + strconv.FormatUint(seq, 10) + "-" + strconv.Itoa(attempt)
}

// SpecInput is everything BuildSpec combines into a ContainerSpec.
type SpecInput struct {
	// Profile is the resolved profile, defaults applied.
	Profile Profile
	// Request is the validated run request, its ID set.
	Request messages.RunRequest
	// Seq is the request message's JETCREW_RUNS stream sequence.
	Seq uint64
	// Attempt is the delivery number, from 1.
	Attempt int
	// WorkerID is the id of the worker creating the container.
	WorkerID string
	// Install identifies the installation (see LabelInstall).
	Install string
	// Now is the creation time recorded in LabelCreated.
	Now time.Time
	// LookupEnv reads the worker's environment for Profile.EnvFromHost;
	// os.LookupEnv in production.
	LookupEnv func(string) (string, bool)
	// Plan is the backend's plan for the run (see planAgent).
	Plan AgentPlan
	// Coordination says whether the run's bridge socket is wired in: it
	// sets JETCREW_MCP_CONFIG.
	Coordination bool
	// RunDir is the host directory staged for the run (prompt, socket,
	// mcp.json, backend files), mounted read-only at
	// coordination.ContainerRunDir; empty when nothing is staged.
	RunDir string
	// BridgePath is the host path of the static bridge binary (MCP server
	// and launcher), mounted read-only at coordination.BridgePath; empty
	// when the run needs neither.
	BridgePath string
}

// BuildSpec turns a profile and a run request into a ContainerSpec. It is a
// pure function of its input (no Docker calls), so every rule of the jail can
// be tested without a daemon. It returns an error, which retrying cannot
// fix, when a variable named in Profile.EnvFromHost is not set on the worker.
func BuildSpec(in SpecInput) (ContainerSpec, error) {
	p, r := in.Profile, in.Request
	cmd := in.Plan.containerArgv()

	// Later entries win in Docker's env list, so the order is: the request's
	// non-secret env, the profile's fixed env, secrets from the host, then
	// jetcrew's own variables, which nothing can override.
	env := make([]string, 0, len(r.Env)+len(p.Env)+len(p.EnvFromHost)+4)
	env = appendSorted(env, r.Env)
	env = appendSorted(env, p.Env)
	env = append(env, in.Plan.Env...)
	for _, name := range p.EnvFromHost {
		v, ok := in.LookupEnv(name)
		if !ok {
			return ContainerSpec{}, fmt.Errorf("profile %q: env_from_host %s is not set in the worker's environment", p.Name, name)
		}
		env = append(env, name+"="+v)
	}
	env = append(env,
		"HOME="+p.Home,
		"JETCREW_RUN_ID="+r.ID,
		"JETCREW_GROUP="+r.GroupOrID(),
		"JETCREW_PROFILE="+p.Name,
	)
	if in.Coordination {
		env = append(env, "JETCREW_MCP_CONFIG="+coordination.ContainerMCPConfigPath)
	}
	if in.Plan.EgressRelay {
		env = append(env, egressEnv()...)
		if len(p.EgressInject) > 0 {
			env = append(env, egressTrustEnv()...)
		}
	}
	var mounts []Mount
	if in.RunDir != "" {
		mounts = append(mounts, Mount{Source: in.RunDir, Target: coordination.ContainerRunDir, ReadOnly: true})
	}
	if in.BridgePath != "" {
		mounts = append(mounts, Mount{Source: in.BridgePath, Target: coordination.BridgePath, ReadOnly: true})
	}

	uid, gid, err := parseUser(p.User)
	if err != nil {
		return ContainerSpec{}, err
	}
	return ContainerSpec{
		Name:       ContainerName(r.ID, in.Seq, in.Attempt),
		Image:      p.Image,
		Cmd:        cmd,
		Env:        env,
		User:       p.User,
		WorkingDir: p.WorkDir,
		Labels: map[string]string{
			LabelManaged: "true",
			LabelRunID:   r.ID,
			LabelWorker:  in.WorkerID,
			LabelAttempt: strconv.Itoa(in.Attempt),
			LabelCreated: in.Now.UTC().Format(time.RFC3339Nano),
			LabelProfile: p.Name,
			LabelInstall: in.Install,
			LabelRole:    RoleRun,
		},
		Network:     p.Network,
		OCIRuntime:  p.Runtime,
		MemoryBytes: p.MemoryMiB << 20,
		NanoCPUs:    int64(p.CPUs * 1e9),
		PidsLimit:   p.Pids,
		Tmpfs: map[string]string{
			"/tmp": fmt.Sprintf("size=%dm,mode=1777", p.TmpMiB),
			p.Home: fmt.Sprintf("size=%dm,mode=0700,uid=%d,gid=%d", p.HomeMiB, uid, gid),
		},
		Mounts: mounts,
	}, nil
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
