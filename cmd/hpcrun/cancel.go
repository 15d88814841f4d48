package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/sweep"
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
	if errors.Is(err, rundir.ErrNotFound) {
		ref := c.Args().First()
		runs, rerr := runsDir(c)
		if rerr != nil {
			return rerr
		}
		// A sweep's job array is ours too: cancel all its points at once.
		if st, ok := sweep.OfJob(runs, ref); ok && st.Executor == "slurm" {
			if err := (&slurm.Slurm{}).Cancel(c.Context, slurm.JobRef{ID: ref}); err != nil {
				return fmt.Errorf("cancel sweep %s (job array %s): %w", st.ID, ref, slurmErr(err))
			}
			fmt.Printf("cancelled sweep %s (slurm job array %s)\n", st.ID, ref)
			return nil
		}
		// Anything else may be another job of the user's (a typo):
		// hpcrun cancels only what it submitted.
		return cli.Exit(fmt.Sprintf("nothing cancelled: %q is not a run of hpcrun's in %s (hpcrun queue --all lists them); to cancel a job hpcrun did not submit, use scancel", ref, runs), 2)
	}
	if err != nil {
		return err
	}
	m := r.Meta
	if m.JobID == "" {
		return fmt.Errorf("run %s was never submitted (%s)", m.ExecID, slurm.FirstLine(m.SubmitError))
	}
	ctx := context.Background()
	j, err := r.Status(ctx)
	if err != nil {
		return slurmErr(err)
	}
	if j.State.Done() {
		why := string(j.State)
		if j.Reason != "" {
			why += " (" + j.Reason + ")"
		}
		return fmt.Errorf("nothing cancelled: run %s (job %s) is already over: %s", m.ExecID, m.JobID, why)
	}
	ex, err := r.Executor()
	if err != nil {
		return err
	}
	if err := ex.Cancel(ctx, slurm.JobRef{ID: m.JobID, RunDir: r.Dir.Path()}); err != nil {
		return fmt.Errorf("cancel run %s (job %s): %w", m.ExecID, m.JobID, slurmErr(err))
	}
	fmt.Printf("cancelled run %s (%s job %s)\n", m.ExecID, m.Executor, m.JobID)
	return nil
}
