package roles

import (
	"fmt"
	"strings"
)

// ConfigBlock returns role r's permissions (every pool for a submitter) as
// a nats-server configuration block, `permissions: { ... }`, for a user of a
// server's configuration file: the text docs/security.md shows. It panics on
// an unknown role (a programming error: roles are constants).
func ConfigBlock(r Role) string {
	return "permissions: " + mustGrant(r).configMap()
}

// ConfigBlock returns g as a nats-server configuration block,
// `permissions: { ... }`, every subject quoted.
func (g Grant) ConfigBlock() string {
	return "permissions: " + g.configMap()
}

// ConfigVariable names the nats-server configuration variable ConfigFile
// defines for role r: JETCREW_SUBMITTER, JETCREW_WORKER, ...
func ConfigVariable(r Role) string {
	return "JETCREW_" + strings.ToUpper(string(r))
}

// ConfigFile returns a nats-server configuration file defining one variable
// per role (ConfigVariable) holding its permissions, for `include` in a
// server's configuration and `permissions: $JETCREW_SUBMITTER` in its users:
// deploy/nats/permissions.conf.
func ConfigFile() string {
	var b strings.Builder
	b.WriteString("# jetcrew's NATS roles: generated from package roles (go test ./roles -update);\n")
	b.WriteString("# do not edit. docs/security.md explains each. Include this file, then give\n")
	b.WriteString("# each user `permissions: $JETCREW_<ROLE>`.\n")
	for _, r := range All {
		fmt.Fprintf(&b, "\n%s: %s", ConfigVariable(r), mustGrant(r).configMap())
	}
	return b.String()
}

func mustGrant(r Role) Grant {
	g, err := Permissions(r)
	if err != nil {
		panic(err)
	}
	return g
}

// configMap renders g as a nats-server configuration map, `{ ... }`.
func (g Grant) configMap() string {
	var b strings.Builder
	b.WriteString("{\n")
	list := func(name string, subjects []string) {
		fmt.Fprintf(&b, "  %s: {\n    allow: [\n", name)
		for _, s := range subjects {
			fmt.Fprintf(&b, "      %q\n", s)
		}
		b.WriteString("    ]\n  }\n")
	}
	list("publish", g.Publish)
	list("subscribe", g.Subscribe)
	if g.Responses {
		b.WriteString("  allow_responses: true\n")
	}
	b.WriteString("}\n")
	return b.String()
}
