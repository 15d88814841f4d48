package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// A sweep lives in runs/sweeps/<sweepid>/, a directory named like a run:
//
//	runs/sweeps/<sweepid>/sweep.json          the grid, each point's run and plan
//	runs/sweeps/<sweepid>/job.sbatch          the job array
//	runs/sweeps/<sweepid>/slurm-<A>_<a>.out   the array's logs (.err: errors)
//
// Each point that runs is a normal run dir runs/<execid>/ beside the
// sweeps folder; its logs are links to the sweep's (LinkLogs).
const (
	SweepsDir = "sweeps"
	SweepFile = "sweep.json"
)

// Sweeps is the folder of the sweeps of runsDir; Find and List take it as
// they take runsDir.
func Sweeps(runsDir string) string { return filepath.Join(runsDir, SweepsDir) }

// NewSweep creates a sweep directory under runsDir's sweeps folder with a
// fresh id, made as New makes an execid.
func NewSweep(runsDir string, now time.Time) (Dir, error) { return New(Sweeps(runsDir), now) }

// Sweep is the path of sweep.json in the sweep directory d.
func (d Dir) Sweep() string { return filepath.Join(string(d), SweepFile) }

// Point is the run dir with execid of the sweep directory d: it lives in
// the runs folder that holds d's sweeps folder.
func (d Dir) Point(execID string) Dir {
	return Dir(filepath.Join(filepath.Dir(filepath.Dir(string(d))), execID))
}

// LinkLogs makes run's logs of job id (Log(id, ...)) links to the sweep's
// array logs of task, so that whoever looks in run finds them. A link
// that exists already is kept.
func LinkLogs(sweep, run Dir, id, task string) error {
	var errs []error
	for _, errStream := range []bool{false, true} {
		if err := os.Symlink(sweep.Log(task, errStream), run.Log(id, errStream)); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
