package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
)

// defaultDecider names who answers an egress question: $USER@host.
func defaultDecider() string {
	name := "operator"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

func (a operatorCmds) egressCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress pending|allow|deny",
		Short: "Answer runs' connections to hosts their profile asks an operator about (egress_ask)",
		Long: `A profile's egress_ask lists hosts a run may reach only once an operator
allows it, live: the run's connection waits (not refused) until an answer,
or until the profile's egress_ask_timeout refuses it.

  jetcrew egress pending             the connections waiting, oldest first
  jetcrew egress allow ID [--profile] [--by NAME]
  jetcrew egress deny ID [--profile] [--by NAME]

An answer is for the run (its connections to the host from now on), or
with --profile for every run of the profile from now on. Every answer is
in the run's egress event, with who gave it (--by, default $USER@host).`,
	}
	var url string
	pending := &cobra.Command{
		Use:   "pending",
		Short: "List the connections waiting for an operator",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runEgressPending(cmd.Context(), url)
		},
	}
	natsFlag(pending, &url)
	cmd.AddCommand(pending, a.egressAnswerCmd(true), a.egressAnswerCmd(false))
	return cmd
}

func (a operatorCmds) egressAnswerCmd(allow bool) *cobra.Command {
	var url, by string
	var forProfile bool
	verb := "deny"
	if allow {
		verb = "allow"
	}
	cmd := &cobra.Command{
		Use:   verb + " [flags] ID",
		Short: verb + " a waiting connection (an ID from jetcrew egress pending)",
		Args:  exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew egress "+verb)
			if err != nil {
				return err
			}
			defer closeNATS()
			q, err := d.AnswerEgress(cmd.Context(), args[0], allow, forProfile, by)
			switch {
			case errors.Is(err, dispatcher.ErrNoQuestion):
				return fmt.Errorf("%s: no connection is waiting under this id (answered, given up, or never asked)", args[0])
			case err != nil:
				return err
			}
			scope := "for run " + q.RunID
			if forProfile {
				scope = "for every run of profile " + q.Profile + " from now on"
			}
			fmt.Fprintf(visible(a.stdout), "%s: %s %s %s\n", args[0], verb, net.JoinHostPort(q.Host, strconv.Itoa(q.Port)), scope)
			return nil
		},
	}
	natsFlag(cmd, &url)
	cmd.Flags().BoolVar(&forProfile, "profile", false, "answer for every run of the question's profile from now on, not only this run")
	cmd.Flags().StringVar(&by, "by", defaultDecider(), "who answers, as the run's egress event records it")
	return cmd
}

func (a operatorCmds) runEgressPending(ctx context.Context, url string) error {
	d, closeNATS, err := a.dispatcher(a.natsURL(url), "jetcrew egress pending")
	if err != nil {
		return err
	}
	defer closeNATS()
	qs, err := d.EgressPending(ctx)
	if err != nil {
		return err
	}
	if len(qs) == 0 {
		fmt.Fprintln(a.stdout, "no connection is waiting for an operator")
		return nil
	}
	tw := tabwriter.NewWriter(visible(a.stdout), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRUN\tPROFILE\tHOST\tWAITING\tREFUSED IN")
	for _, q := range qs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", q.ID, q.RunID, q.Profile, net.JoinHostPort(q.Host, strconv.Itoa(q.Port)),
			time.Since(q.Time).Round(time.Second), time.Until(q.Until).Round(time.Second))
	}
	return tw.Flush()
}
