package docker

import (
	"context"
	"fmt"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/jetcrew/jetcrew/worker/jail"
)

// CreateVolume implements jail.Runtime with VolumeCreate: a volume of the
// "local" driver whose options (type=tmpfs, device=tmpfs,
// o=size=N,uid=U,gid=G,mode=0755,nosuid,nodev[,nr_inodes=I]) make the engine mount a
// fresh tmpfs of spec.SizeBytes bytes when a container that mounts it
// starts (moby's volume/local driver, the options of `docker volume create
// --opt`). A volume of that name already there is removed first, so its
// content and options are never reused (VolumeCreate would return it as it
// is).
func (r *Runtime) CreateVolume(ctx context.Context, spec jail.VolumeSpec) error {
	if spec.SizeBytes <= 0 || spec.UID < 0 || spec.GID < 0 {
		return fmt.Errorf("%w: volume %q: size %d bytes, owner %d:%d", jail.ErrPermanent, spec.Name, spec.SizeBytes, spec.UID, spec.GID)
	}
	if err := r.RemoveVolume(ctx, spec.Name); err != nil {
		return err
	}
	_, err := r.cli.VolumeCreate(ctx, volume.CreateOptions{
		Name:       spec.Name,
		Driver:     "local",
		DriverOpts: tmpfsOptions(spec),
		Labels:     spec.Labels,
	})
	if err != nil {
		return classify(opVolumeCreate, err)
	}
	return nil
}

// tmpfsOptions returns the local driver's options of spec's tmpfs volume.
func tmpfsOptions(spec jail.VolumeSpec) map[string]string {
	o := fmt.Sprintf("size=%d,uid=%d,gid=%d,mode=0755,nosuid,nodev", spec.SizeBytes, spec.UID, spec.GID)
	if spec.Inodes > 0 {
		o += fmt.Sprintf(",nr_inodes=%d", spec.Inodes)
	}
	return map[string]string{"type": "tmpfs", "device": "tmpfs", "o": o}
}

// RemoveVolume implements jail.Runtime with VolumeRemove (not forced: a
// volume a container still mounts stays, and that is an error). A volume
// that does not exist counts as removed.
func (r *Runtime) RemoveVolume(ctx context.Context, name string) error {
	err := r.cli.VolumeRemove(ctx, name, false)
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	return classify(opVolumeRemove, err)
}

// ListManagedVolumes implements jail.Runtime: VolumeList filtered by the
// label jail.LabelManaged=true. Created is the engine's CreatedAt (zero
// when it cannot be parsed).
func (r *Runtime) ListManagedVolumes(ctx context.Context) ([]jail.ManagedVolume, error) {
	var list volume.ListResponse
	err := retry(ctx, r.cfg.RetryTimeout, func(ctx context.Context) error {
		var err error
		list, err = r.cli.VolumeList(ctx, volume.ListOptions{
			Filters: filters.NewArgs(filters.Arg("label", jail.LabelManaged+"=true")),
		})
		return err
	})
	if err != nil {
		return nil, classify(opVolumeList, err)
	}
	out := make([]jail.ManagedVolume, 0, len(list.Volumes))
	for _, v := range list.Volumes {
		if v == nil {
			continue
		}
		created, _ := time.Parse(time.RFC3339, v.CreatedAt)
		out = append(out, jail.ManagedVolume{Name: v.Name, Labels: v.Labels, Created: created})
	}
	return out, nil
}

// Signal implements jail.Container with ContainerKill: the engine sends
// sig to the container's init, which forwards it to the command. A
// container that is not running is an error.
func (c *Container) Signal(ctx context.Context, sig string) error {
	if err := c.rt.cli.ContainerKill(ctx, c.id, sig); err != nil {
		return classify(opKill, err)
	}
	return nil
}
