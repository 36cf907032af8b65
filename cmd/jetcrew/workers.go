package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/jetcrew/jetcrew/dispatcher"
	"github.com/jetcrew/jetcrew/messages"
)

// workersOptions are the flags of `jetcrew workers`.
type workersOptions struct {
	url    string
	asJSON bool
}

func (a operatorCmds) workersCmd() *cobra.Command {
	var o workersOptions
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List the live workers: pool, concurrency, heartbeat and warm pools",
		Long: `workers lists the live workers of the jetcrew-workers bucket, by id: the
pool each takes runs from, its concurrency, how long ago its latest heartbeat
was, and its warm pools (a profile's warm = N): per profile, the warm
containers ready now over those it keeps. A warm pool the engine refuses to
fill backs off: it is marked so, and the engine's last refusal is printed
below the table. With --json it prints a JSON array of the workers' presence
values (docs/wire.md, "Worker presence").`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runWorkers(cmd.Context(), o)
		},
	}
	natsFlag(cmd, &o.url)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print the workers' presence values as a JSON array")
	return cmd
}

func (a operatorCmds) runWorkers(ctx context.Context, o workersOptions) error {
	d, closeNATS, err := a.dispatcher(a.natsURL(o.url), "jetcrew workers")
	if err != nil {
		return err
	}
	defer closeNATS()
	workers, err := d.Workers(ctx)
	if err != nil {
		return err
	}
	if o.asJSON {
		out := make([]messages.WorkerPresence, 0, len(workers))
		for _, w := range workers {
			out = append(out, w.Presence())
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", inertJSON(b))
		return err
	}
	return printWorkers(a.stdout, workers, time.Now())
}

// printWorkers writes workers as a table for people, heartbeat ages as of
// now, then one line per warm pool that backs off with the engine's last
// refusal. Everything a worker wrote is shown escaped (visibleName).
func printWorkers(w io.Writer, workers []dispatcher.WorkerBeat, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tPOOL\tCONCURRENCY\tHEARTBEAT\tWARM (READY/TARGET)")
	var backoffs []string
	for _, wb := range workers {
		pool, conc := "-", "-"
		if wb.Pool != "" {
			pool, conc = visibleName(wb.Pool), fmt.Sprint(wb.Concurrency)
		}
		beat := "-"
		if !wb.Beat.IsZero() {
			beat = max(now.Sub(wb.Beat), 0).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", visibleName(wb.ID), pool, conc, beat, warmCell(wb.Warm))
		for _, p := range wb.Warm {
			if p.Error != "" {
				kind := ""
				if p.Workspace {
					kind = " (workspace runs)"
				}
				backoffs = append(backoffs, fmt.Sprintf("worker %s, warm pool %s%s backs off: %s",
					visibleName(wb.ID), visibleName(p.Profile), kind, visibleName(p.Error)))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(backoffs) > 0 {
		_, err := fmt.Fprintf(w, "\n%s\n", strings.Join(backoffs, "\n"))
		return err
	}
	return nil
}

// warmCell is a worker's warm pools in one cell: "hot 1/2, hot+workspace
// 1/1, shell 0/1 (backing off)" (a profile's pool for workspace runs,
// warm_workspace, is PROFILE+workspace); "-" when it keeps none.
func warmCell(pools []messages.WarmPool) string {
	if len(pools) == 0 {
		return "-"
	}
	cells := make([]string, 0, len(pools))
	for _, p := range pools {
		name := visibleName(p.Profile)
		if p.Workspace {
			name += "+workspace"
		}
		c := fmt.Sprintf("%s %d/%d", name, p.Ready, p.Target)
		if p.Error != "" {
			c += " (backing off)"
		}
		cells = append(cells, c)
	}
	return strings.Join(cells, ", ")
}
