package main

import (
	"encoding/json"
	"fmt"

	"github.com/jetcrew/jetcrew/worker/profile"
	"github.com/spf13/cobra"
)

// profilesCmd is `jetcrew profiles check FILE`: it validates a profile file
// the way a worker loading it would, and prints each profile's effective
// configuration (defaults applied, the argv, environment and files its
// backend would use). A file a worker would refuse exits 2 with the reason.
func (a workerCmds) profilesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "Work with worker profile files",
	}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a profile file and print each profile's effective configuration",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ps, err := profile.LoadProfiles(args[0])
			if err != nil {
				return usageError(err)
			}
			for _, name := range ps.Names() {
				d, err := ps[name].Describe()
				if err != nil {
					return usageError(fmt.Errorf("profile %q: %w", name, err))
				}
				b, err := json.MarshalIndent(d, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "# profile %s\n%s\n", name, b)
			}
			return nil
		},
	}
	cmd.AddCommand(check)
	return cmd
}
