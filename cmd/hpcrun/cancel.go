package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func cancelCommand() *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a run by execid or jobid, or a sweep's live points by its id or its array's job id",
		ArgsUsage: "<execid|prefix|jobid|sweepid>",
		Action:    runCancel,
	}
}

func runCancel(c *cli.Context) error {
	r, err := findRun(c, "cancel <execid|prefix|jobid|sweepid>")
	if errors.Is(err, rundir.ErrNotFound) {
		ref := c.Args().First()
		runs, rerr := runsDir(c)
		if rerr != nil {
			return rerr
		}
		// A sweep, by its id or its job array's, is ours too: cancel its
		// live points.
		if st, ok := sweep.OfJob(runs, ref); ok {
			return cancelSweep(c.Context, runs, st)
		}
		if s, ferr := rundir.Find(rundir.Sweeps(runs), ref); ferr == nil {
			st, err := sweep.Read(s.Dir)
			if err != nil {
				return err
			}
			return cancelSweep(c.Context, runs, st)
		}
		// Anything else may be another job of the user's (a typo):
		// hpcrun cancels only what it submitted.
		return cli.Exit(fmt.Sprintf("nothing cancelled: %q is not a run or sweep of hpcrun's in %s (hpcrun queue --all lists them); to cancel a job hpcrun did not submit, use scancel", ref, runs), 2)
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

// cancelSweep cancels the points of st whose job is queued or running,
// each through its own run (so a job id the cluster reused is refused as
// for a run), and says which; a sweep with none live cancels nothing.
func cancelSweep(ctx context.Context, runs string, st *sweep.State) error {
	var live []slurm.Run
	over := 0
	for _, d := range st.RunDirs(runs) {
		m, err := slurm.ReadMeta(d)
		if err != nil {
			continue // a point never written whole
		}
		r := slurm.Run{Dir: d, Meta: m}
		j, err := r.Status(ctx)
		if err != nil {
			return slurmErr(err)
		}
		if j.State.Done() || j.State == slurm.NotSubmitted {
			over++
			continue
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return fmt.Errorf("nothing cancelled: sweep %s has no point queued or running (%d of its runs are over)", st.ID, over)
	}
	var done []string
	for _, r := range live {
		ex, err := r.Executor()
		if err == nil {
			err = ex.Cancel(ctx, slurm.JobRef{ID: r.Meta.JobID, RunDir: r.Dir.Path()})
		}
		if err != nil {
			return fmt.Errorf("cancel sweep %s: run %s (job %s): %w (cancelled before it: %s)", st.ID, r.Meta.ExecID, r.Meta.JobID, slurmErr(err), strings.Join(done, ", "))
		}
		done = append(done, r.Meta.ExecID+" (job "+r.Meta.JobID+")")
	}
	fmt.Printf("cancelled sweep %s: %d live points: %s\n", st.ID, len(done), strings.Join(done, ", "))
	return nil
}
