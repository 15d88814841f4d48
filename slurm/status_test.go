package slurm

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// deadPid is a process id no process has (above Linux's pid_max).
const deadPid = "999999999"

// newRun makes a run directory under runs, its execid's time when, with
// meta m.
func newRun(t *testing.T, runs string, when time.Time, m Meta) Run {
	t.Helper()
	d, err := rundir.New(runs, when)
	if err != nil {
		t.Fatal(err)
	}
	m.ExecID = d.ExecID()
	if err := WriteMeta(d, &m); err != nil {
		t.Fatal(err)
	}
	return Run{Dir: d, Meta: &m}
}

// endLocal writes the state a Local job's supervisor leaves once the job
// ended with state and exit status code.
func endLocal(t *testing.T, d rundir.Dir, state State, code int) {
	t.Helper()
	if err := os.MkdirAll(d.Local(), 0o755); err != nil {
		t.Fatal(err)
	}
	st := "jobid=" + deadPid + "\nhost=" + Host() + "\nstate=" + string(state) + "\nstart=100\nend=160\nexit=" + strconv.Itoa(code) + "\n"
	if err := os.WriteFile(filepath.Join(d.Local(), "state"), []byte(st), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRunStatus(t *testing.T) {
	runs := t.TempDir()
	ctx := context.Background()
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	spec := JobSpec{Name: "train"}

	// A final state is the answer, without asking anyone.
	final := &JobInfo{ID: "7", State: Timeout, Reason: "TimeLimit"}
	r := newRun(t, runs, at, Meta{Executor: "slurm", JobID: "7", Spec: spec, Final: final})
	if j, err := r.Status(ctx); err != nil || j != *final {
		t.Errorf("cached final: %+v, %v; want %+v", j, err, *final)
	}

	r = newRun(t, runs, at, Meta{Executor: "slurm", Spec: spec, SubmitError: "sbatch: error: invalid partition"})
	if j, err := r.Status(ctx); err != nil || j.State != NotSubmitted || j.Reason != "sbatch: error: invalid partition" {
		t.Errorf("never submitted: %+v, %v", j, err)
	}

	// A Local job that ended is asked once: its state is cached in meta.json.
	r = newRun(t, runs, at, Meta{Executor: "local", JobID: deadPid, Spec: spec})
	endLocal(t, r.Dir, Failed, 3)
	j, err := r.Status(ctx)
	if err != nil || j.State != Failed || j.ExitCode != 3 || j.Name != "train" || j.Elapsed != time.Minute {
		t.Errorf("local job that failed: %+v, %v", j, err)
	}
	if m, err := ReadMeta(r.Dir); err != nil || m.Final == nil || *m.Final != j {
		t.Errorf("meta.json's final state %+v (%v), want %+v", m.Final, err, j)
	}

	r = newRun(t, runs, at, Meta{Executor: "pbs", JobID: "1", Spec: spec})
	if _, err := r.Status(ctx); err == nil || !strings.Contains(err.Error(), `unknown executor "pbs"`) {
		t.Errorf("unknown executor: %v", err)
	}
	r.Meta.Executor = "run"
	if _, err := r.Executor(); err == nil || !strings.Contains(err.Error(), "in the foreground") {
		t.Errorf("hpcrun run's executor: %v", err)
	}
}

// TestForegroundStatus follows a run of hpcrun run by its launcher's pid,
// on the machine it started on only.
func TestForegroundStatus(t *testing.T) {
	for _, tt := range []struct {
		pid, host string
		want      State
		reason    string
	}{
		{strconv.Itoa(os.Getpid()), "here", Running, ""},
		{deadPid, "here", Failed, "the hpcrun run launcher died"},
		{"", "here", Failed, "the hpcrun run launcher died"},
		{strconv.Itoa(os.Getpid()), "there", Unknown, "started by hpcrun run on there"},
	} {
		// This process started before the run's submit time, as a launcher does.
		r := Run{Meta: &Meta{Executor: "run", JobID: tt.pid, Host: tt.host, Spec: JobSpec{Name: "t"}, SubmitTime: time.Now().Add(-time.Second)}}
		j := foregroundStatus(r, "here")
		if j.State != tt.want || j.Reason != tt.reason || j.Nodes != 1 || j.NodeList != tt.host || j.Source != "run" || j.Elapsed < time.Second {
			t.Errorf("pid %q on %s: %+v; want %s (%q)", tt.pid, tt.host, j, tt.want, tt.reason)
		}
	}
	r := Run{Meta: &Meta{Executor: "run", JobID: strconv.Itoa(os.Getpid()), Host: Host()}}
	if j, err := r.Status(context.Background()); err != nil || j.State != Running {
		t.Errorf("this process as a launcher on this machine: %+v, %v", j, err)
	}

	// A launcher that ended after its meta was read left its final state
	// on disk: that is the answer, not "died".
	final := JobInfo{ID: deadPid, State: Completed, Source: "run"}
	r = newRun(t, t.TempDir(), time.Now(), Meta{Executor: "run", JobID: deadPid, Host: Host(), Final: &final})
	r.Meta.Final = nil
	if j, err := r.Status(context.Background()); err != nil || j != final {
		t.Errorf("launcher that ended after its meta was read: %+v, %v; want %+v", j, err, final)
	}
}

// A run of hpcrun run whose launcher's pid now names a process started
// after the run (a recycled pid) is not going on.
func TestForegroundStatusRecycledPid(t *testing.T) {
	self := Run{Meta: &Meta{ExecID: "20261125-100000-aaaa", Executor: "run", JobID: strconv.Itoa(os.Getpid()), Host: Host(), SubmitTime: time.Now()}}
	if j := foregroundStatus(self, Host()); j.State != Running {
		t.Errorf("this process as the launcher: %s %s, want RUNNING", j.State, j.Reason)
	}
	self.Meta.SubmitTime = time.Now().Add(-time.Hour) // the run is older than this process
	if j := foregroundStatus(self, Host()); j.State != Failed {
		t.Errorf("a pid recycled since the run started: %s, want FAILED", j.State)
	}
}
