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

// checkOCIRuntimes is Start's check that the engine offers every OCI
// runtime the profiles name; nil when the Runtime cannot list them.
func (w *Worker) checkOCIRuntimes(ctx context.Context) error {
	l, ok := w.cfg.Runtime.(OCIRuntimeLister)
	if !ok {
		return nil
	}
	names, err := l.OCIRuntimes(ctx)
	if err != nil {
		return fmt.Errorf("worker: list the engine's OCI runtimes: %w", err)
	}
	if err := w.cfg.Profiles.CheckOCIRuntimes(names); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	w.log.Debug().Strs("oci_runtimes", names).Msg("engine's OCI runtimes")
	return nil
}

// Bounds of the proof of an OCI runtime.
const (
	// runtimeProofTries is how many times a proof container is tried when
	// the engine's error is not permanent, a second more after each try.
	runtimeProofTries = 3
	// runtimeProofWait bounds the wait for a started proof container's
	// exit before it is removed anyway.
	runtimeProofWait = 10 * time.Second
)

// proveOCIRuntimes is Start's proof that every OCI runtime a profile names
// can start a container: an engine lists a runtime it cannot use alike (crun
// on a host whose cgroups are hybrid answers every start with HTTP 500, which
// a run would take for a transient failure and retry). For each runtime it
// starts one container, removed at once: the jail of the first profile (by
// name) naming the runtime whose image the engine has, with that image, else
// the first profile's jail with the sandbox image; network none; the command
// /bin/true (a missing one still starts the container: its init reports the
// failed exec). A runtime that cannot start it fails the start with the
// engine's own error (profile.ErrOCIRuntimeUnusable), and so does one that
// no image could prove. Nil when the Runtime cannot list runtimes
// (checkOCIRuntimes).
func (w *Worker) proveOCIRuntimes(ctx context.Context) error {
	if _, ok := w.cfg.Runtime.(OCIRuntimeLister); !ok {
		return nil
	}
	byRuntime := w.cfg.Profiles.OCIRuntimes()
	names := make([]string, 0, len(byRuntime))
	for rt := range byRuntime {
		names = append(names, rt)
	}
	sort.Strings(names)
	for _, rt := range names {
		if err := w.proveOCIRuntime(ctx, rt, byRuntime[rt]); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
	}
	return nil
}

// proveOCIRuntime proves runtime rt with the profiles naming it, sorted by
// name (proveOCIRuntimes).
func (w *Worker) proveOCIRuntime(ctx context.Context, rt string, profs []profile.Profile) error {
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
		err := w.startRuntimeProof(ctx, t.prof, t.image)
		switch {
		case err == nil:
			w.log.Info().Str("oci_runtime", rt).Str("profile", t.prof.Name).Str("image", t.image).Msg("OCI runtime proved: it started a container")
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

// startRuntimeProof starts the proof container of p's runtime with image
// and removes it: nil once it started. A failure the runtime does not call
// permanent is tried again, runtimeProofTries times in all.
func (w *Worker) startRuntimeProof(ctx context.Context, p profile.Profile, image string) error {
	var err error
	for try := 1; ; try++ {
		if err = w.startRuntimeProofOnce(ctx, p, image); err == nil || errors.Is(err, jail.ErrPermanent) || try == runtimeProofTries {
			return err
		}
		w.log.Debug().Err(err).Str("oci_runtime", p.Runtime).Int("try", try).Msg("OCI runtime proof failed; trying again")
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(try) * time.Second):
		}
	}
}

func (w *Worker) startRuntimeProofOnce(ctx context.Context, p profile.Profile, image string) error {
	spec := w.runtimeProofSpec(p, image)
	c, err := w.cfg.Runtime.Start(ctx, spec, func(string, []byte) {})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, runtimeProofWait)
	_, _ = c.Wait(wctx)
	cancel()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.Remove(rctx); err != nil {
		w.log.Warn().Err(err).Str("container", spec.Name).Msg("remove the OCI runtime's proof container; the reconciler will")
	}
	return nil
}

// runtimeProofSpec is the proof container of p's runtime: p's jail
// (runner.ProfileSpec: user, limits, tmpfs, runtime) with image, network
// none, the command /bin/true, and labels that make it the worker's
// (jail.RoleRuntimeProof), so the reconciler removes one left behind.
func (w *Worker) runtimeProofSpec(p profile.Profile, image string) jail.ContainerSpec {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := "runtime-proof-" + hex.EncodeToString(b)
	spec := runner.ProfileSpec(&p)
	spec.Name = "jetcrew-" + id + "-" + w.cfg.ID
	spec.Image = image
	spec.Network = "none"
	spec.Cmd = []string{"/bin/true"}
	spec.Env = []string{"HOME=" + p.Home}
	spec.Labels = map[string]string{
		jail.LabelManaged: "true", jail.LabelRunID: id, jail.LabelWorker: w.cfg.ID, jail.LabelAttempt: "1",
		jail.LabelCreated: time.Now().UTC().Format(time.RFC3339Nano), jail.LabelProfile: p.Name, jail.LabelInstall: w.install,
		jail.LabelRole: jail.RoleRuntimeProof,
	}
	return spec
}
