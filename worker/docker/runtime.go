package docker

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/system"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/jetcrew/jetcrew/worker/jail"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/rs/zerolog"
)

// cleanupTimeout bounds the removal Start does after a failure, which runs
// even when Start's ctx has ended.
const cleanupTimeout = 30 * time.Second

// Config configures a Runtime. The zero value is usable.
type Config struct {
	// Logger receives the runtime's own log lines: container lifecycle at
	// debug level, engine warnings and failed cleanups at warn level. The
	// zero value logs nothing.
	Logger zerolog.Logger
	// Host is the Docker Engine's address, for example
	// "unix:///var/run/docker.sock". Empty means the environment
	// (DOCKER_HOST, DOCKER_API_VERSION, DOCKER_CERT_PATH,
	// DOCKER_TLS_VERIFY), else the platform's default socket.
	Host string
	// RetryTimeout is how long an idempotent call (image and container
	// inspect, list, remove) keeps retrying transient errors such as a
	// restarting daemon, with exponential backoff. Zero means 30 seconds; a
	// negative value disables retries.
	RetryTimeout time.Duration
	// OCIRuntimesTTL is how long the engine's list of OCI runtimes (from
	// its Info) is trusted before Start asks again, so that a runtime the
	// operator installs (or removes) is seen without a restart while Info
	// is not called for every run. Zero means 1 minute.
	OCIRuntimesTTL time.Duration
}

// withDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.RetryTimeout == 0 {
		c.RetryTimeout = 30 * time.Second
	}
	if c.OCIRuntimesTTL == 0 {
		c.OCIRuntimesTTL = time.Minute
	}
	return c
}

// apiClient is the part of the Docker client the runtime uses; tests swap
// in a fake. *client.Client implements it.
type apiClient interface {
	Ping(ctx context.Context) (types.Ping, error)
	Info(ctx context.Context) (system.Info, error)
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (image.InspectResponse, error)
	ContainerCreate(ctx context.Context, config *container.Config, hostConfig *container.HostConfig, networkingConfig *network.NetworkingConfig, platform *ocispec.Platform, containerName string) (container.CreateResponse, error)
	ContainerAttach(ctx context.Context, container string, options container.AttachOptions) (types.HijackedResponse, error)
	ContainerLogs(ctx context.Context, container string, options container.LogsOptions) (io.ReadCloser, error)
	ContainerWait(ctx context.Context, container string, condition container.WaitCondition) (<-chan container.WaitResponse, <-chan error)
	ContainerStart(ctx context.Context, container string, options container.StartOptions) error
	ContainerInspect(ctx context.Context, container string) (container.InspectResponse, error)
	ContainerStop(ctx context.Context, container string, options container.StopOptions) error
	ContainerRemove(ctx context.Context, container string, options container.RemoveOptions) error
	ContainerList(ctx context.Context, options container.ListOptions) ([]container.Summary, error)
	ContainerKill(ctx context.Context, container, signal string) error
	VolumeCreate(ctx context.Context, options volume.CreateOptions) (volume.Volume, error)
	VolumeRemove(ctx context.Context, volumeID string, force bool) error
	VolumeInspect(ctx context.Context, volumeID string) (volume.Volume, error)
	VolumeList(ctx context.Context, options volume.ListOptions) (volume.ListResponse, error)
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
	Close() error
}

// Runtime is the Docker Engine implementation of jail.Runtime. Create it
// with New; it is safe for concurrent use. Close releases its connections.
type Runtime struct {
	cli apiClient
	log zerolog.Logger
	cfg Config

	// ociMu guards the cached list of the engine's OCI runtimes. It is
	// held while the list is fetched, so concurrent Starts ask once.
	ociMu      sync.Mutex
	ociNames   []string // sorted; nil until fetched
	ociFetched time.Time
	now        func() time.Time // time.Now; tests move it

	// oom follows the engine's oom events; nil in tests with a fake client.
	oom *oomWatcher
}

var _ jail.Runtime = (*Runtime)(nil)

// New connects to the Docker Engine named by cfg.Host (or the environment),
// negotiating the API version, and pings it. It fails when the daemon cannot
// be reached within ctx, with an error naming the address it tried, or when
// the engine does not run Linux containers.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg = cfg.withDefaults()
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker: create client: %w", err)
	}
	ping, err := cli.Ping(ctx)
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("docker: cannot reach the Docker engine at %s: %w", cli.DaemonHost(), err)
	}
	if ping.OSType != "" && ping.OSType != "linux" {
		_ = cli.Close()
		return nil, fmt.Errorf("docker: the engine at %s runs %s containers, want linux", cli.DaemonHost(), ping.OSType)
	}
	// Negotiate the API version now, once, before any goroutine uses the
	// client: left to the first request, the negotiation writes the
	// client's version while the oom event stream reads it (a data race).
	cli.NegotiateAPIVersionPing(ping)
	cfg.Logger.Debug().Str("host", cli.DaemonHost()).Str("api_version", cli.ClientVersion()).Msg("connected to docker engine")
	r := newRuntime(cli, cfg)
	r.watchOOM()
	return r, nil
}

// newRuntime wraps an already connected client; cfg must have its defaults.
func newRuntime(cli apiClient, cfg Config) *Runtime {
	return &Runtime{cli: cli, log: cfg.Logger, cfg: cfg, now: time.Now}
}

// Close closes the client's idle connections. Containers are not touched.
func (r *Runtime) Close() error {
	r.oom.stop()
	return r.cli.Close()
}

// Start implements jail.Runtime. It refuses an invalid spec (see the
// package doc for what is enforced) and a bind mount whose source does not
// exist with an error wrapping jail.ErrPermanent, before any daemon call.
// It then refuses, with jail.ErrPermanent, a spec.OCIRuntime the engine
// does not have (checked against the engine's Info, cached for
// Config.OCIRuntimesTTL): the run fails rather than run under a weaker
// runtime. It then inspects the image (missing: jail.ErrPermanent, as the
// engine never pulls here), creates the container named spec.Name (already taken:
// an error wrapping ErrNameInUse), attaches to stdout and stderr (no logs,
// no stdin), registers a "next-exit" wait and starts it.
//
// output receives each frame of the attach stream, in order, in pieces of at
// most messages.MaxOutputChunk bytes, from one goroutine that ends when the
// stream does; nil discards the output. Frames keep the daemon's order;
// note that the engine carries stdout and stderr through separate pipes, so
// writes to both streams very close in time may reach it in either order.
// ctx bounds Start only: the container, its output and its wait are not tied
// to it. The returned Container is a *Container.
//
// Errors from the daemon wrap jail.ErrPermanent when the engine refused
// the request itself (HTTP 400, 401, 403, 404, 501: for example an unknown
// OCI runtime); an unreachable daemon, a 5xx (such as a mount failing in the
// OCI runtime at start) or a timeout does not.
func (r *Runtime) Start(ctx context.Context, spec jail.ContainerSpec, output jail.OutputFunc) (jail.Container, error) {
	cfg, hostCfg, netCfg, err := containerConfig(spec)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	for _, m := range spec.Mounts {
		if m.Volume {
			// Without its spec, the engine would create a missing volume
			// as a directory of its disk with no size bound: it must
			// exist already.
			if m.VolumeSpec != nil {
				continue
			}
			if _, err := r.cli.VolumeInspect(ctx, m.Source); err != nil {
				return nil, fmt.Errorf("docker: volume %s for %s: %w", m.Source, m.Target, classify(opVolumeInspect, err))
			}
			continue
		}
		if _, err := os.Stat(m.Source); err != nil {
			return nil, fmt.Errorf("docker: bind mount source for %s: %w: %w", m.Target, err, jail.ErrPermanent)
		}
	}
	if err := r.checkOCIRuntime(ctx, spec.OCIRuntime); err != nil {
		return nil, err
	}
	imageID, err := r.checkImage(ctx, spec.Image)
	if err != nil {
		return nil, err
	}

	created, err := r.cli.ContainerCreate(ctx, cfg, hostCfg, netCfg, nil, spec.Name)
	if err != nil {
		return nil, classify(opCreate, err)
	}
	log := r.log.With().Str("container", created.ID).Str("name", spec.Name).Logger()
	for _, w := range created.Warnings {
		log.Warn().Str("warning", w).Msg("docker engine warning on create")
	}

	if output == nil {
		output = func(string, []byte) {}
	}
	c, err := r.attachAndStart(ctx, created.ID, spec.Name, output)
	if err != nil {
		// Remove by id, never by name: after a failure the name may belong
		// to another container.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := r.remove(cctx, created.ID); rerr != nil {
			log.Warn().Err(rerr).Msg("could not remove container after failed start; the reconciler will")
		}
		if c != nil {
			c.release()
			<-c.copyDone // no output call after Start returns
		}
		return nil, err
	}
	c.imageID = imageID
	log.Debug().Msg("container started")
	return c, nil
}

// ImageID returns the engine's id of the image reference ref now
// (ImageInspect's Id): the warm pool's check that a profile's image was
// not rebuilt since its containers started (warm.ImageLister). An image
// missing from the engine is an error wrapping jail.ErrPermanent.
func (r *Runtime) ImageID(ctx context.Context, ref string) (string, error) {
	return r.checkImage(ctx, ref)
}

// checkImage returns the engine's id of image (ImageInspect's Id), or an
// error when it does not exist on the engine.
func (r *Runtime) checkImage(ctx context.Context, ref string) (string, error) {
	var id string
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		resp, err := r.cli.ImageInspect(ctx, ref)
		id = resp.ID
		return err
	})
	if cerrdefs.IsNotFound(err) {
		return "", imageNotFound{fmt.Errorf("docker: image %q not found on this Docker engine; build it (make images) or fix the profile: %w", ref, jail.ErrPermanent)}
	}
	return id, classify(opImageInspect, err)
}

// checkOCIRuntime returns nil when name is empty (the engine's default
// runtime) or is one of the engine's OCI runtimes, and otherwise an error
// wrapping jail.ErrPermanent that names the runtimes the engine has.
func (r *Runtime) checkOCIRuntime(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	names, err := r.ociRuntimes(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(names, name) {
		return nil
	}
	return fmt.Errorf("docker: OCI runtime %q is not installed on this Docker engine (available: %s); "+
		"register it in the daemon's \"runtimes\" (daemon.json) or change the profile: %w",
		name, strings.Join(names, ", "), jail.ErrPermanent)
}

// OCIRuntimes implements jail.OCIRuntimeLister: the names of the engine's
// OCI runtimes (Info's Runtimes), sorted, cached for Config.OCIRuntimesTTL.
func (r *Runtime) OCIRuntimes(ctx context.Context) ([]string, error) {
	return r.ociRuntimes(ctx)
}

// ociRuntimes returns the names of the engine's OCI runtimes, sorted, from
// the cache when it is younger than Config.OCIRuntimesTTL, else from Info.
func (r *Runtime) ociRuntimes(ctx context.Context) ([]string, error) {
	r.ociMu.Lock()
	defer r.ociMu.Unlock()
	if r.ociNames != nil && r.now().Sub(r.ociFetched) < r.cfg.OCIRuntimesTTL {
		return r.ociNames, nil
	}
	var info system.Info
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		var err error
		info, err = r.cli.Info(ctx)
		return err
	})
	if err != nil {
		return nil, classify(opInfo, err)
	}
	names := slices.Sorted(maps.Keys(info.Runtimes))
	if names == nil {
		names = []string{}
	}
	r.ociNames, r.ociFetched = names, r.now()
	return names, nil
}

// attachAndStart attaches to the created container, registers the exit wait
// and starts it. On error it returns the Container too when its goroutines
// were already started, so the caller can end them.
func (r *Runtime) attachAndStart(ctx context.Context, id, name string, output jail.OutputFunc) (*Container, error) {
	hijack, err := r.cli.ContainerAttach(ctx, id, container.AttachOptions{Stream: true, Stdout: true, Stderr: true})
	if err != nil {
		return nil, classify(opAttach, err)
	}
	// The wait outlives Start's ctx: it ends when the container exits or
	// when release cancels it.
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	respC, errC := r.cli.ContainerWait(waitCtx, id, container.WaitConditionNextExit)
	select {
	case err := <-errC: // the wait request itself failed
		cancelWait()
		hijack.Close()
		return nil, classify(opWait, err)
	default:
	}

	c := &Container{
		id:       id,
		name:     name,
		rt:       r,
		stream:   hijacked{hijack},
		cancel:   cancelWait,
		waitDone: make(chan struct{}),
		copyDone: make(chan struct{}),
	}
	go c.waitExit(respC, errC)
	go c.copyOutput(output, nil)

	if err := r.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return c, classify(opStart, err)
	}
	return c, nil
}

// ListManaged implements jail.Runtime: it lists containers in every state
// (ContainerList with All) filtered by the label jail.LabelManaged=true.
// Created is the engine's creation time, to the second.
func (r *Runtime) ListManaged(ctx context.Context) ([]jail.ManagedContainer, error) {
	var list []container.Summary
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		var err error
		list, err = r.cli.ContainerList(ctx, container.ListOptions{
			All:     true,
			Filters: filters.NewArgs(filters.Arg("label", jail.LabelManaged+"=true")),
		})
		return err
	})
	if err != nil {
		return nil, classify(opList, err)
	}
	out := make([]jail.ManagedContainer, 0, len(list))
	for _, s := range list {
		var name string
		if len(s.Names) > 0 {
			name = trimSlash(s.Names[0])
		}
		var binds []string
		for _, m := range s.Mounts {
			if m.Type == mount.TypeBind {
				binds = append(binds, m.Source)
			}
		}
		out = append(out, jail.ManagedContainer{
			ID:      s.ID,
			Name:    name,
			State:   string(s.State),
			Labels:  s.Labels,
			Created: time.Unix(s.Created, 0),
			Binds:   binds,
		})
	}
	return out, nil
}

// Remove implements jail.Runtime: ContainerRemove with Force (the process
// is killed if running) and RemoveVolumes. A container that does not exist,
// or whose removal is already in progress, counts as removed.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	return r.remove(ctx, id)
}

func (r *Runtime) remove(ctx context.Context, id string) error {
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		return r.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	})
	if err == nil || cerrdefs.IsNotFound(err) || removalInProgress(err) {
		return nil
	}
	return classify(opRemove, err)
}

func trimSlash(name string) string {
	if len(name) > 0 && name[0] == '/' {
		return name[1:]
	}
	return name
}
