package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/rs/zerolog"

	"github.com/jetcrew/jetcrew/worker/jail"
	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/jetcrew/jetcrew/worker/runner"
)

// OCIRuntimeLister is implemented by a Runtime that can tell which OCI
// runtimes its engine offers (the Docker runtime's OCIRuntimes reads them
// from the engine's Info: runc, runsc, crun, kata, sysbox, ...). Start uses
// it to refuse a profile naming a runtime the engine lacks, and proves each
// runtime a profile names (proveOCIRuntimes); a Runtime that does not
// implement it (the fake of worker/workertest) is neither checked nor
// proved.
type OCIRuntimeLister interface {
	// OCIRuntimes returns the names of the engine's OCI runtimes, sorted.
	OCIRuntimes(ctx context.Context) ([]string, error)
}

// runtimeCheck is Start's check of the OCI runtimes the profiles name:
// listed by the engine (check), then each proved by a container (prove).
type runtimeCheck struct {
	runtime  jail.Runtime
	profiles profile.Profiles
	workerID string
	// install is the installation's label value (jail.LabelInstall); set
	// once the runs stream exists, before prove.
	install string
	log     zerolog.Logger
}

// check is Start's check that the engine offers every OCI runtime the
// profiles name; nil when the Runtime cannot list them. The error wraps
// profile.ErrOCIRuntimeMissing for a runtime the engine lacks.
func (r *runtimeCheck) check(ctx context.Context) error {
	l, ok := r.runtime.(OCIRuntimeLister)
	if !ok {
		return nil
	}
	names, err := l.OCIRuntimes(ctx)
	if err != nil {
		return fmt.Errorf("worker: list the engine's OCI runtimes: %w", err)
	}
	if err := r.profiles.CheckOCIRuntimes(names); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	r.log.Debug().Strs("oci_runtimes", names).Msg("engine's OCI runtimes")
	return nil
}

// Bounds of the proof of an OCI runtime.
const (
	// runtimeProofTries is how many times a proof container is tried when
	// the engine's error is not permanent, runtimeProofPause apart.
	runtimeProofTries = 3
	// runtimeProofPause is the pause between two tries of a proof.
	runtimeProofPause = time.Second
	// runtimeProofWait bounds the wait for a started proof container's
	// exit before it is removed anyway.
	runtimeProofWait = 10 * time.Second
)

// prove is Start's proof that every OCI runtime a profile names
// can start a container: an engine lists a runtime it cannot use alike (crun
// on a host whose cgroups are hybrid answers every start with HTTP 500, which
// a run would take for a transient failure and retry). For each runtime it
// starts one container, removed at once: the jail of the first profile (by
// name) naming the runtime whose image the engine has, with that image, else
// the first profile's jail with the sandbox image; network none; the command
// /bin/true (a missing one still starts the container: its init reports the
// failed exec). A runtime that cannot start it fails the start with the
// engine's own error (profile.ErrOCIRuntimeUnusable), and so does one that
// no image could prove. Nil when the Runtime cannot list runtimes (check).
func (r *runtimeCheck) prove(ctx context.Context) error {
	if _, ok := r.runtime.(OCIRuntimeLister); !ok {
		return nil
	}
	byRuntime := r.profiles.OCIRuntimes()
	names := make([]string, 0, len(byRuntime))
	for rt := range byRuntime {
		names = append(names, rt)
	}
	sort.Strings(names)
	for _, rt := range names {
		if err := r.proveRuntime(ctx, rt, byRuntime[rt]); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	return nil
}

// proveRuntime proves runtime rt with the profiles naming it, sorted by
// name (prove).
func (r *runtimeCheck) proveRuntime(ctx context.Context, rt string, profs []profile.Profile) error {
	type try struct {
		prof  profile.Profile
		image string
	}
	var tries []try
	var images []string
	add := func(p profile.Profile, image string) {
		if !slices.Contains(images, image) {
			images = append(images, image)
			tries = append(tries, try{p, image})
		}
	}
	for _, p := range profs {
		add(p, p.Image)
	}
	add(profs[0], profile.SandboxImage)
	for _, t := range tries {
		err := r.start(ctx, t.prof, t.image)
		switch {
		case err == nil:
			r.log.Info().Str("oci_runtime", rt).Str("profile", t.prof.Name).Str("image", t.image).Msg("OCI runtime proved: it started a container")
			return nil
		case errors.Is(err, jail.ErrImageNotFound):
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("prove OCI runtime %q: %w", rt, ctx.Err())
		}
		return fmt.Errorf("%w: runtime %q (profile %q) could not start a container of image %q on this engine: %w "+
			"(use the runtime on a host where it works, or change the profile; docs/jail.md)",
			profile.ErrOCIRuntimeUnusable, rt, t.prof.Name, t.image, err)
	}
	return fmt.Errorf("%w: runtime %q (profile %q) could not be proved: none of the images %q is on this engine (build one: make images)",
		profile.ErrOCIRuntimeUnusable, rt, profs[0].Name, images)
}

// start starts the proof container of p's runtime with image and removes
// it: nil once it started. A failure the runtime does not call permanent
// (jail.ErrPermanent) is tried again, runtimeProofTries times in all.
func (r *runtimeCheck) start(ctx context.Context, p profile.Profile, image string) error {
	b := backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(runtimeProofPause), runtimeProofTries-1), ctx)
	err := backoff.RetryNotify(func() error {
		err := r.startOnce(ctx, p, image)
		if errors.Is(err, jail.ErrPermanent) {
			return backoff.Permanent(err)
		}
		return err
	}, b, func(err error, _ time.Duration) {
		r.log.Debug().Err(err).Str("oci_runtime", p.Runtime).Msg("OCI runtime proof failed; trying again")
	})
	var perm *backoff.PermanentError
	if errors.As(err, &perm) {
		return perm.Err
	}
	return err
}

// startOnce starts and removes one proof container (start).
func (r *runtimeCheck) startOnce(ctx context.Context, p profile.Profile, image string) error {
	spec := r.spec(p, image)
	c, err := r.runtime.Start(ctx, spec, func(string, []byte) {})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, runtimeProofWait)
	_, _ = c.Wait(wctx)
	cancel()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.Remove(rctx); err != nil {
		r.log.Warn().Err(err).Str("container", spec.Name).Msg("remove the OCI runtime's proof container; the reconciler will")
	}
	return nil
}

// spec is the proof container of p's runtime: p's jail
// (runner.ProfileSpec: user, limits, tmpfs, runtime) with image, network
// none, the command /bin/true, and labels that make it the worker's
// (jail.RoleRuntimeProof), so the reconciler removes one left behind.
func (r *runtimeCheck) spec(p profile.Profile, image string) jail.ContainerSpec {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "runtime-proof-" + hex.EncodeToString(b)
	spec := runner.ProfileSpec(&p)
	spec.Name = "jetcrew-" + id + "-" + r.workerID
	spec.Image = image
	spec.Network = "none"
	spec.Cmd = []string{"/bin/true"}
	spec.Env = []string{"HOME=" + p.Home}
	spec.Labels = map[string]string{
		jail.LabelManaged: "true", jail.LabelRunID: id, jail.LabelWorker: r.workerID, jail.LabelAttempt: "1",
		jail.LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), jail.LabelProfile: p.Name, jail.LabelInstall: r.install,
		jail.LabelRole: jail.RoleRuntimeProof,
	}
	return spec
}
