package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jetcrew/jetcrew/worker/profile"
)

// ReloadProfiles replaces the profiles of a started worker with ps, a
// profile file read again and validated (profile.LoadProfiles; `jetcrew
// worker` calls it on SIGHUP), stored once in the set every part reads
// (profile.Set). Deliveries admitted from then on use ps; a run already
// admitted keeps the profile it started with to its end, and takes only a
// warm container made with its jail-fixed fields (warm.FixedDiff), whether
// it was admitted before or after the pool planned ps.
// The warm pool of each profile whose jail-fixed fields changed, that was
// removed or keeps fewer containers is drained and refilled; one whose
// other fields alone changed is kept (warm.Pool.Reload). It returns the
// names of the profiles added, changed (their digest) or removed, sorted.
//
// ps is refused, and the profiles in use stay, when the engine lacks an
// OCI runtime it names, or when it asks for what the worker sets up only
// at start: an egress allowlist (egress, egress_ask) while no profile had
// one, or egress_inject while none had it (the egress proof and CA are
// made at start: restart the worker for those).
func (w *Worker) ReloadProfiles(ctx context.Context, ps profile.Profiles) (changed []string, err error) {
	w.reloadMu.Lock()
	defer w.reloadMu.Unlock()
	w.mu.Lock()
	started := w.running
	w.mu.Unlock()
	old := w.profiles.Load()
	if !started {
		return nil, errors.New("worker: profiles are reloaded once the worker has started")
	}
	if len(ps) == 0 {
		return nil, errors.New("worker: a reload must keep at least one profile")
	}
	if err := reloadNeedsRestart(old, ps); err != nil {
		return nil, err
	}
	check := &runtimeCheck{runtime: w.cfg.Runtime, profiles: ps, workerID: w.cfg.ID, log: w.log}
	if err := check.check(ctx); err != nil {
		return nil, err
	}
	for _, name := range ps.Names() {
		if p, ok := old[name]; !ok || p.Digest() != ps[name].Digest() {
			changed = append(changed, name)
		}
	}
	for name := range old {
		if _, ok := ps[name]; !ok {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	w.profiles.Store(ps)
	w.warm.Reload(ctx)
	return changed, nil
}

// reloadNeedsRestart returns why replacing the profiles old with ps takes
// a restart, or nil: the egress proof runs at start only when a profile
// has an allowlist, and the egress CA is loaded only when one has
// egress_inject.
func reloadNeedsRestart(old, ps profile.Profiles) error {
	has := func(set profile.Profiles, f func(profile.Profile) bool) bool {
		for _, p := range set {
			if f(p) {
				return true
			}
		}
		return false
	}
	egress := func(p profile.Profile) bool { return p.HasEgress() }
	inject := func(p profile.Profile) bool { return len(p.EgressInject) > 0 }
	switch {
	case has(ps, egress) && !has(old, egress):
		return fmt.Errorf("worker: a profile has an egress allowlist and none had one at start: the egress proof runs at start; restart the worker")
	case has(ps, inject) && !has(old, inject):
		return fmt.Errorf("worker: a profile has egress_inject and none had it at start: the egress CA is loaded at start; restart the worker")
	}
	return nil
}
