package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// mountWorkspaceTmpfs mounts a tmpfs of mib MiB on dir, owned by uid:gid,
// mode 0755, nosuid and nodev: the kernel, not the worker, bounds what a
// run can write into its workspace. The worker needs CAP_SYS_ADMIN, and the
// Docker engine must see the worker's mounts (same mount namespace, or a
// shared propagation).
func mountWorkspaceTmpfs(dir string, mib int64, uid, gid int) error {
	opts := fmt.Sprintf("size=%dm,mode=0755,uid=%d,gid=%d", mib, uid, gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the workspace tmpfs (profile workspace_mib needs a worker allowed to mount): %w", err)
	}
	return nil
}

// unmountWorkspace detaches whatever is mounted on dir; nothing mounted
// there is not an error.
func unmountWorkspace(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// workspaceFull reports whether the file system at dir has no space left
// (less than one block free), and its size in MiB.
func workspaceFull(dir string) (bool, int64) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, 0
	}
	return st.Bavail == 0, int64(st.Blocks) * st.Bsize >> 20
}

// removeWorkspaceDir unmounts a delivery's tree, if mounted, and removes the
// delivery's directory.
func removeWorkspaceDir(dir string) error {
	if err := unmountWorkspace(filepath.Join(dir, "tree")); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
