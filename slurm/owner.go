package slurm

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// tagPrefix starts the comment that Submit gives every job (JobTag).
const tagPrefix = "hpcrun:"

// submitSkew is how far a job's submit time, on the controller's clock,
// may come before the run's, on the submitting machine's.
const submitSkew = 5 * time.Minute

// JobTag is the comment Submit gives a job: it names the directory the job
// was submitted from (a run's execid, or a sweep's id for its job array),
// so that a job id the cluster has reused is never taken for the run's.
func JobTag(submitDir string) string { return tagPrefix + filepath.Base(submitDir) }

// submitDir is the directory r's job was submitted from: the run dir, or
// for a point of a sweep the sweep's directory beside it.
func (r Run) submitDir() string {
	if r.Meta.Sweep != "" {
		return filepath.Join(rundir.Sweeps(filepath.Dir(r.Dir.Path())), r.Meta.Sweep)
	}
	return r.Dir.Path()
}

// CheckOwner says why j, the scheduler's answer for r's job id, is not r's
// job (nil when it is, or when the scheduler gave nothing to tell them
// apart by): its comment tag, its work directory and its submit time must
// all agree with the run.
func (r Run) CheckOwner(j JobInfo) error {
	want := r.submitDir()
	arrayTask := strings.Contains(r.Meta.JobID, "_")
	switch tag := JobTag(want); {
	case j.Comment == "" || j.Comment == "(null)":
	case strings.HasPrefix(j.Comment, tagPrefix):
		if j.Comment != tag && !(arrayTask && r.Meta.Sweep == "" && rundir.IsExecID(strings.TrimPrefix(j.Comment, tagPrefix))) {
			return fmt.Errorf("job %s is tagged %s, not %s: the cluster reused the job id", j.ID, j.Comment, tag)
		}
	default:
		return fmt.Errorf("job %s has the comment %q, not hpcrun's tag %s: it is another job with a reused id", j.ID, j.Comment, tag)
	}
	if j.WorkDir != "" && !samePath(j.WorkDir, want) && !(arrayTask && r.Meta.Sweep == "" && samePath(filepath.Dir(j.WorkDir), rundir.Sweeps(filepath.Dir(r.Dir.Path())))) {
		return fmt.Errorf("job %s was submitted from %s, not from %s: it is another job with a reused id", j.ID, j.WorkDir, want)
	}
	if !j.SubmitTime.IsZero() && !r.Meta.SubmitTime.IsZero() && j.SubmitTime.Before(r.Meta.SubmitTime.Add(-submitSkew)) {
		return fmt.Errorf("job %s was submitted at %s, before run %s was (%s): it is another job with the same id",
			j.ID, j.SubmitTime.Format(time.DateTime), r.Meta.ExecID, r.Meta.SubmitTime.Local().Format(time.DateTime))
	}
	return nil
}

// samePath reports whether a and b name the same directory, through
// symbolic links (the controller records the path the shell resolved).
func samePath(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}
