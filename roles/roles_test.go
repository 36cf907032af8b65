package roles_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/jetcrew/jetcrew/messages"
	"github.com/jetcrew/jetcrew/roles"
)

var update = flag.Bool("update", false, "rewrite docs/security.md's permission blocks from the code")

const securityDoc = "../docs/security.md"

// docBlock matches a role's block in docs/security.md: the code fence
// between <!-- role:NAME --> and <!-- /role:NAME -->.
func docBlock(r roles.Role) *regexp.Regexp {
	return regexp.MustCompile("(?s)(<!-- role:" + string(r) + " -->\n```\n)(.*?)(```\n<!-- /role:" + string(r) + " -->)")
}

// docs/security.md shows exactly the permissions the code grants.
func TestDocMatchesCode(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(securityDoc)
	require.NoError(t, err)
	doc := string(data)
	for _, r := range roles.All {
		re := docBlock(r)
		if *update {
			require.Regexp(t, re, doc, "docs/security.md has no block for %s", r)
			doc = re.ReplaceAllLiteralString(doc, "<!-- role:"+string(r)+" -->\n```\n"+roles.ConfigBlock(r)+"```\n<!-- /role:"+string(r)+" -->")
			continue
		}
		m := re.FindStringSubmatch(doc)
		require.NotNil(t, m, "docs/security.md has no block for %s (go test ./roles -update writes it)", r)
		require.Equal(t, roles.ConfigBlock(r), m[2], "docs/security.md's %s block differs from the code (go test ./roles -update)", r)
	}
	if *update {
		require.NoError(t, os.WriteFile(securityDoc, []byte(doc), 0o644))
	}
}

// The blocks are valid nats-server configuration that gives the users the
// very permissions the embedded server gets.
func TestConfigBlocksParse(t *testing.T) {
	t.Parallel()
	var conf strings.Builder
	conf.WriteString("authorization {\n  users = [\n")
	keys := map[roles.Role]string{}
	for _, r := range roles.All {
		kp, err := nkeys.CreateUser()
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		keys[r] = pub
		fmt.Fprintf(&conf, "    { nkey: %q\n%s    }\n", pub, indent(roles.ConfigBlock(r), "      "))
	}
	conf.WriteString("  ]\n}\n")
	path := filepath.Join(t.TempDir(), "server.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf.String()), 0o644))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err, conf.String())
	require.Len(t, opts.Nkeys, len(roles.All))
	for _, u := range opts.Nkeys {
		for r, pub := range keys {
			if u.Nkey != pub {
				continue
			}
			g, err := roles.Permissions(r)
			require.NoError(t, err)
			want := g.ServerPermissions()
			require.Equal(t, want.Publish.Allow, u.Permissions.Publish.Allow, r)
			require.Equal(t, want.Subscribe.Allow, u.Permissions.Subscribe.Allow, r)
			require.Equal(t, want.Response != nil, u.Permissions.Response != nil, r)
		}
	}
}

func indent(s, pre string) string {
	lines := strings.SplitAfter(strings.TrimSuffix(s, "\n"), "\n")
	return pre + strings.Join(lines, pre) + "\n"
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, r := range roles.All {
		got, err := roles.Parse(string(r))
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
	_, err := roles.Parse("admin")
	require.ErrorContains(t, err, "submitter")
}

// Who may publish where runs read: only workers on the run subjects, only
// operators on the operator's, nobody else on either.
func TestCoordinationPublishers(t *testing.T) {
	t.Parallel()
	for _, r := range roles.All {
		g, err := roles.Permissions(r)
		require.NoError(t, err)
		require.Equal(t, r == roles.Worker, contains(g.Publish, "jetcrew.coord.*.*.*"), r)
		require.Equal(t, r == roles.Operator, contains(g.Publish, "jetcrew.coord.*.*.*.operator"), r)
		for _, s := range g.Publish {
			require.NotEqual(t, ">", s, r)
			require.NotEqual(t, "jetcrew.>", s, r)
			require.NotEqual(t, "jetcrew.coord.>", s, r)
		}
	}
}

// Only workers configure a stream (a RePublish, a source or a subject
// transform publishes as the server, which no permission sees), delete a
// stream's message or restore a stream, and only workers touch a consumer
// on the streams with durable ones (a create naming an existing consumer
// updates it); no role, the worker included, creates a stream of another
// name.
func TestOnlyWorkersConfigureStreamsOrTouchDurables(t *testing.T) {
	t.Parallel()
	jetcrews := []string{messages.StreamRuns, messages.StreamEvents, messages.StreamFailed, messages.StreamCoord,
		messages.StreamCoordView, messages.StreamAdvisories, "KV_" + messages.BucketRuns, "KV_" + messages.BucketWorkers,
		"KV_" + messages.BucketCoordPeers, "KV_" + messages.BucketCoordClaims, "KV_" + messages.BucketGroups, "KV_" + messages.BucketCoordQuestions, "OBJ_" + messages.BucketWorkspaces, "OBJ_" + messages.BucketUploads, "OBJ_" + messages.BucketResults}
	var workersOnly []string
	for _, s := range jetcrews {
		workersOnly = append(workersOnly, "$JS.API.STREAM.CREATE."+s, "$JS.API.STREAM.UPDATE."+s, "$JS.API.STREAM.MSG.DELETE."+s)
	}
	for _, s := range []string{messages.StreamRuns, messages.StreamAdvisories, messages.StreamCoord} {
		for _, name := range []string{"inbox-victim", "workers-default", messages.ConsumerAdvisories} {
			workersOnly = append(workersOnly,
				"$JS.API.CONSUMER.CREATE."+s+"."+name,
				"$JS.API.CONSUMER.CREATE."+s+"."+name+".jetcrew.coord.default.g.nobody",
				"$JS.API.CONSUMER.DURABLE.CREATE."+s+"."+name,
				"$JS.API.CONSUMER.MSG.NEXT."+s+"."+name,
				"$JS.API.CONSUMER.DELETE."+s+"."+name,
				"$JS.ACK."+s+"."+name+".1.2.3.4.5")
		}
	}
	nobody := []string{"$JS.API.STREAM.CREATE.RELAY", "$JS.API.STREAM.UPDATE.RELAY", "$JS.API.STREAM.RESTORE." + messages.StreamCoord,
		"$JS.API.STREAM.RESTORE.KV_" + messages.BucketRuns, "$JS.API.CONSUMER.CREATE." + messages.StreamCoord,
		"$JS.API.CONSUMER.PAUSE." + messages.StreamCoord + ".inbox-victim"}
	for _, r := range roles.All {
		g, err := roles.Permissions(r)
		require.NoError(t, err)
		allowed := func(subject string) bool {
			for _, p := range g.Publish {
				if server.SubjectMatchesFilter(subject, p) {
					return true
				}
			}
			return false
		}
		for _, subj := range workersOnly {
			require.Equal(t, r == roles.Worker, allowed(subj), "%s may publish %s", r, subj)
		}
		for _, subj := range nobody {
			require.False(t, allowed(subj), "%s may publish %s", r, subj)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

const permissionsConf = "../deploy/nats/permissions.conf"

// deploy/nats/permissions.conf is the code's, and a server configuration
// including it gives its users the code's permissions.
func TestPermissionsFile(t *testing.T) {
	t.Parallel()
	if *update {
		require.NoError(t, os.WriteFile(permissionsConf, []byte(roles.ConfigFile()), 0o644))
	}
	data, err := os.ReadFile(permissionsConf)
	require.NoError(t, err)
	require.Equal(t, roles.ConfigFile(), string(data), "deploy/nats/permissions.conf differs from the code (go test ./roles -update)")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "permissions.conf"), data, 0o644))
	// Every variable must be used: nats-server refuses unknown fields.
	var users strings.Builder
	pubs := map[string]roles.Role{}
	for _, r := range roles.All {
		kp, err := nkeys.CreateUser()
		require.NoError(t, err)
		pub, err := kp.PublicKey()
		require.NoError(t, err)
		pubs[pub] = r
		fmt.Fprintf(&users, "    { nkey: %q, permissions: $%s }\n", pub, roles.ConfigVariable(r))
	}
	path := filepath.Join(dir, "server.conf")
	conf := "include permissions.conf\nauthorization {\n  users = [\n" + users.String() + "  ]\n}\n"
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o644))
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	require.Len(t, opts.Nkeys, len(roles.All))
	for _, u := range opts.Nkeys {
		g, err := roles.Permissions(pubs[u.Nkey])
		require.NoError(t, err)
		require.Equal(t, g.Publish, u.Permissions.Publish.Allow, pubs[u.Nkey])
		require.Equal(t, g.Subscribe, u.Permissions.Subscribe.Allow, pubs[u.Nkey])
	}
}
