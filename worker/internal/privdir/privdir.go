// Package privdir makes and checks the worker's private directories: a
// directory the worker's user owns with mode 0700, never a symbolic link,
// so nobody else can create, replace or link anything the worker later
// creates, chmods or mounts under it.
package privdir

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// Ensure creates dir with mode 0700, or checks that the existing
// dir is a directory (not a symlink), owned by the effective user, with mode
// 0700 exactly.
func Ensure(dir string) error {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil:
		// Mkdir's mode passes through the umask; 0700 only loses bits.
		return Check(dir)
	case errors.Is(err, os.ErrExist):
		return Check(dir)
	default:
		return err
	}
}

// Check returns an error, saying how to fix it, unless dir is a directory
// (not a symlink) owned by the effective user with mode 0700 exactly.
func Check(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symbolic link; refusing it (the worker never follows links in its state dir)", dir)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the worker's uid %d; refusing a directory someone else created (remove it, or choose another state dir)", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("%s has mode %04o; the worker's state dir must have mode 0700 (chmod 0700 it, or choose another state dir)", dir, fi.Mode().Perm())
	}
	return nil
}
