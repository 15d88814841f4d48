package sweep

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
)

// Member is a point of the grid that runs: its index in State.Points, its
// run (a run dir with its job script and meta.json, written) and that
// run's own job, which the Local executor runs.
type Member struct {
	Index int
	Run   slurm.Run
	Spec  slurm.JobSpec
}

// SubmitArray submits st's job array through ex: spec (ArraySpec) with its
// script, written to the sweep directory d. sweep.json is written before
// (the tasks read it) and after; each member's array task id (<A>_<a>,
// slurm.ArrayTaskID) goes into st, into its meta.json, and its logs become
// links to the array's. It returns the array's job id.
func SubmitArray(ctx context.Context, ex slurm.Executor, d rundir.Dir, st *State, spec slurm.JobSpec, script []byte, members []Member) (string, error) {
	if err := atomicfile.WriteFile(d.Script(), script, 0o755); err != nil {
		return "", err
	}
	if err := Write(d, st); err != nil {
		return "", err
	}
	jobID, _, err := ex.Submit(ctx, slurm.Submission{Spec: spec, Script: d.Script()})
	if err != nil {
		return "", fmt.Errorf("submit sweep %s: %w", st.ID, err)
	}
	st.JobID = jobID
	for i, m := range members {
		task := slurm.ArrayTaskID(jobID, i)
		st.Points[m.Index].JobID = task
		m.Run.Meta.JobID, m.Run.Meta.Sweep = task, st.ID
		if err := slurm.WriteMeta(m.Run.Dir, m.Run.Meta); err != nil {
			return jobID, err
		}
		_ = rundir.LinkLogs(d, m.Run.Dir, task, task) // best effort: logs finds the sweep's too
	}
	return jobID, Write(d, st)
}

// RunLocal runs the members one after another through ex (the Local
// executor), each its own job in its run dir, waiting for each with wait;
// w gets a line a point. sweep.json and each meta.json follow along.
func RunLocal(ctx context.Context, w io.Writer, ex slurm.Executor, d rundir.Dir, st *State, members []Member, wait func(context.Context, slurm.Run) (slurm.JobInfo, error)) error {
	st.WritePlan(w)
	fmt.Fprintf(w, "sweep %s: %d points one after another on this machine (local executor)\n", st.ID, len(members))
	for _, m := range members {
		pt, meta := &st.Points[m.Index], m.Run.Meta
		jobID, _, err := ex.Submit(ctx, slurm.Submission{Spec: m.Spec, Script: m.Run.Dir.Script()})
		meta.JobID = jobID
		if err != nil {
			meta.SubmitError = err.Error()
		}
		pt.JobID = jobID
		if werr := errors.Join(slurm.WriteMeta(m.Run.Dir, meta), Write(d, st)); werr != nil {
			return werr
		}
		if err != nil {
			return fmt.Errorf("sweep %s: submit %s: %w", st.ID, pt.Label, err)
		}
		j, err := wait(ctx, m.Run)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %s: run %s %s after %s\n", pt.Label, pt.ExecID, j.State, slurm.FormatElapsed(j.Elapsed))
	}
	fmt.Fprintf(w, "sweep %s done: hpcrun sweep show %s\n", st.ID, st.ID)
	return nil
}
