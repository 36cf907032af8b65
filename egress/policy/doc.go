// Package policy holds what a profile says a run may reach and pass
// unmetered through its egress proxy: the allowlist (profile keys egress
// and egress_ask; Policy) and the requests on a metered host that pass
// without usage (egress_unmetered_paths; UnmeteredPaths).
//
// It is a leaf: it imports only the standard library, so that profiles and
// the stage contract read these values without the proxy (package egress),
// which enforces them.
package policy
