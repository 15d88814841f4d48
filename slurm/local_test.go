package slurm

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// TestMain lets this test binary serve as the Local executor's srun, as
// hpcrun's own binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == SrunCommand {
		os.Exit(LocalSrun(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// localJob renders a script whose srun starts prog (a bash snippet) on every
// task and submits it to the Local executor.
func localJob(t *testing.T, ntasks int, prog string) (JobRef, string) {
	t.Helper()
	dir := t.TempDir()
	progPath := filepath.Join(dir, "prog")
	if err := os.WriteFile(progPath, []byte("#!/bin/bash\n"+prog), 0o755); err != nil {
		t.Fatal(err)
	}
	s := validSpec()
	s.RunDir, s.NTasks, s.GPUsPerNode, s.CPUsPerTask = dir, ntasks, 0, 1
	s.Program, s.Args = progPath, []string{"arg one"}
	script, err := Script(s, "", "dev", "x")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "job.sbatch")
	os.WriteFile(path, script, 0o644)
	l := &Local{}
	id, _, err := l.Submit(context.Background(), Submission{Spec: s, Script: path})
	if err != nil {
		t.Fatal(err)
	}
	return JobRef{ID: id, RunDir: dir}, dir
}

func waitLocal(t *testing.T, ref JobRef) JobInfo {
	t.Helper()
	l := &Local{}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		j, err := l.Status(context.Background(), ref)
		if err != nil {
			t.Fatal(err)
		}
		if j.State.Done() {
			return j
		}
	}
	st, _ := os.ReadFile(filepath.Join(ref.RunDir, rundir.LocalDir, "state"))
	errs, _ := os.ReadFile(filepath.Join(ref.RunDir, "slurm-"+ref.ID+".err"))
	t.Fatalf("local job did not finish in 20 s; state:\n%s\nstderr:\n%s", st, errs)
	return JobInfo{}
}

func TestLocalTasksSeeSrunVariables(t *testing.T) {
	ref, dir := localJob(t, 4, `echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NTASKS $SLURM_NODEID $SLURM_STEP_ID $SLURM_JOB_ID $SLURM_JOB_NODELIST $1"`)
	j := waitLocal(t, ref)
	if j.State != Completed || j.ExitCode != 0 {
		t.Fatalf("job = %+v", j)
	}
	out, err := os.ReadFile(filepath.Join(dir, "slurm-"+ref.ID+".out"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	sort.Strings(lines)
	host := shortHost()
	for i, l := range lines {
		want := strings.Join([]string{itoa(i), itoa(i), "4", "0", "0", ref.ID, host, "arg one"}, " ")
		if l != want {
			t.Errorf("task line %q, want %q", l, want)
		}
	}
	if len(lines) != 4 {
		t.Errorf("%d task lines, want 4:\n%s", len(lines), out)
	}
}

// TestLocalJobThatEndsIsNeverSeenDying polls jobs that end at once as
// fast as it can: a poll that read the state before the supervisor
// recorded the end, and saw the supervisor gone after, must not call the
// job failed. 60 jobs; 10 under -short (make test's race-detector pass,
// where each job's spin of polls takes a second).
func TestLocalJobThatEndsIsNeverSeenDying(t *testing.T) {
	l := &Local{}
	jobs := 60
	if testing.Short() {
		jobs = 10
	}
	for i := 0; i < jobs; i++ {
		ref, _ := localJob(t, 1, `true`)
		for deadline := time.Now().Add(20 * time.Second); ; {
			if time.Now().After(deadline) {
				t.Fatalf("job %d did not end in 20 s", i)
			}
			j, err := l.Status(context.Background(), ref)
			if err != nil {
				t.Fatal(err)
			}
			if j.State.Done() {
				if j.State != Completed {
					t.Fatalf("job %d: %+v, want COMPLETED", i, j)
				}
				break
			}
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestLocalFailingTaskFailsJob(t *testing.T) {
	ref, dir := localJob(t, 3, `if [ "$SLURM_PROCID" = 1 ]; then echo boom >&2; exit 7; fi; sleep 30`)
	start := time.Now()
	j := waitLocal(t, ref)
	if j.State != Failed || j.ExitCode != 7 {
		t.Errorf("job = %+v, want FAILED with exit 7", j)
	}
	if time.Since(start) > 15*time.Second {
		t.Errorf("the other tasks were not stopped: took %v", time.Since(start))
	}
	errs, _ := os.ReadFile(filepath.Join(dir, "slurm-"+ref.ID+".err"))
	if !strings.Contains(string(errs), "boom") || !strings.Contains(string(errs), "task 1: exited with status 7") {
		t.Errorf("stderr = %q", errs)
	}
}

func TestLocalCancel(t *testing.T) {
	ref, _ := localJob(t, 2, `sleep 60`)
	l := &Local{}
	for i := 0; ; i++ {
		j, _ := l.Status(context.Background(), ref)
		if j.State == Running {
			break
		}
		if i > 500 {
			t.Fatalf("never running: %+v", j)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.Cancel(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	j := waitLocal(t, ref)
	if j.State != Cancelled {
		t.Errorf("job = %+v, want CANCELLED", j)
	}
	if err := l.Cancel(context.Background(), ref); err == nil || !strings.Contains(err.Error(), "already over") {
		t.Errorf("second cancel: %v", err)
	}
}

// Cancel returns once every process of the job has exited, not when the
// job script has: a task that takes a second to stop after TERM (a rank
// saving its checkpoint) has written its last file by then.
func TestLocalCancelWaitsForTheTasks(t *testing.T) {
	ref, dir := localJob(t, 1, `late="$(dirname "$0")/late"
trap 'sleep 1; echo stopped > "$late"; exit 0' TERM
sleep 60 &
wait`)
	l := &Local{}
	for i := 0; ; i++ {
		if j, _ := l.Status(context.Background(), ref); j.State == Running {
			break
		}
		if i > 500 {
			t.Fatal("never running")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // the task's trap is set
	if err := l.Cancel(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "late")); err != nil || string(b) != "stopped\n" {
		t.Errorf("Cancel returned before the task stopped: %q, %v", b, err)
	}
}

func TestLocalOtherHost(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, rundir.LocalDir), 0o755)
	os.WriteFile(filepath.Join(dir, rundir.LocalDir, "state"), []byte("jobid=1\nhost=elsewhere\nstate=RUNNING\n"), 0o644)
	_, err := (&Local{}).Status(context.Background(), JobRef{ID: "1", RunDir: dir})
	if err == nil || !strings.Contains(err.Error(), "on elsewhere") {
		t.Errorf("err = %v", err)
	}
}
