package profile

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jetcrew/jetcrew/messages"
)

// validate checks a profile with defaults applied.
func (p Profile) validate() error {
	if err := messages.ValidateToken("profile name", p.Name); err != nil {
		return err
	}
	b, err := lookupBackend(p.Backend)
	if err != nil {
		return err
	}
	if p.Image == "" {
		return errors.New("image is required")
	}
	if err := b.validate(p); err != nil {
		return err
	}
	if p.Retries < 0 || p.Retries > 10 {
		return fmt.Errorf("retries %d must be between 0 and 10", p.Retries)
	}
	if err := p.validateBudgets(); err != nil {
		return err
	}
	if err := p.validateWarm(); err != nil {
		return err
	}
	if p.stallTimeout < 0 || p.bridgeDeadline < 0 {
		return errors.New("stall_timeout and bridge_deadline must not be negative")
	}
	if _, _, err := parseUser(p.User); err != nil {
		return err
	}
	if !strings.HasPrefix(p.Home, "/") || !strings.HasPrefix(p.WorkDir, "/") {
		return errors.New("home and workdir must be absolute paths")
	}
	if p.Home == "/tmp" || strings.HasPrefix(p.Home, "/tmp/") {
		return errors.New("home must not be under /tmp (it has its own tmpfs)")
	}
	if p.Network == "host" || strings.HasPrefix(p.Network, "container:") {
		return fmt.Errorf("network %q would share a namespace with the host or another container; use none, bridge or a named network", p.Network)
	}
	if err := p.validateRate(); err != nil {
		return err
	}
	if err := p.validateInject(); err != nil {
		return err
	}
	if p.egressAskTimeout < time.Second || p.egressAskTimeout > time.Hour {
		return fmt.Errorf("egress_ask_timeout %s must be between 1s and 1h", p.egressAskTimeout)
	}
	if p.HasEgress() && p.Network != "none" {
		return fmt.Errorf("network %q with egress: a profile with an egress allowlist runs with network none, its only way out the egress proxy; drop network", p.Network)
	}
	if p.Runtime != "" && !validRuntimeName(p.Runtime) {
		return fmt.Errorf("runtime %q is not a runtime name (letters, digits, '.', '-', '_'; at most 64)", p.Runtime)
	}
	if p.MemoryMiB < 6 || p.CPUs <= 0 || p.Pids < 8 || p.TmpMiB < 1 || p.HomeMiB < 1 {
		return errors.New("limits too small: memory_mib >= 6, cpus > 0, pids >= 8, tmp_mib >= 1, home_mib >= 1")
	}
	if p.timeout < 0 {
		return errors.New("timeout is negative")
	}
	if p.MaxOutputMiB < -1 {
		return fmt.Errorf("max_output_mib %d must be positive, or -1 for unlimited", p.MaxOutputMiB)
	}
	if err := p.validateWorkspace(); err != nil {
		return err
	}
	if err := p.validateEnv(); err != nil {
		return err
	}
	if err := checkSignedBy(p.SignedBy); err != nil {
		return err
	}
	return p.validateHardening()
}

// parseUser parses "uid:gid" (numeric) and refuses root.
func parseUser(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("user %q must be numeric uid:gid", s)
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("user %q must be numeric uid:gid", s)
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("user %q: runs never run as root (uid or gid 0)", s)
	}
	return uid, gid, nil
}

// MaxID is the largest uid or gid a profile's user may name: the largest
// positive 32-bit signed value, which every runtime (runc, gVisor) and every
// image tool carries; larger ids fail only when a run starts.
const MaxID = 1<<31 - 1

// HomePrefixes are the directories a profile's home (and workdir) must be
// at or under: a writable tmpfs is mounted at home, and mounted over a
// system directory (/etc, /usr, /bin, ...) it would let the run replace what
// the image's programs trust.
var HomePrefixes = []string{"/home", "/work", "/workspace"}

// workerEnvPrefixes are the prefixes of the worker's own connection
// variables (NATS URL, credentials, nkeys and contexts; the Docker endpoint
// and its TLS material), compared without regard to case. A profile may not
// copy them into a run with env_from_host.
var workerEnvPrefixes = []string{"NATS_", "DOCKER_"}

// validateHardening bounds the keys a careless profile could turn against
// the jail: request_env,
// env_from_host, home and workdir, and the user's id range.
func (p Profile) validateHardening() error {
	for _, name := range p.RequestEnv {
		pat := strings.TrimSuffix(name, "*")
		if pat != "" && !messages.ValidEnvName(pat) {
			return fmt.Errorf("request_env %q is neither a variable name nor a prefix ending in '*'", name)
		}
		if pat == name && DeniedRequestEnv(name) {
			return fmt.Errorf("request_env %q is a loader, runtime, proxy or worker variable, which a request may never set", name)
		}
	}
	for _, name := range p.EnvFromHost {
		for _, pre := range workerEnvPrefixes {
			if strings.HasPrefix(strings.ToUpper(name), pre) {
				return fmt.Errorf("env_from_host %q is one of the worker's own connection variables (%s*): it never reaches a run", name, pre)
			}
		}
	}
	for _, d := range []struct{ key, path string }{{"home", p.Home}, {"workdir", p.WorkDir}} {
		if !underHomePrefixes(d.path) {
			return fmt.Errorf("%s %q must be at or under one of %s", d.key, d.path, strings.Join(HomePrefixes, ", "))
		}
	}
	uid, gid, err := parseUser(p.User)
	if err != nil {
		return err
	}
	if uid > MaxID || gid > MaxID {
		return fmt.Errorf("user %q: uid and gid must be 1 to %d", p.User, MaxID)
	}
	return nil
}

// underHomePrefixes reports whether path, cleaned of "." and ".." steps, is
// one of HomePrefixes or under one.
func underHomePrefixes(path string) bool {
	if strings.Contains("/"+path+"/", "/../") || strings.Contains("/"+path+"/", "/./") || strings.Contains(path, "//") {
		return false
	}
	path = strings.TrimSuffix(path, "/")
	for _, pre := range HomePrefixes {
		if path == pre || strings.HasPrefix(path, pre+"/") {
			return true
		}
	}
	return false
}

// MaxWarm is the most warm containers one profile may ask a worker to keep.
const MaxWarm = 64

// validateBudgets checks the model budgets: not negative, finite, and only
// on a profile whose proxy meters a host (egress_inject), the only place
// they can be enforced.
func (p Profile) validateBudgets() error {
	if p.MaxCostUSD < 0 || math.IsNaN(p.MaxCostUSD) || math.IsInf(p.MaxCostUSD, 0) {
		return fmt.Errorf("max_cost_usd %v must be a positive number of US dollars, or 0 for none", p.MaxCostUSD)
	}
	if p.MaxOutputTokens < 0 || p.MaxModelRequests < 0 {
		return errors.New("max_output_tokens and max_model_requests must not be negative")
	}
	for name, b := range map[string]*SharedBudget{"group_budget": p.GroupBudget, "pool_budget": p.PoolBudget} {
		if b == nil {
			continue
		}
		if b.MaxCostUSD < 0 || math.IsNaN(b.MaxCostUSD) || math.IsInf(b.MaxCostUSD, 0) || b.MaxOutputTokens < 0 || b.MaxModelRequests < 0 {
			return fmt.Errorf("%s: max_cost_usd, max_output_tokens and max_model_requests must be positive, or 0 for none", name)
		}
		if b.window < time.Minute || b.window > messages.MaxBudgetWindow {
			return fmt.Errorf("%s: window %s must be between 1m and %s", name, b.window, messages.MaxBudgetWindow)
		}
	}
	switch p.OnBudget {
	case "", OnBudgetFail, OnBudgetPause:
	default:
		return fmt.Errorf("on_budget %q must be %q or %q", p.OnBudget, OnBudgetFail, OnBudgetPause)
	}
	if p.budgetPause < time.Second || p.budgetPause > 24*time.Hour {
		return fmt.Errorf("budget_pause %s must be between 1s and 24h", p.budgetPause)
	}
	if p.HasBudget() && len(p.EgressInject) == 0 {
		return errors.New("max_cost_usd, max_output_tokens, max_model_requests, group_budget and pool_budget need egress_inject: the egress proxy meters (and enforces budgets on) only the hosts it adds a key for, which the agent then cannot reach another way")
	}
	return nil
}

// HasBudget reports whether the profile sets a model budget of its own
// runs' or a shared one.
func (p Profile) HasBudget() bool {
	return p.MaxCostUSD > 0 || p.MaxOutputTokens > 0 || p.MaxModelRequests > 0 || p.GroupBudget.set() || p.PoolBudget.set()
}

// set reports whether b limits anything.
func (b *SharedBudget) set() bool {
	return b != nil && (b.MaxCostUSD > 0 || b.MaxOutputTokens > 0 || b.MaxModelRequests > 0)
}

// validateWarm checks warm and warm_workspace: each 0 to MaxWarm, and
// coordination on when either keeps containers (a warm container waits in
// the launcher).
func (p Profile) validateWarm() error {
	if p.Warm < 0 || p.Warm > MaxWarm {
		return fmt.Errorf("warm %d must be between 0 and %d", p.Warm, MaxWarm)
	}
	if p.WarmWorkspace < 0 || p.WarmWorkspace > MaxWarm {
		return fmt.Errorf("warm_workspace %d must be between 0 and %d", p.WarmWorkspace, MaxWarm)
	}
	if p.Warm+p.WarmWorkspace > 0 && !p.CoordinationOn() {
		return errors.New("warm and warm_workspace need coordination on: a warm container waits for its run in the jetcrew launcher, which only a profile with coordination on mounts")
	}
	return nil
}

// validateEnv checks env's names (valid, not JETCREW_-prefixed) and
// env_from_host's.
func (p Profile) validateEnv() error {
	for k := range p.Env {
		if !messages.ValidEnvName(k) {
			return fmt.Errorf("env name %q is not a valid variable name", k)
		}
		if strings.HasPrefix(strings.ToUpper(k), "JETCREW_") {
			return fmt.Errorf("env name %q is reserved (JETCREW_ prefix): jetcrew sets these", k)
		}
	}
	for _, k := range p.EnvFromHost {
		if !messages.ValidEnvName(k) {
			return fmt.Errorf("env_from_host name %q is not a valid variable name", k)
		}
	}
	return nil
}
