package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

// runsDir is the absolute runs directory of the resolved config.
func runsDir(c *cli.Context) (string, error) {
	cfg, err := resolveConfig(c)
	if err != nil {
		return "", err
	}
	return filepath.Abs(cfg.RunsDir)
}

// findRun resolves the one argument (an execid, a unique prefix of one, or
// a job id: rundir.Find's forms, as every command takes them) to its run.
func findRun(c *cli.Context, usage string) (slurm.Run, error) {
	if c.NArg() != 1 {
		return slurm.Run{}, cli.Exit(fmt.Sprintf("usage: hpcrun %s", usage), 2)
	}
	dir, err := runsDir(c)
	if err != nil {
		return slurm.Run{}, err
	}
	r, err := slurm.OpenRun(dir, c.Args().First())
	return r, sweepHint(dir, c.Args().First(), err)
}

// findRef is rundir.Find, and when ref is a sweep's job array, an error
// that says so.
func findRef(runs, ref string) (rundir.Run, error) {
	r, err := rundir.Find(runs, ref)
	return r, sweepHint(runs, ref, err)
}

// sweepHint turns a run not found because ref is the job id of a sweep's
// job array into an error pointing at hpcrun sweep show.
func sweepHint(runs, ref string, err error) error {
	if errors.Is(err, rundir.ErrNotFound) {
		if st, ok := sweep.OfJob(runs, ref); ok {
			return fmt.Errorf("job %s is the job array of sweep %s, not one run: hpcrun sweep show %s lists its points and their execids: %w", st.JobID, st.ID, st.ID, rundir.ErrNotFound)
		}
	}
	return err
}

// isCheck reports whether a run's job runs a parallel check (submit
// --check) rather than a training.
func isCheck(m *slurm.Meta) bool {
	return len(m.Spec.Args) > 0 && m.Spec.Args[0] == "check"
}

// exitWith turns a finished job's state into hpcrun's exit status
// (slurm.JobInfo.ExitStatus).
func exitWith(j slurm.JobInfo, execID string) error {
	if code, msg := j.ExitStatus(execID); code != 0 {
		return cli.Exit(msg, code)
	}
	return nil
}

// slurmErr adds one line of advice when the controller cannot be reached.
func slurmErr(err error) error {
	if errors.Is(err, slurm.ErrNoSlurm) {
		return fmt.Errorf("%v (is slurmctld running? for the local test cluster: sudo scripts/slurm-local.sh up)", err)
	}
	return err
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
