package worker

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/egress"
	"github.com/jetcrew/jetcrew/egress/usage"
	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/stage/tree"
)

// Config configures a Worker. Zero fields take the documented defaults (see
// WithDefaults).
type Config struct {
	// ID identifies the worker in run states, events and container labels.
	// Default: "<hostname>-<6 random hex digits>".
	ID string
	// Pool is the pool whose consumer the worker pulls from. Default
	// messages.DefaultPool.
	Pool string
	// Concurrency is the most runs at once. The worker never holds more
	// requests than free slots. Default 4.
	Concurrency int
	// Profiles are the profiles requests may name, resolved
	// (profile.Profile.Resolve). Default profile.DefaultProfiles().
	Profiles profile.Profiles
	// Runtime runs the containers. Required.
	Runtime jail.Runtime
	// Logger receives structured logs. Default: a disabled logger.
	Logger *zerolog.Logger
	// Provision sizes the streams and the consumer; its Pool is set from
	// Pool.
	Provision ProvisionConfig
	// InProgressInterval is how often a live run tells the server it is
	// still in progress (resetting AckWait). Default AckWait/3.
	InProgressInterval time.Duration
	// DefaultTimeout bounds a run whose request and profile set no timeout.
	// Default 1 hour.
	DefaultTimeout time.Duration
	// StopGrace is the time between SIGTERM and SIGKILL when a run is
	// stopped. Default 10 seconds.
	StopGrace time.Duration
	// FetchWait is how long one pull request waits for a message before it
	// is renewed. Default 30 seconds.
	FetchWait time.Duration
	// ReconcileInterval is how often orphaned containers are looked for.
	// Default 1 minute.
	ReconcileInterval time.Duration
	// AdoptGrace is how long a redelivered request of a running run whose
	// worker answers nobody is handed back for, once, before another
	// worker starts it again: the time a successor of that worker on its
	// host has to adopt the run's container (issue 38). Default twice
	// messages.WorkerTTL (30 s): the dead worker's heartbeat expires,
	// then its successor's first pass adopts. Negative starts it again at
	// once, as before adoption existed.
	AdoptGrace time.Duration
	// OrphanGrace is how old a container with no live owner must be before
	// the reconciler removes it. Default 30 seconds.
	OrphanGrace time.Duration
	// WarmMax is the most warm containers the worker keeps, all profiles
	// together (profile.Profile.Warm asks for them; profiles in name order
	// fill it). Default warm.DefaultMax (8); negative keeps none.
	WarmMax int
	// Prices prices the model usage runs' egress proxies meter (the hosts
	// of egress_inject): jetcrew --prices. Nil prices nothing; only tokens
	// are counted.
	Prices *usage.Prices
	// WarmMaxIdle is how long a warm container waits for a run before it
	// is replaced. Default warm.DefaultMaxIdle (30 minutes).
	WarmMaxIdle time.Duration
	// LookupEnv reads the worker's environment for profiles' env_from_host.
	// Default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// StateRoot is where a worker without StateDir makes its state
	// directory; it must be absolute. Workers may share it, from any PID
	// namespace. Default: DefaultStateRoot when the worker may create it
	// (as root), else os.TempDir().
	StateRoot string
	// StateDir holds the per-run directories staged for containers (the
	// bridge socket and mcp.json), under StateDir/r/. It must be a path the
	// Docker engine sees as the worker does (same host), and short: a unix
	// socket path is at most 107 bytes. It must be a directory the worker's
	// user owns with mode 0700, or missing (then created so); anything
	// else, a symlink included, makes Start fail; what the worker staged in
	// it is removed when it stops. Default: a new private directory with an
	// unpredictable name under StateRoot (w-<random> under
	// DefaultStateRoot, else jetcrew-<random>), made by Start with a marker
	// the worker holds an exclusive flock(2) on for its life, and removed
	// whole by Stop; a later worker of the same user reclaims one whose
	// marker's lock is free (in any PID namespace: statedir_marker.go).
	StateDir string
	// BridgePath is the host path of the static bridge binary: the jetcrew
	// binary (which runs as the bridge under the name "bridge") or a
	// separate jetcrew-bridge. Runs whose profile has coordination on mount
	// a content-addressed copy of it (StateDir/bin/<sha256>, mode 0555),
	// read-only. Default: the running executable. When it cannot be staged
	// (missing, not a regular file, dynamically linked), such runs are
	// refused with that reason.
	BridgePath string
	// WorkspaceTool is the host path of the static jetcrew binary (or
	// jetcrew-bridge) whose `workspace exec` and `workspace capture`
	// commands unpack a run's snapshot and capture its result inside the
	// jail (docs/workspaces.md). Workspace runs mount a content-addressed
	// copy of it (StateDir/tool/<sha256>, mode 0555) read-only at
	// tree.JailToolPath. Default: BridgePath. When it cannot be staged,
	// workspace runs are refused with that reason.
	WorkspaceTool string
	// Workspace bounds and stores the workspaces of runs whose request names
	// one.
	Workspace tree.Config
	// EgressResolver resolves the names runs of egress profiles ask for.
	// Default net.DefaultResolver; tests give a fixed table.
	EgressResolver egress.Resolver
	// EgressProbeImage is the image of the egress proof's container; it
	// needs busybox's sh, wget, nc and nslookup. Default SandboxImage.
	EgressProbeImage string
	// EgressProbeOutside is an outside address ("host:port") the egress
	// proof must not reach directly. Default "1.1.1.1:443" (from a
	// container with no network, no packet leaves).
	EgressProbeOutside string
	// EgressCADir keeps the installation's egress CA (ca.pem: certificate
	// and key, mode 0600), made on first use, for profiles with
	// egress_inject. Workers of one installation on one host share it; the
	// key is never mounted into a container. Default:
	// <user config dir>/jetcrew/egress-ca/<installation>.
	EgressCADir string
	// EgressUpstreamRoots verifies the real hosts' certificates on the
	// proxy's own TLS connections for egress_inject hosts. Default: the
	// system's roots.
	EgressUpstreamRoots *x509.CertPool
	// EgressRestartDelay is how long a run's egress proxy stays down after
	// its listener failed before it is reopened (connections fail
	// meanwhile). Default 200ms.
	EgressRestartDelay time.Duration
	// EgressProbePorts are the host's service ports (NATS, metrics) the
	// egress proof must not reach on any of the host's addresses.
	EgressProbePorts []int
	// Failpoint, when set, is called with the name of each crash point a
	// run passes (the stage.Failpoint* constants), so crash tests can kill
	// the worker process exactly there. Nil in production.
	Failpoint func(name string)
}

// WithDefaults returns a copy of c with every zero field set to its
// default, its Provision and Workspace included.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		c.ID = sanitizeToken(host) + "-" + hex.EncodeToString(b)
	}
	if c.Pool == "" {
		c.Pool = messages.DefaultPool
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Profiles == nil {
		c.Profiles = profile.DefaultProfiles()
	}
	if c.Logger == nil {
		l := zerolog.Nop()
		c.Logger = &l
	}
	c.Provision.Pool = c.Pool
	c.Provision = c.Provision.withDefaults()
	if c.InProgressInterval == 0 {
		c.InProgressInterval = c.Provision.AckWait / 3
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = time.Hour
	}
	if c.StopGrace == 0 {
		c.StopGrace = 10 * time.Second
	}
	if c.FetchWait == 0 {
		c.FetchWait = 30 * time.Second
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = time.Minute
	}
	if c.AdoptGrace == 0 {
		c.AdoptGrace = 2 * messages.WorkerTTL
	}
	if c.OrphanGrace == 0 {
		c.OrphanGrace = 30 * time.Second
	}
	if c.EgressProbeImage == "" {
		c.EgressProbeImage = profile.SandboxImage
	}
	if c.EgressProbeOutside == "" {
		c.EgressProbeOutside = "1.1.1.1:443"
	}
	if c.LookupEnv == nil {
		c.LookupEnv = os.LookupEnv
	}
	if c.BridgePath == "" {
		if exe, err := os.Executable(); err == nil {
			c.BridgePath = exe
		}
	}
	if c.WorkspaceTool == "" {
		c.WorkspaceTool = c.BridgePath
	}
	c.Workspace = c.Workspace.WithDefaults(c.Provision.Replicas)
	return c
}

func (c Config) validate() error {
	if c.Runtime == nil {
		return errors.New("worker: Runtime is required")
	}
	if err := messages.ValidateToken("worker id", c.ID); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if err := messages.ValidateName("pool", c.Pool); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if c.Concurrency < 1 {
		return fmt.Errorf("worker: concurrency %d must be at least 1", c.Concurrency)
	}
	if err := c.Provision.validate(); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	if c.InProgressInterval >= c.Provision.AckWait {
		return fmt.Errorf("worker: in-progress interval %s must be shorter than AckWait %s", c.InProgressInterval, c.Provision.AckWait)
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("worker: state dir %q must be an absolute path", c.StateDir)
	}
	if c.StateRoot != "" && !filepath.IsAbs(c.StateRoot) {
		return fmt.Errorf("worker: state root %q must be an absolute path", c.StateRoot)
	}
	if c.FetchWait < time.Second {
		return fmt.Errorf("worker: fetch wait %s must be at least 1s", c.FetchWait)
	}
	if c.Workspace.GitFetches < 0 {
		return fmt.Errorf("worker: git fetches %d must be at least 1 (0 for the default)", c.Workspace.GitFetches)
	}
	return nil
}

func sanitizeToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}
