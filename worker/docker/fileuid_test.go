package docker

import (
	"os"
	"syscall"
)

// fileUID returns the owner of fi (Linux).
func fileUID(fi os.FileInfo) uint32 {
	return fi.Sys().(*syscall.Stat_t).Uid
}
