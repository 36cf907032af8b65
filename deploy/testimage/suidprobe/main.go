// Command suidprobe prints the identity it runs with, then tries to become
// root. The jetcrew test image (deploy/testimage) installs it setuid root
// (owner 0, mode 4755), so it shows whether executing a setuid-root binary
// raises a process's privileges: in the jail (no-new-privileges, no
// capabilities) the effective uid must stay the caller's.
//
// Output, one line:
//
//	ruid=<n> euid=<n> rgid=<n> egid=<n> setuid0=<ok|error text>
//
// It exits 0 whatever it finds; the caller judges the numbers.
//
// Build it static (the image has no libc): CGO_ENABLED=0 go build.
package main

import (
	"fmt"
	"syscall"
)

func main() {
	fmt.Printf("ruid=%d euid=%d rgid=%d egid=%d ", syscall.Getuid(), syscall.Geteuid(), syscall.Getgid(), syscall.Getegid())
	if err := syscall.Setuid(0); err != nil {
		fmt.Printf("setuid0=%v\n", err)
		return
	}
	fmt.Printf("setuid0=ok\n")
}
