package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func cancelCommand() *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a run by execid or jobid",
		ArgsUsage: "<execid|prefix|jobid>",
		Action:    runCancel,
	}
}

func runCancel(c *cli.Context) error {
	r, err := findRun(c, "cancel <execid|prefix|jobid>")
	if err != nil {
		// A Slurm job that hpcrun did not submit from here can still be cancelled by id.
		ref := c.Args().First()
		if _, nerr := strconv.ParseUint(ref, 10, 64); c.NArg() == 1 && nerr == nil && errors.Is(err, rundir.ErrNotFound) {
			if _, lerr := exec.LookPath("scancel"); lerr == nil {
				if err := (&slurm.Slurm{}).Cancel(c.Context, slurm.JobRef{ID: ref}); err != nil {
					return fmt.Errorf("cancel job %s: %w", ref, slurmErr(err))
				}
				fmt.Printf("cancelled slurm job %s\n", ref)
				return nil
			}
		}
		return err
	}
	m := r.Meta
	if m.JobID == "" {
		return fmt.Errorf("run %s was never submitted (%s)", m.ExecID, firstLineOf(m.SubmitError))
	}
	ctx := context.Background()
	j, err := runStatus(ctx, r)
	if err != nil {
		return slurmErr(err)
	}
	if j.State.Done() {
		return fmt.Errorf("run %s (job %s) is already over: %s", m.ExecID, m.JobID, j.State)
	}
	ex, err := executorOf(r)
	if err != nil {
		return err
	}
	if err := ex.Cancel(ctx, slurm.JobRef{ID: m.JobID, RunDir: r.Dir.Path()}); err != nil {
		return fmt.Errorf("cancel run %s (job %s): %w", m.ExecID, m.JobID, slurmErr(err))
	}
	fmt.Printf("cancelled run %s (%s job %s)\n", m.ExecID, m.Executor, m.JobID)
	return nil
}
