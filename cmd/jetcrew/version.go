package main

import (
	"runtime/debug"
	"strings"
)

// commit is the VCS commit the binary was built from, set by the Makefile
// (-ldflags "-X main.commit=..."), for builds without the go command's VCS
// stamping (-buildvcs=false, a build outside the checkout).
var commit string

// versionString describes this binary for `jetcrew --version`: the module
// version ("(devel)" for a build from a checkout), the VCS commit and its
// time with "+dirty" for uncommitted changes, when the go command recorded
// them (a build inside the git checkout), and the Go version.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "jetcrew (unknown build)"
	}
	parts := []string{"jetcrew", bi.Main.Version}
	var rev, when, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev == "" {
		rev = commit
	}
	if rev != "" {
		parts = append(parts, "commit "+rev+dirty)
	}
	if when != "" {
		parts = append(parts, when)
	}
	parts = append(parts, bi.GoVersion)
	return strings.Join(parts, " ")
}
