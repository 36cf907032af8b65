package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/roles"
)

// usersConfName is the file `jetcrew roles users` writes beside the seeds.
const usersConfName = "users.conf"

// rolesCmd is `jetcrew roles`: the NATS roles for a server jetcrew does not
// embed (docs/security.md).
func (a serveCmds) rolesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "roles",
		Short: "NATS roles (submitter, worker, operator, observer) for a real server's configuration",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "permissions",
		Short: "Print the roles' permissions as nats-server variables (deploy/nats/permissions.conf)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(a.stdout, roles.ConfigFile())
			return err
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "users DIR",
		Short: "Create one NKey user per role in DIR: <role>.nk seeds (mode 0600) and users.conf for nats-server",
		Long: `users creates, in DIR (mode 0700), an NKey user seed per role, <role>.nk
(mode 0600; existing seeds are kept), and users.conf, a nats-server
authorization block giving each public key its role's permissions
($JETCREW_<ROLE>, defined by permissions.conf, which it writes too and
users.conf includes): include users.conf in the server's configuration, and
hand each seed to its holder only (jetcrew --nkey DIR/<role>.nk
--inbox-prefix _INBOX_jetcrew_<role>, or a NATS CLI context with both).`,
		Args: exactArgs("DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.writeRoleUsers(args[0])
		},
	})
	return cmd
}

// writeRoleUsers creates or keeps the role seeds in dir and writes
// permissions.conf and users.conf beside them.
func (a serveCmds) writeRoleUsers(dir string) error {
	keys, _, err := ensureRoleKeys(dir)
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# jetcrew's role users, written by `jetcrew roles users`: include this file in\n")
	b.WriteString("# the server's configuration.\ninclude permissions.conf\n\nauthorization {\n  users: [\n")
	for _, r := range roles.All {
		kp, err := loadOrCreateSeed(keys[r])
		if err != nil {
			return err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return err
		}
		if !nkeys.IsValidPublicUserKey(pub) {
			return fmt.Errorf("%s: not a user key", keys[r])
		}
		fmt.Fprintf(&b, "    { nkey: %s, permissions: $%s }\n", pub, roles.ConfigVariable(r))
	}
	b.WriteString("  ]\n}\n")
	if err := os.WriteFile(filepath.Join(dir, "permissions.conf"), []byte(roles.ConfigFile()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, usersConfName), []byte(b.String()), 0o644); err != nil {
		return err
	}
	for _, r := range roles.All {
		fmt.Fprintf(a.stdout, "%s\t%s\t--inbox-prefix %s\n", r, keys[r], roles.InboxPrefix(r))
	}
	fmt.Fprintf(a.stdout, "# include %s in the server's configuration (it includes permissions.conf)\n",
		filepath.Join(dir, usersConfName))
	return nil
}
