package slurm

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseSrunArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		def  string
		n    int
		prog []string
		err  string
	}{
		{[]string{"prog", "-n", "3"}, "4", 4, []string{"prog", "-n", "3"}, ""},
		{[]string{"-n", "2", "prog"}, "4", 2, []string{"prog"}, ""},
		{[]string{"-n3", "--mpi=none", "prog", "a"}, "", 3, []string{"prog", "a"}, ""},
		{[]string{"--ntasks=5", "--", "-prog"}, "", 5, []string{"-prog"}, ""},
		{[]string{"--ntasks", "6", "prog"}, "", 6, []string{"prog"}, ""},
		{[]string{"-n", "0", "prog"}, "", 0, nil, "invalid number"},
		{[]string{"-n", "x", "prog"}, "", 0, nil, "invalid number"},
		{[]string{"-n", "2"}, "", 0, nil, "no command"},
		{[]string{"-n"}, "", 0, nil, "needs a number"},
	} {
		n, prog, err := parseSrunArgs(tc.args, tc.def)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err = %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || n != tc.n || !reflect.DeepEqual(prog, tc.prog) {
			t.Errorf("%q: %d %q %v, want %d %q", tc.args, n, prog, err, tc.n, tc.prog)
		}
	}
}

func TestTasksRunPassesRankAndStopsOthersAfterGrace(t *testing.T) {
	dir := t.TempDir()
	tasks := Tasks{N: 3, Program: "/bin/sh", Grace: 100 * time.Millisecond,
		Args: []string{"-c", `echo $RANK > "` + dir + `/$RANK"; [ "$RANK" = 2 ] && exit 3; sleep 30`},
		Vars: TorchrunVars(3, 1234, "r", "run")}
	start := time.Now()
	failed, err := tasks.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("tasks not stopped after the grace period: %v", time.Since(start))
	}
	if len(failed) != 3 || failed[0].Rank != 2 || failed[0].ExitCode() != 3 || failed[0].Stopped || !failed[1].Stopped {
		t.Fatalf("failed = %+v: want rank 2 (exit 3) first, then the two stopped", failed)
	}
	if failed[1].ExitCode() != 128+15 {
		t.Errorf("stopped task exit %d, want 143 (TERM)", failed[1].ExitCode())
	}
	for r := range 3 {
		if b, _ := os.ReadFile(filepath.Join(dir, itoa(r))); strings.TrimSpace(string(b)) != itoa(r) {
			t.Errorf("task %d saw RANK %q", r, b)
		}
	}
}

func TestRequeueNeverRunsOutsideSlurm(t *testing.T) {
	// A scontrol that records its arguments: Requeue must not run it for
	// the Local executor or hpcrun run, whatever SLURM_JOB_ID says.
	bin := t.TempDir()
	marker := filepath.Join(bin, "called")
	os.WriteFile(filepath.Join(bin, "scontrol"), []byte("#!/bin/sh\necho \"$@\" >> "+marker+"\n"), 0o755)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		getenv        func(string) string
		restarts, max int
		want          string
	}{
		{env("SLURM_JOB_ID", "4242", "HPCRUN_EXECUTOR", "local"), 0, 3, "not requeued (the local executor"},
		{env("SLURM_JOB_ID", "4242", "HPCRUN_EXECUTOR", "run"), 0, 3, "not requeued (hpcrun run has no queue"},
		{env(), 0, 3, "resume with: hpcrun submit --resume X"},
		{env("SLURM_JOB_ID", "4242"), 3, 3, "the job was requeued 3 times already (max_requeues = 3)"},
		{env("SLURM_JOB_ID", "4242"), 1, 1, "the job was requeued 1 time already (max_requeues = 1)"},
	} {
		got := Requeue(context.Background(), tc.getenv, "X", tc.restarts, tc.max)
		if !strings.Contains(got, tc.want) {
			t.Errorf("Requeue = %q, want %q", got, tc.want)
		}
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("scontrol was run: %s", b)
	}
	got := Requeue(context.Background(), env("SLURM_JOB_ID", "4242"), "X", 0, 3)
	if b, _ := os.ReadFile(marker); strings.TrimSpace(string(b)) != "requeue 4242" || !strings.Contains(got, "requeued job 4242") {
		t.Errorf("a Slurm job: scontrol got %q, message %q", b, got)
	}
}

func TestLocalResubmitClearsTheEndedJob(t *testing.T) {
	ref, dir := localJob(t, 1, `exit 3`)
	if j := waitLocal(t, ref); j.State != Failed {
		t.Fatalf("first job = %+v", j)
	}
	s := validSpec()
	s.RunDir, s.NTasks, s.GPUsPerNode, s.CPUsPerTask = dir, 1, 0, 1
	s.Program = "/bin/true"
	os.WriteFile(filepath.Join(dir, "prog"), []byte("#!/bin/bash\nsleep 1\n"), 0o755)
	l := &Local{}
	id, _, err := l.Submit(context.Background(), Submission{Spec: s, Script: filepath.Join(dir, "job.sbatch")})
	if err != nil {
		t.Fatal(err)
	}
	j, err := l.Status(context.Background(), JobRef{ID: id, RunDir: dir})
	if err != nil || j.State.Done() {
		t.Fatalf("resubmitted job reads %+v, %v: the first job's end passed for it", j, err)
	}
	if j := waitLocal(t, JobRef{ID: id, RunDir: dir}); j.State != Completed {
		t.Errorf("second job = %+v", j)
	}
}

// The Store's port stays bound from ListenMaster until task 0 serves on
// it: task 0 inherits the listener, the others do not, and no other
// process can bind the port in between.
func TestTasksHandMasterListenerToTaskZero(t *testing.T) {
	ln, port, err := ListenMaster()
	if err != nil {
		t.Fatal(err)
	}
	if other, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
		other.Close()
		t.Fatal("the master's port could be taken before the tasks started")
	}
	tasks := Tasks{N: 2, Program: "/bin/sh", Master: ln, Vars: TorchrunVars(2, port, "r", "run"),
		Args: []string{"-c", `if [ "$RANK" = 0 ]; then case $(readlink /proc/$$/fd/$` + MasterFDEnv + `) in socket:*) exit 0;; esac; exit 4; fi; [ -z "$` + MasterFDEnv + `" ] || exit 5`}}
	failed, err := tasks.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range failed {
		t.Errorf("task %d: %v (4: task 0 has no listener, 5: another task has one)", f.Rank, f.Err)
	}
}

// TestTorchrun starts three tasks as hpcrun run, check and generate do:
// each sees its place and the same master port, task 0 alone holds the
// master's listener, the launcher's Env reaches every task, and the port
// is free once they are over.
func TestTorchrun(t *testing.T) {
	dir := t.TempDir()
	script := `fd=none; [ -n "$` + MasterFDEnv + `" ] && fd=$(readlink /proc/$$/fd/$` + MasterFDEnv + ` | cut -d: -f1)
echo "$RANK $WORLD_SIZE $LOCAL_RANK $TORCHELASTIC_RUN_ID $HPCRUN_EXECUTOR $MASTER_ADDR $EXTRA $fd" > "` + dir + `/$RANK"
echo "$MASTER_PORT" > "` + dir + `/port$RANK"`
	tasks := Tasks{N: 3, Program: "/bin/sh", Args: []string{"-c", script}, Env: []string{"EXTRA=x"},
		Vars: func(int) []string { return []string{"RANK=9"} }} // replaced by Torchrun's
	failed, err := Torchrun(context.Background(), tasks, "run-1")
	if err != nil || len(failed) > 0 {
		t.Fatalf("Torchrun: %v, failed %+v", err, failed)
	}
	port := ""
	for r := range 3 {
		b, _ := os.ReadFile(filepath.Join(dir, itoa(r)))
		fd := "none"
		if r == 0 {
			fd = "socket"
		}
		if want := itoa(r) + " 3 " + itoa(r) + " run-1 run 127.0.0.1 x " + fd; strings.TrimSpace(string(b)) != want {
			t.Errorf("task %d saw %q, want %q", r, strings.TrimSpace(string(b)), want)
		}
		p, _ := os.ReadFile(filepath.Join(dir, "port"+itoa(r)))
		if r > 0 && string(p) != port || strings.TrimSpace(string(p)) == "" {
			t.Errorf("task %d's MASTER_PORT %q, task 0's %q", r, p, port)
		}
		port = string(p)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strings.TrimSpace(port))
	if err != nil {
		t.Fatalf("the master's port is still held after the tasks: %v", err)
	}
	ln.Close()
}

// TestTasksSurviveAnEarlyTimeLimitSignal: a time-limit signal (USR1) that
// reaches a task before its program handles it does not kill it: the task
// starts with it ignored (a Go task's runtime then takes it over, and
// HoldSignals holds it). Before, its default action killed rank 0 in 1 of
// 6 tries when USR1 came right after the fork.
func TestTasksSurviveAnEarlyTimeLimitSignal(t *testing.T) {
	tasks := Tasks{N: 2, Program: "/bin/sh", Args: []string{"-c", "kill -USR1 $$; kill -USR2 $$; exit 0"}, Stdout: io.Discard, Stderr: io.Discard}
	failed, err := tasks.Run(context.Background())
	if err != nil || len(failed) != 0 {
		t.Fatalf("tasks that got USR1 and USR2 at once: %v, %v; want both to run to their end", failed, err)
	}
}
