package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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

// findRun resolves the one argument (an execid, a unique prefix of one, a
// job id, or the run's folder: the forms every command takes) to its run.
func findRun(c *cli.Context, usage string) (slurm.Run, error) {
	if c.NArg() != 1 {
		return slurm.Run{}, cli.Exit(fmt.Sprintf("usage: hpcrun %s", usage), 2)
	}
	dir, err := runsDir(c)
	if err != nil {
		return slurm.Run{}, err
	}
	return openRun(dir, c.Args().First())
}

// openRun is slurm.OpenRun of ref, which may be the run's folder too
// (runRef), and when ref is a sweep's job array, an error that says so.
func openRun(runs, ref string) (slurm.Run, error) {
	id, err := runRef(runs, ref)
	if err != nil {
		return slurm.Run{}, err
	}
	r, err := slurm.OpenRun(runs, id)
	return r, sweepHint(runs, id, err)
}

// findRef is findIn of the runs, and when ref is a sweep's job array, an
// error that says so.
func findRef(runs, ref string) (rundir.Run, error) {
	r, err := findIn(runs, ref)
	return r, sweepHint(runs, ref, err)
}

// findIn is rundir.Find of ref in dir (the runs or the sweeps), ref being
// also the path of its folder there (runRef).
func findIn(dir, ref string) (rundir.Run, error) {
	id, err := runRef(dir, ref)
	if err != nil {
		return rundir.Run{}, err
	}
	return rundir.Find(dir, id)
}

// runRef is ref, or when ref is a path (it has a slash, or is . or ..) the
// name of the folder it names in runs: runs/20261121-143005-a3f9 (or its
// absolute path, with or without a trailing slash) is that execid, as
// ckpt, eval and generate already took it. A path to anything else is an
// error that says which runs dir a run's folder must be in.
func runRef(runs, ref string) (string, error) {
	if !strings.ContainsAny(ref, `/\`) && ref != "." && ref != ".." {
		return ref, nil
	}
	abs, err := filepath.Abs(ref)
	if err != nil {
		return "", err
	}
	parent := filepath.Dir(abs)
	if parent == filepath.Clean(runs) || sameFile(parent, runs) {
		return filepath.Base(abs), nil
	}
	return "", fmt.Errorf("%s is not a run's folder in the runs dir %s (a run is its execid, a prefix of one, its job id or its folder there; --runs-dir names another runs dir): %w", ref, runs, rundir.ErrNotFound)
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
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
