package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/slurm"
)

// rankPids finds the processes of `hpcrun train --run-dir dir`, the tasks
// of one run, by their command lines.
func rankPids(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	want := []byte("train\x00--run-dir\x00" + dir + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitForSteps waits until rank 0 of the run in dir has written n step
// lines.
func waitForSteps(t *testing.T, dir string, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "metrics", "rank-00000.jsonl"))
		if bytes.Count(b, []byte(`"type":"step"`)) >= n {
			return
		}
	}
	t.Fatalf("run %s wrote no %d steps in 60 s", dir, n)
}

// TestEveryCommandFindsARunTheSameWays: logs, metrics, watch, cancel and
// ckpt take an execid, a unique prefix of one, or a job id alike (they
// share rundir.Find); before, logs and cancel refused a prefix.
func TestEveryCommandFindsARunTheSameWays(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	s := e.submit("--executor", "local", "--wait", "--ntasks", "2", "--tp", "2", "--steps", "4")
	for _, ref := range []string{s.ExecID, s.ExecID[:len(s.ExecID)-2], s.JobID} {
		for _, args := range [][]string{{"logs", ref}, {"metrics", ref}, {"watch", ref}, {"ckpt", "info", ref}} {
			if out, errOut, code := e.run(args...); code != 0 {
				t.Errorf("hpcrun %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
			}
		}
		if _, errOut, _ := e.run("cancel", ref); !strings.Contains(errOut, "already over") {
			t.Errorf("hpcrun cancel %s: %q, want the finished job found and said to be over", ref, errOut)
		}
	}
}

// TestRunAppearsInQueue: a run of hpcrun run has a meta.json like a
// submitted one, so queue --all lists it with how it ended, and metrics,
// logs and ckpt find it.
func TestRunAppearsInQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "2", "--tp", "2", "--steps", "3")
	dir := e.onlyRun()
	execID := filepath.Base(dir)
	row, ok := e.row(true, execID)
	if !ok {
		t.Fatalf("queue --all does not list run %s: %+v", execID, e.queue(true))
	}
	if row.State != slurm.Completed || row.Executor != "run" {
		t.Errorf("queue row %+v, want COMPLETED by executor run", row)
	}
	if _, ok := e.row(false, execID); ok {
		t.Errorf("queue without --all lists the finished run %s", execID)
	}
	e.mustRun("metrics", execID[:17])
	e.mustRun("ckpt", "info", execID)
	if fi, err := os.Stat(filepath.Join(dir, "token")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token: %v, %v; want mode 0600", fi, err)
	}
}

// TestTermToOneRankStopsAllTogether: SIGTERM (or Ctrl-C) to one rank stops
// every rank after the same step, with a checkpoint, as the time-limit
// signal does; before, the others died on "rendezvous store unreachable".
func TestTermToOneRankStopsAllTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	cmd, stderr, dir := e.startRun(t, "run", "--nproc", "2", "--tp", "1", "--steps", "100000", "--eval-every", "100000")
	defer cmd.Process.Kill()
	waitForSteps(t, dir, 3)
	pids := rankPids(dir)
	if len(pids) != 2 {
		t.Fatalf("found rank pids %v, want 2", pids)
	}
	syscall.Kill(pids[1], syscall.SIGTERM)
	done := make(chan error)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("ranks still running 60 s after SIGTERM:\n%s", stderr.String())
	}
	out := stderr.String()
	if strings.Contains(out, "unreachable") || !strings.Contains(out, "resume with: hpcrun run --resume") {
		t.Errorf("output does not show an agreed stop:\n%s", out)
	}
	l0, _, end0 := stepLosses(t, filepath.Join(dir, "metrics", "rank-00000.jsonl"))
	l1, _, end1 := stepLosses(t, filepath.Join(dir, "metrics", "rank-00001.jsonl"))
	if len(l0) == 0 || len(l0) != len(l1) || len(end0) != 1 || len(end1) != 1 || end0[0] != "interrupted" || end1[0] != "interrupted" {
		t.Errorf("rank 0: %d steps, ends %v; rank 1: %d steps, ends %v; want the same step count, both interrupted", len(l0), end0, len(l1), end1)
	}
	if _, err := os.Stat(filepath.Join(dir, "ckpt", "latest")); err != nil {
		t.Errorf("no checkpoint after the stop: %v", err)
	}
	// The run's meta says how it ended, for queue.
	var m struct {
		Final *slurm.JobInfo `json:"final"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "meta.json"))
	if json.Unmarshal(b, &m); m.Final == nil || m.Final.State != slurm.Cancelled {
		t.Errorf("meta.json final = %+v, want CANCELLED (a clean stop)", m.Final)
	}
}

// TestLocalStopNeverRequeuesAJob: a Local job stopped by the time-limit
// signal saves and stops, says so once, but never runs scontrol requeue:
// its SLURM_JOB_ID is the supervisor's pid, which may be a real job's id.
func TestLocalStopNeverRequeuesAJob(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	// An scontrol that records being called comes first on PATH, as the
	// real one would be on a login node.
	bin := filepath.Join(e.dir, "bin")
	os.MkdirAll(bin, 0o755)
	marker := filepath.Join(e.dir, "scontrol-called")
	os.WriteFile(filepath.Join(bin, "scontrol"), []byte("#!/bin/sh\necho \"$@\" >> "+marker+"\nexit 1\n"), 0o755)
	e.path = bin + ":" + e.path
	s := e.submit("--executor", "local", "--ntasks", "2", "--tp", "2", "--steps", "100000", "--eval-every", "100000")
	waitForSteps(t, s.RunDir, 3)
	for _, pid := range rankPids(s.RunDir) {
		syscall.Kill(pid, syscall.SIGUSR1)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r, _ := e.row(true, s.ExecID); r.State == slurm.Failed || r.State == slurm.Completed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("local job did not stop within 60 s of USR1")
		}
	}
	errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
	if !strings.Contains(string(errLog), "not requeued (the local executor") {
		t.Errorf("rank 0 did not say the local job is not requeued:\n%s", errLog)
	}
	// Both ranks got USR1 and stopped; rank 0 alone says so.
	if n := strings.Count(string(errLog), "stopped by the time-limit signal"); n != 1 {
		t.Errorf("the stop said %d times in the job log, want once:\n%s", n, errLog)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("scontrol was run by a local job: %s", b)
	}
}

// TestMetricsReportsConfigErrors: a broken config file is an error naming
// its line, not a silent fallback to ./runs.
func TestMetricsReportsConfigErrors(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte("runs_dir = 5\n"), 0o644)
	_, errOut, code := e.run("metrics", "--last", "1")
	if code == 0 || !strings.Contains(errOut, "hpcrun.toml:1") {
		t.Errorf("metrics with a broken hpcrun.toml: exit %d, %q; want the file and line", code, errOut)
	}
}

// startRun starts hpcrun with args (an hpcrun run) in e's directory, its
// output in the returned buffer, and waits for its run dir to appear.
func (e *env) startRun(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer, string) {
	t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Dir = e.dir
	cmd.Env = []string{"PATH=" + e.path, "HOME=" + e.dir, "XDG_CACHE_HOME=" + filepath.Join(e.dir, ".cache"), "HPCRUN_RUNS_DIR=" + filepath.Join(e.dir, "runs")}
	stderr := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir string
	for deadline := time.Now().Add(30 * time.Second); dir == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Join(e.dir, "runs"))
		if len(ents) == 1 {
			dir = filepath.Join(e.dir, "runs", ents[0].Name())
		}
	}
	return cmd, stderr, dir
}
