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
	g, err := Permissions(r)
	if err != nil {
		panic(err)
	}
	return g.ConfigBlock()
}

// ConfigBlock returns g as a nats-server configuration block,
// `permissions: { ... }`, every subject quoted.
func (g Grant) ConfigBlock() string {
	var b strings.Builder
	b.WriteString("permissions: {\n")
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
