package slurm

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// QueueRow is one line of hpcrun queue (and one object of its --json): a
// run of the runs dir with its job's state, or a job of the user's that
// no run there submitted (ExecID and RunDir empty).
type QueueRow struct {
	ExecID   string `json:"execid,omitempty"`
	JobID    string `json:"jobid"`
	Name     string `json:"name"`
	State    State  `json:"state"`
	Elapsed  string `json:"elapsed"`
	Nodes    int    `json:"nodes"`
	NodeList string `json:"nodelist,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Failure  string `json:"failure,omitempty"` // why a run ended badly, from QueueQuery.Failure
	Executor string `json:"executor"`
	RunDir   string `json:"run_dir,omitempty"`
}

// QueueQuery says which rows ListQueue returns and how it fills them.
type QueueQuery struct {
	// All adds the runs whose job is over and those never submitted.
	All bool
	// Name keeps only the rows whose name contains it.
	Name string
	// Failure, when set, names why a run's job ended badly ("" when it
	// did not): QueueRow.Failure.
	Failure func(d rundir.Dir, j JobInfo) string
	// Warn, when set, is told first that squeue cannot reach the
	// controller (an error wrapping ErrNoSlurm): the rows still come.
	Warn func(error)
}

// ListQueue joins the user's jobs in the scheduler's queue (squeue --me,
// when squeue is on PATH) with the runs under runsDir, the Local
// executor's and hpcrun run's included: the runs first, oldest first,
// then the user's other jobs in squeue's order.
//
// When Slurm is unreachable, the rows are still returned, with an error
// wrapping ErrNoSlurm when a Slurm run's state could not be known.
func ListQueue(ctx context.Context, runsDir string, q QueueQuery) (rows []QueueRow, unreachable error) {
	runs, err := ListRuns(runsDir)
	if err != nil {
		return nil, err
	}
	affected := false
	active := map[string]JobInfo{}
	var order []string
	haveSlurm := false
	if _, err := exec.LookPath("squeue"); err == nil {
		haveSlurm = true
		jobs, err := (&Slurm{}).Queue(ctx, false)
		if errors.Is(err, ErrNoSlurm) {
			// Local runs can still be listed; Slurm runs say why their
			// state is unknown, and the caller fails after the table.
			unreachable = err
			if q.Warn != nil {
				q.Warn(err)
			}
			haveSlurm = false
		} else if err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		for _, j := range jobs {
			active[j.ID] = j
			order = append(order, j.ID)
		}
	}
	seen := map[string]bool{}
	for _, r := range runs {
		m := r.Meta
		if r.Err != nil { // listed, flagged, under All: its state is unknown
			if q.All {
				rows = append(rows, QueueRow{ExecID: m.ExecID, JobID: "?", Name: "?", State: Unknown, Nodes: 1,
					Reason: "unreadable meta.json: " + shortErr(strings.TrimPrefix(r.Err.Error(), r.Dir.Meta()+": ")), Executor: "?", RunDir: r.Dir.Path()})
			}
			continue
		}
		row := QueueRow{ExecID: m.ExecID, JobID: m.JobID, Name: m.Spec.Name, Executor: m.Executor, RunDir: r.Dir.Path()}
		var j JobInfo
		switch {
		case m.Executor == "slurm" && m.JobID != "" && active[m.JobID].ID != "" && r.CheckOwner(active[m.JobID]) == nil:
			j = active[m.JobID]
			seen[m.JobID] = true
		case m.Executor == "slurm" && m.JobID != "" && active[m.JobID].ID != "" && m.Final == nil:
			// The id is now another job's (listed below as the user's own);
			// the run's job is over and forgotten.
			if !q.All {
				continue
			}
			j = JobInfo{ID: m.JobID, State: Unknown, Reason: r.CheckOwner(active[m.JobID]).Error()}
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && !q.All:
			continue // not in the queue: over; All says how it ended
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && unreachable != nil:
			j = JobInfo{ID: m.JobID, State: Unknown, Reason: "Slurm not reachable"}
			affected = true
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && !haveSlurm:
			j = JobInfo{ID: m.JobID, State: Unknown, Reason: "no Slurm commands on this machine"}
		default:
			if j, err = r.Status(ctx); err != nil {
				if errors.Is(err, ErrNoSlurm) {
					unreachable, affected = err, true
				}
				j = JobInfo{ID: m.JobID, State: Unknown, Reason: err.Error()}
			}
		}
		if (j.State.Done() || j.State == NotSubmitted) && !q.All {
			continue
		}
		row.State, row.Elapsed, row.Nodes, row.NodeList, row.Reason = j.State, FormatElapsed(j.Elapsed), j.Nodes, j.NodeList, j.Reason
		if row.Nodes == 0 && j.State != NotSubmitted {
			row.Nodes = 1 // a local run, on this machine
		}
		if j.State == NotSubmitted {
			row.Elapsed = "-"
		}
		if q.Failure != nil {
			row.Failure = q.Failure(r.Dir, j)
		}
		rows = append(rows, row)
	}
	for _, id := range order { // the user's jobs that hpcrun did not submit here
		if seen[id] {
			continue
		}
		j := active[id]
		rows = append(rows, QueueRow{JobID: id, Name: j.Name, State: j.State, Elapsed: FormatElapsed(j.Elapsed),
			Nodes: j.Nodes, NodeList: j.NodeList, Reason: j.Reason, Executor: "slurm"})
	}
	if q.Name != "" {
		kept := rows[:0]
		for _, r := range rows {
			if strings.Contains(r.Name, q.Name) {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if !affected {
		unreachable = nil
	}
	return rows, unreachable
}

// shortErr is an error's text, cut to one short line for a table.
func shortErr(msg string) string {
	s := firstLine(msg)
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
