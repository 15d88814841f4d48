package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func queueCommand() *cli.Command {
	return &cli.Command{
		Name:  "queue",
		Usage: "list your jobs, their state and their execids",
		Description: "Shows your pending and running jobs (squeue --me) joined with the runs in the runs dir,\n" +
			"local-executor runs included. --all adds finished runs (from scontrol, sacct when\n" +
			"accounting is on, or the state recorded in meta.json).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "include finished runs (and those whose submission failed)"},
			&cli.StringSliceFlag{Name: "state", Aliases: []string{"s"}, Usage: "only runs in these `STATES` (comma-separated, e.g. failed,cancelled; implies --all)"},
			&cli.StringFlag{Name: "name", Usage: "only jobs whose name contains `TEXT`"},
			&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "redraw every --interval until interrupted"},
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "refresh period of --watch"},
		},
		Action: runQueue,
	}
}

func runQueue(c *cli.Context) error {
	states := slurm.ParseStates(c.StringSlice("state"))
	if err := checkStates(states); err != nil {
		return err
	}
	dir, err := runsDir(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	all := c.Bool("all") || len(states) > 0
	for {
		rows, err := queueRows(ctx, dir, all, c.String("name"))
		if err != nil && rows == nil {
			return err
		}
		rows = states.Filter(rows)
		if len(rows) == 0 && !all && !c.Bool("json") && !c.Bool("watch") {
			if runs, _ := slurm.ListRuns(dir); len(runs) > 0 {
				fmt.Fprintf(os.Stderr, "no live runs; hpcrun queue --all lists the %d finished or not submitted (--state failed,... picks some)\n", len(runs))
				return err
			}
		}
		if c.Bool("watch") && !c.Bool("json") {
			fmt.Print("\033[H\033[2J")
			fmt.Printf("hpcrun queue  %s  (every %s; Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), c.Duration("interval"))
		}
		if err := printQueue(os.Stdout, rows, c.Bool("json")); err != nil {
			return err
		}
		if !c.Bool("watch") {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Duration("interval")):
		}
	}
}

// jobStates are the states a run can be in: Slurm's job states (squeue's
// and sacct's long names), and hpcrun's UNKNOWN and NOT_SUBMITTED.
var jobStates = []slurm.State{slurm.Pending, slurm.Running, slurm.Completed, slurm.Failed, slurm.Cancelled, slurm.Timeout,
	"OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT", "SUSPENDED", "STOPPED",
	"CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT",
	slurm.Unknown, slurm.NotSubmitted}

// checkStates refuses a --state that no run can be in, in one line naming
// the states (a typo filtered every run out, exit 0).
func checkStates(states slurm.States) error {
	var bad []string
	for s := range states {
		if !slices.Contains(jobStates, s) {
			bad = append(bad, strings.ToLower(string(s)))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	valid := make([]string, len(jobStates))
	for i, s := range jobStates {
		valid[i] = strings.ToLower(string(s))
	}
	return cli.Exit(fmt.Sprintf("queue --state %s: not a job state; the states are %s", strings.Join(bad, ","), strings.Join(valid, ", ")), 2)
}

// queueRows is slurm.ListQueue with the failure class of each run that
// ended badly, and a warning on stderr when Slurm cannot be reached.
func queueRows(ctx context.Context, dir string, all bool, name string) ([]slurm.QueueRow, error) {
	rows, err := slurm.ListQueue(ctx, dir, slurm.QueueQuery{All: all, Name: name,
		Failure: func(d rundir.Dir, j slurm.JobInfo) string { return string(failure.Of(d, j).Class) },
		Warn:    func(err error) { fmt.Fprintf(os.Stderr, "hpcrun: warning: %v\n", slurmErr(err)) },
	})
	return rows, slurmErr(err)
}

// printQueue writes the rows as JSON (an empty list for none) or as
// slurm.WriteQueue's table.
func printQueue(w io.Writer, rows []slurm.QueueRow, asJSON bool) error {
	if !asJSON {
		return slurm.WriteQueue(w, rows)
	}
	if rows == nil {
		rows = []slurm.QueueRow{}
	}
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
