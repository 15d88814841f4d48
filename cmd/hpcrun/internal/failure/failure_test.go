package failure

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// TestRecordedRuns classifies every run under testdata from its files, as
// hpcrun queue, metrics and serve do.
func TestRecordedRuns(t *testing.T) {
	tests := []struct {
		dir  string
		want Class
		why  string // a part of the deciding line
	}{
		{"completed", None, ""},
		{"cancelled", Cancelled, "state CANCELLED"},
		{"timelimit", TimeLimit, "state TIMEOUT, reason TimeLimit"},
		{"lostrank", Killed, "rank 2 wrote no end line: srun: error: vm: task 2: Killed"},
		{"dataerror", DataConfig, "data: open /data/d.csv"},
		{"oom", OutOfMemory, "out of memory: cannot allocate"},
		{"preempted", Preempted, "state PREEMPTED"},
		{"nodefail", NodeFailure, "state NODE_FAIL"},
		{"oom-cgroup", OutOfMemory, "state OUT_OF_MEMORY"},
		{"oom-killed", OutOfMemory, "Out Of Memory"},
		{"commtimeout", CommLost, "timed out after 5m0s"},
		{"unknown", Unknown, "state FAILED"},
		{"killed-ranks", Killed, "2 ranks wrote no end line, the first rank 0: srun: error: n1: tasks 0-1: Killed"},
		{"killed-srun", Killed, "Killed                  srun hpcrun train"},
	}
	seen := map[Class]bool{}
	for _, tt := range tests {
		d := rundir.Dir(filepath.Join("testdata", tt.dir))
		m, err := slurm.ReadMeta(d)
		if err != nil {
			t.Fatal(err)
		}
		if m.Final == nil {
			t.Fatalf("%s: meta.json has no final state", tt.dir)
		}
		got := Of(d, *m.Final)
		if got.Class != tt.want || !strings.Contains(got.Why, tt.why) {
			t.Errorf("%s: %q (%s), want %q with %q", tt.dir, got.Class, got.Why, tt.want, tt.why)
		}
		seen[got.Class] = true
	}
	for _, c := range Classes {
		if !seen[c] {
			t.Errorf("no recorded run is classed %q", c)
		}
	}
}

func TestClassifyWithoutAnEnd(t *testing.T) {
	tests := []struct {
		name string
		e    Evidence
		want Class
	}{
		{"running", Evidence{Job: slurm.JobInfo{State: slurm.Running}, RunStatus: "", Log: "out of memory"}, None},
		{"pending", Evidence{Job: slurm.JobInfo{State: slurm.Pending, Reason: "Priority"}}, None},
		{"completed", Evidence{Job: slurm.JobInfo{State: slurm.Completed}, RunStatus: "completed"}, None},
		{"completed but a rank failed", Evidence{Job: slurm.JobInfo{State: slurm.Completed}, RunStatus: "failed", RunError: "rank 0: data: empty"}, DataConfig},
		{"no scheduler state, interrupted", Evidence{RunStatus: "interrupted", RunError: "rank 0: step 5 of 100, checkpoint saved: stopped on request"}, Cancelled},
		{"no scheduler state, Ctrl-C", Evidence{RunStatus: "interrupted", RunError: "rank 0: step 5 of 100, checkpoint saved: stopped by SIGINT (Ctrl-C)"}, Cancelled},
		{"no scheduler state, the time limit", Evidence{RunStatus: "interrupted", RunError: "rank 0: step 5 of 100, checkpoint saved: stopped by SIGTERM: the job's time limit reached"}, TimeLimit},
		{"no scheduler state, no end", Evidence{}, None},
		{"forgotten job that failed", Evidence{Job: slurm.JobInfo{State: slurm.Unknown}, RunStatus: "failed", RunError: "rank 1: NaN"}, Unknown},
		{"CUDA out of memory", Evidence{Job: slurm.JobInfo{State: slurm.Failed}, RunError: "rank 3: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY"}, OutOfMemory},
		{"config key", Evidence{Job: slurm.JobInfo{State: slurm.Failed}, RunError: "rank 0: training config train.toml: unknown key(s) lrr"}, DataConfig},
		{"program missing", Evidence{Job: slurm.JobInfo{State: slurm.Failed}, Log: "slurmstepd: error: execve(): hpcrun: No such file or directory"}, DataConfig},
		{"deadline", Evidence{Job: slurm.JobInfo{State: "DEADLINE"}}, TimeLimit},
		{"boot failure", Evidence{Job: slurm.JobInfo{State: "BOOT_FAIL"}}, NodeFailure},
	}
	for _, tt := range tests {
		if got := Classify(tt.e); got.Class != tt.want {
			t.Errorf("%s: %q (%s), want %q", tt.name, got.Class, got.Why, tt.want)
		}
	}
}

// A Go runtime's fatal error is at the head of a long stderr, slurmstepd's
// verdict at its tail: both are read, not the middle.
func TestGatherReadsHeadAndTail(t *testing.T) {
	d := rundir.Dir(t.TempDir())
	var b strings.Builder
	b.WriteString("fatal error: out of memory\n")
	for b.Len() < 200<<10 {
		b.WriteString("\truntime.mallocgc(0x1000000, 0xa8b8a0, 0x1) timed out\n")
	}
	b.WriteString("slurmstepd: error: *** JOB 7 ON vm CANCELLED AT 2026-11-23T13:34:19 DUE TO TIME LIMIT ***\n")
	if err := os.WriteFile(d.Log("7", true), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	e := Gather(d, slurm.JobInfo{ID: "7", State: slurm.Failed})
	if len(e.Log) > logHead+logTail+1 {
		t.Errorf("read %d bytes of the log, want at most %d", len(e.Log), logHead+logTail+1)
	}
	if !strings.HasPrefix(e.Log, "fatal error") || !strings.Contains(e.Log, "DUE TO TIME LIMIT") {
		t.Errorf("log evidence lacks the head or the tail")
	}
	if got := Classify(e); got.Class != OutOfMemory {
		t.Errorf("class %q, want %q: the memory error comes before the time limit", got.Class, OutOfMemory)
	}
}

// TestSettle reads the job's state cached in meta.json: a job that ran out
// of memory is one, whatever its files say; a run without meta.json and
// whose files show nothing wrong is no failure.
func TestSettle(t *testing.T) {
	d, err := rundir.New(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if v := Settle(context.Background(), d, &metrics.Summary{Status: metrics.StatusCompleted}); v.Class != None {
		t.Errorf("no meta.json: %+v", v)
	}
	m := &slurm.Meta{ExecID: d.ExecID(), JobID: "7", Final: &slurm.JobInfo{ID: "7", State: "OUT_OF_MEMORY"}}
	if err := slurm.WriteMeta(d, m); err != nil {
		t.Fatal(err)
	}
	if v := Settle(context.Background(), d, &metrics.Summary{Status: "failed"}); v.Class != OutOfMemory {
		t.Errorf("a job that ran out of memory: %+v", v)
	}
}

// RunState says a run's state in a word or two from its cached final job
// state and its summary.
func TestRunState(t *testing.T) {
	d, err := rundir.New(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s := RunState(ctx, d, "", metrics.Summary{}); s != "no meta.json" {
		t.Errorf("no meta.json: %q", s)
	}
	for _, c := range []struct {
		state slurm.State
		want  string
	}{{"OUT_OF_MEMORY", "OOM"}, {"COMPLETED", "done"}, {"TIMEOUT", "time limit"}, {"CANCELLED", "failed (cancelled)"}} {
		m := &slurm.Meta{ExecID: d.ExecID(), Executor: "slurm", JobID: "7", Final: &slurm.JobInfo{ID: "7", State: c.state}}
		if err := slurm.WriteMeta(d, m); err != nil {
			t.Fatal(err)
		}
		if s := RunState(ctx, d, "7_0", metrics.Summary{}); s != c.want {
			t.Errorf("final %s: %q, want %q", c.state, s, c.want)
		}
	}
}
