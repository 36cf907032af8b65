package workertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jetcrew/jetcrew/worker/jail"
)

// fakeVolume is a volume of the fake runtime: a directory, unbounded.
type fakeVolume struct {
	dir     string
	spec    jail.VolumeSpec
	created time.Time
}

// CreateVolume implements jail.Runtime: the volume is a new empty
// directory (mode 0755) under a temporary directory of the runtime's; its
// size is not enforced. A volume of that name already there is replaced.
func (r *Runtime) CreateVolume(ctx context.Context, spec jail.VolumeSpec) error {
	if spec.SizeBytes <= 0 {
		return fmt.Errorf("%w: volume %q: size %d bytes", jail.ErrPermanent, spec.Name, spec.SizeBytes)
	}
	if err := r.RemoveVolume(ctx, spec.Name); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("create volume %s: the fake runtime is closed", spec.Name)
	}
	if r.volumeBase == "" {
		base, err := os.MkdirTemp("", "jetcrew-fake-volumes-")
		if err != nil {
			return err
		}
		r.volumeBase = base
	}
	dir := filepath.Join(r.volumeBase, spec.Name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	r.volumes[spec.Name] = fakeVolume{dir: dir, spec: spec, created: time.Now()}
	return nil
}

// RemoveVolume implements jail.Runtime: the volume's directory is
// removed; a volume that a container not yet removed mounts is an error,
// as the engine's.
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.volumes[name]
	if !ok {
		return nil
	}
	for _, c := range r.containers {
		for _, m := range c.spec.Mounts {
			if m.Volume && m.Source == name {
				return fmt.Errorf("remove %s: volume is in use - [%s]", name, c.id)
			}
		}
	}
	delete(r.volumes, name)
	err := os.RemoveAll(v.dir)
	if len(r.volumes) == 0 && r.volumeBase != "" {
		// The last volume gone, so is their base: a test leaves nothing
		// in $TMPDIR.
		_ = os.Remove(r.volumeBase)
		r.volumeBase = ""
	}
	return err
}

// ListManagedVolumes implements jail.Runtime.
func (r *Runtime) ListManagedVolumes(ctx context.Context) ([]jail.ManagedVolume, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []jail.ManagedVolume
	for name, v := range r.volumes {
		if v.spec.Labels[jail.LabelManaged] == "true" {
			out = append(out, jail.ManagedVolume{Name: name, Labels: v.spec.Labels, Created: v.created})
		}
	}
	return out, nil
}

// Volumes returns the specs of the volumes not yet removed.
func (r *Runtime) Volumes() []jail.VolumeSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]jail.VolumeSpec, 0, len(r.volumes))
	for _, v := range r.volumes {
		out = append(out, v.spec)
	}
	return out
}

// volumePath returns the directory of the named volume ("" when there is
// none).
func (r *Runtime) volumePath(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.volumes[name].dir
}

// resolveVolumes returns spec with each volume mount turned into a bind
// mount of the volume's directory ("" when the volume does not exist).
func (r *Runtime) resolveVolumes(spec jail.ContainerSpec) jail.ContainerSpec {
	mounts := make([]jail.Mount, len(spec.Mounts))
	for i, m := range spec.Mounts {
		if m.Volume {
			m.Source, m.Volume = r.volumePath(m.Source), false
		}
		mounts[i] = m
	}
	spec.Mounts = mounts
	return spec
}
