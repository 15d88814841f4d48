package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func rmCommand() *cli.Command {
	return &cli.Command{
		Name:      "rm",
		Usage:     "remove runs (their folders: metrics, logs, checkpoints) or sweeps",
		ArgsUsage: "<execid|prefix|jobid|sweepid>...",
		Description: "Removes each run's folder from the runs dir, or a sweep's folder with the runs of its\n" +
			"points. A run whose job is still queued or running is refused unless --force (its job\n" +
			"goes on: hpcrun cancel it first).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "remove runs whose job is still queued or running"},
		},
		Action: runRm,
	}
}

func runRm(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("usage: hpcrun rm <execid|prefix|jobid|sweepid>... [--force]", 2)
	}
	runs, err := runsDir(c)
	if err != nil {
		return err
	}
	// Resolve every reference first: a typo removes nothing.
	type target struct {
		what string
		dirs []rundir.Dir // the runs, then the sweep's own folder
	}
	var targets []target
	for _, ref := range c.Args().Slice() {
		if r, err := findRef(runs, ref); err == nil {
			targets = append(targets, target{"run " + r.ExecID, []rundir.Dir{r.Dir}})
			continue
		} else if !errors.Is(err, rundir.ErrNotFound) {
			return err
		}
		s, err := findIn(rundir.Sweeps(runs), ref)
		if err != nil {
			return cli.Exit(fmt.Sprintf("nothing removed: %q is neither a run nor a sweep in %s (hpcrun queue --all lists the runs)", ref, runs), 2)
		}
		st, err := sweep.Read(s.Dir)
		if err != nil {
			return err
		}
		points := st.RunDirs(runs)
		targets = append(targets, target{fmt.Sprintf("sweep %s and its %s", st.ID, units.Count(len(points), "run")), append(points, s.Dir)})
	}
	if !c.Bool("force") {
		for _, t := range targets {
			for _, d := range t.dirs {
				m, err := slurm.ReadMeta(d)
				if err != nil {
					continue // a sweep's folder, or a run never written whole
				}
				if j, err := (slurm.Run{Dir: d, Meta: m}).Status(c.Context); err == nil && !j.State.Done() && j.State != slurm.NotSubmitted {
					return cli.Exit(fmt.Sprintf("nothing removed: %s is %s (job %s): hpcrun cancel %s first, or rm --force (the job goes on)", t.what, j.State, m.JobID, m.ExecID), 2)
				}
			}
		}
	}
	for _, t := range targets {
		for _, d := range t.dirs {
			if err := os.RemoveAll(d.Path()); err != nil {
				return fmt.Errorf("rm %s: %w", t.what, err)
			}
		}
		fmt.Fprintf(c.App.Writer, "removed %s\n", t.what)
	}
	return nil
}
