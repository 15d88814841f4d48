package slurm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// fakeSqueue puts on PATH, alone, an squeue that runs the shell's body.
func fakeSqueue(t *testing.T, body string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "squeue"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
}

// queueRuns makes one run of each kind ListQueue tells apart, oldest
// first: a Slurm job without a final state (job 101), one with it, a Local
// job that failed, a submission that failed, a live run of hpcrun run, and
// a run whose meta.json is not JSON.
func queueRuns(t *testing.T) string {
	t.Helper()
	runs := t.TempDir()
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	next := func() time.Time { at = at.Add(time.Second); return at }
	newRun(t, runs, next(), Meta{Executor: "slurm", JobID: "101", Spec: JobSpec{Name: "train-a"}})
	newRun(t, runs, next(), Meta{Executor: "slurm", JobID: "102", Spec: JobSpec{Name: "train-b"}, Final: &JobInfo{ID: "102", State: Completed, Nodes: 2, NodeList: "n[1-2]"}})
	r := newRun(t, runs, next(), Meta{Executor: "local", JobID: deadPid, Spec: JobSpec{Name: "check"}})
	endLocal(t, r.Dir, Failed, 3)
	newRun(t, runs, next(), Meta{Executor: "slurm", Spec: JobSpec{Name: "train-c"}, SubmitError: "sbatch: error: bad\nmore"})
	newRun(t, runs, next(), Meta{Executor: "run", JobID: strconv.Itoa(os.Getpid()), Host: Host(), Spec: JobSpec{Name: "train-d"}, SubmitTime: time.Now()})
	d, err := rundir.New(runs, next())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(d.Meta(), []byte("{"), 0o644)
	return runs
}

// failed is a failure classifier that names every failed job.
func failed(_ rundir.Dir, j JobInfo) string {
	if j.State == Failed {
		return "boom"
	}
	return ""
}

// brief is the part of a row a test compares.
type brief struct {
	name, job string
	state     State
	reason    string
	failure   string
}

func briefs(rows []QueueRow) []brief {
	var b []brief
	for _, r := range rows {
		b = append(b, brief{r.Name, r.JobID, r.State, r.Reason, r.Failure})
	}
	return b
}

func sameRows(t *testing.T, what string, rows []QueueRow, want []brief) {
	t.Helper()
	got := briefs(rows)
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows %+v, want %d %+v", what, len(got), got, len(want), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: row %d is %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

func TestListQueueWithoutSlurm(t *testing.T) {
	runs := queueRuns(t)
	t.Setenv("PATH", t.TempDir())
	ctx := context.Background()
	rows, err := ListQueue(ctx, runs, QueueQuery{Failure: failed})
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, "live runs", rows, []brief{{"train-d", strconv.Itoa(os.Getpid()), Running, "", ""}})

	rows, err = ListQueue(ctx, runs, QueueQuery{All: true, Failure: failed})
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, "all", rows, []brief{
		{"train-a", "101", Unknown, "no Slurm commands on this machine", ""},
		{"train-b", "102", Completed, "", ""},
		{"check", deadPid, Failed, "NonZeroExitCode", "boom"},
		{"train-c", "", NotSubmitted, "sbatch: error: bad\nmore", ""},
		{"train-d", strconv.Itoa(os.Getpid()), Running, "", ""},
		{"?", "?", Unknown, "unreadable meta.json: unexpected end of JSON input", ""},
	})
	if r := rows[3]; r.Elapsed != "-" || r.Nodes != 0 {
		t.Errorf("a submission that failed: elapsed %q, %d nodes; want -, 0", r.Elapsed, r.Nodes)
	}
	if r := rows[1]; r.Nodes != 2 || r.NodeList != "n[1-2]" || r.Executor != "slurm" || r.ExecID == "" || r.RunDir == "" {
		t.Errorf("a finished Slurm run: %+v", r)
	}
	if r := rows[2]; r.Nodes != 1 || r.Elapsed != FormatElapsed(time.Minute) {
		t.Errorf("a finished Local run: %+v", r)
	}

	rows, _ = ListQueue(ctx, runs, QueueQuery{All: true, Name: "train-"})
	if len(rows) != 4 {
		t.Errorf("--name train-: %+v, want the 4 train- runs", briefs(rows))
	}
}

func TestListQueueJoinsSqueue(t *testing.T) {
	runs := queueRuns(t)
	fakeSqueue(t, `printf '101|RUNNING|1:05|2|debug|5:00|2026-11-25T10:00:01|n[1-2]\037\037(null)\037train-a\n303|PENDING|0:00|1|debug|5:00|2026-11-25T10:00:02|(Resources)\037/y\037(null)\037other\n'`)
	rows, err := ListQueue(context.Background(), runs, QueueQuery{})
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, "queue", rows, []brief{
		{"train-a", "101", Running, "", ""},
		{"train-d", strconv.Itoa(os.Getpid()), Running, "", ""},
		{"other", "303", Pending, "Resources", ""},
	})
	if r := rows[0]; r.NodeList != "n[1-2]" || r.Nodes != 2 || r.Elapsed != "1:05" || r.ExecID == "" {
		t.Errorf("the run squeue lists: %+v", r)
	}
	if r := rows[2]; r.ExecID != "" || r.RunDir != "" || r.Executor != "slurm" {
		t.Errorf("a job no run submitted: %+v", r)
	}
}

// A job id the cluster reused (its counter was reset, or wrapped) is not
// the run's: the stranger's job, tagged for another run or submitted from
// another folder, is listed as the user's own, not as the run.
func TestListQueueNeverShowsAStrangersJobAsTheRun(t *testing.T) {
	runs := queueRuns(t)
	fakeSqueue(t, `printf '101|RUNNING|1:05|2|debug|5:00|2026-11-25T10:00:30|n[1-2]\037/elsewhere\037hpcrun:20261125-100030-beef\037train-a\n'`)
	rows, err := ListQueue(context.Background(), runs, QueueQuery{})
	if err != nil {
		t.Fatal(err)
	}
	sameRows(t, "queue", rows, []brief{
		{"train-d", strconv.Itoa(os.Getpid()), Running, "", ""},
		{"train-a", "101", Running, "", ""},
	})
	if rows[1].ExecID != "" {
		t.Errorf("the stranger's job is shown as run %s", rows[1].ExecID)
	}
	rows, _ = ListQueue(context.Background(), runs, QueueQuery{All: true})
	if r := rows[0]; r.ExecID == "" || r.State != Unknown || !strings.Contains(r.Reason, "reused") {
		t.Errorf("queue --all: the run whose job id was reused: %+v, want UNKNOWN saying the id was reused", r)
	}
}

func TestListQueueSlurmUnreachable(t *testing.T) {
	runs := queueRuns(t)
	fakeSqueue(t, `echo "squeue: error: Unable to contact slurm controller (connect failure)" >&2; exit 1`)
	var warned []error
	q := QueueQuery{Warn: func(err error) { warned = append(warned, err) }}
	rows, err := ListQueue(context.Background(), runs, q)
	if err != nil || len(rows) != 1 || len(warned) != 1 || !errors.Is(warned[0], ErrNoSlurm) {
		t.Errorf("live runs: %+v, %v, warned %v; want the foreground run, no error, one warning", briefs(rows), err, warned)
	}
	q.All = true
	rows, err = ListQueue(context.Background(), runs, q)
	if !errors.Is(err, ErrNoSlurm) || len(rows) != 6 || rows[0].State != Unknown || rows[0].Reason != "Slurm not reachable" {
		t.Errorf("all: %+v, %v; want 6 rows, the first unknown, and ErrNoSlurm", briefs(rows), err)
	}
}
