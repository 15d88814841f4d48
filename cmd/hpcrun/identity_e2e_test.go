package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
)

// forgeRun writes a run dir as hpcrun submit leaves it once its Slurm job
// was given jobID, with a log line in slurm-<jobid>.out.
func forgeRun(t *testing.T, e *env, execID, jobID string, submitted time.Time) rundir.Dir {
	t.Helper()
	d := rundir.Dir(filepath.Join(e.dir, "runs", execID))
	if err := os.MkdirAll(d.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &slurm.Meta{ExecID: execID, JobID: jobID, Executor: "slurm", Host: slurm.Host(), SubmitTime: submitted,
		Spec: slurm.JobSpec{Name: "forged-" + jobID, RunDir: d.Path()}}
	if err := slurm.WriteMeta(d, m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Log(jobID, false), []byte("log of job "+jobID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestE2ESmallJobIDsNameNoRunByPrefix: on a fresh cluster job ids start at
// 1, and every execid starts with the year, so 2 and 20 are prefixes of
// every execid of the 2020s. Before, metrics 2 and logs 20 showed another
// run, rm 2 removed it and cancel 20 reached its job; now digits are a job
// id only.
func TestE2ESmallJobIDsNameNoRunByPrefix(t *testing.T) {
	e := newEnv(t)
	run20 := forgeRun(t, e, "20261130-100000-aaaa", "20", time.Now().Add(-time.Hour))
	for _, ref := range []string{"2", "202", "2026113"} {
		for _, cmd := range []string{"metrics", "logs", "cancel", "rm", "watch"} {
			out, errOut, code := e.run(cmd, ref)
			if code == 0 || strings.Contains(out, "20261130-100000-aaaa") || strings.Contains(out, "log of job") {
				t.Errorf("hpcrun %s %s: exit %d, %q %q; want no run found", cmd, ref, code, out, errOut)
			}
		}
	}
	if _, err := os.Stat(run20.Path()); err != nil {
		t.Fatalf("rm of a job id no run has removed run 20: %v", err)
	}
	if out := e.mustRun("logs", "20"); out != "log of job 20\n" {
		t.Errorf("logs 20: %q, want job 20's log", out)
	}
	if out := e.mustRun("logs", "20261130-"); out != "log of job 20\n" {
		t.Errorf("logs 20261130- (a prefix with the date): %q", out)
	}
	if _, errOut, _ := e.run("logs", "20261130"); !strings.Contains(errOut, "add the dash: 20261130-") {
		t.Errorf("logs 20261130: %q, want a hint to add the dash", errOut)
	}
}

// TestE2EReusedJobIDIsNotTheRun: a run whose job id the cluster has since
// given to another job (the counter wrapped or was reset) must not be
// shown with that job's state, and cancel must not cancel it.
func TestE2EReusedJobIDIsNotTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	out, err := exec.Command("sbatch", "--parsable", "--chdir", e.dir, "--output", "/dev/null", "--job-name", "stranger", "--wrap", "sleep 300").Output()
	if err != nil {
		t.Fatalf("sbatch: %v", err)
	}
	stranger, _, err := slurm.ParseSbatch(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exec.Command("scancel", stranger).Run() })
	const execID = "20261101-080000-0bad"
	forgeRun(t, e, execID, stranger, time.Now().Add(-time.Hour))

	_, errOut, code := e.run("cancel", execID)
	if code == 0 || !strings.Contains(errOut, "nothing cancelled") || !strings.Contains(errOut, "reused") {
		t.Errorf("cancel of the run whose job id is now another job's: exit %d, %q; want a refusal that says the id was reused", code, errOut)
	}
	if _, errOut, code := e.run("cancel", stranger); code == 0 || !strings.Contains(errOut, "nothing cancelled") {
		t.Errorf("cancel %s (by job id): exit %d, %q; want a refusal", stranger, code, errOut)
	}
	j, err := (&slurm.Slurm{}).Status(t.Context(), slurm.JobRef{ID: stranger})
	if err != nil || j.State.Done() {
		t.Fatalf("the stranger's job %s after hpcrun cancel: %+v, %v; want it untouched", stranger, j, err)
	}
	for _, r := range e.queue(true) {
		if r.ExecID == execID && !(r.State == slurm.Unknown && strings.Contains(r.Reason, "reused")) {
			t.Errorf("queue --all shows the stranger's job as run %s: %+v", execID, r)
		}
	}
	if out := e.mustRun("metrics", execID); strings.Contains(out, "RUNNING") || strings.Contains(out, "PENDING") {
		t.Errorf("metrics %s shows the stranger's state:\n%s", execID, out)
	}
}

// cancelledRun is a Local run of e that trained 3 steps and more for
// longer, then was cancelled (with a checkpoint to resume from).
func cancelledRun(t *testing.T, e *env, longer time.Duration) submitted {
	t.Helper()
	s := e.submit("--executor", "local", "--ntasks", "1", "--tp", "1", "--steps", "100000", "--eval-every", "100000")
	waitForSteps(t, s.RunDir, 3)
	time.Sleep(longer)
	e.mustRun("cancel", s.ExecID)
	waitState(t, e, s.ExecID, "CANCELLED")
	return s
}

// TestE2EConcurrentResumeStartsOneJob: four submit --resume of one run at
// once start one job; the others are refused (the run is busy, or its new
// job is live), so no orphan job trains into the same run dir.
func TestE2EConcurrentResumeStartsOneJob(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	s := cancelledRun(t, e, 0)

	type result struct {
		out, errOut string
		code        int
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			out, errOut, code := e.run("submit", "--resume", s.ExecID)
			results <- result{out, errOut, code}
		}()
	}
	won := 0
	for range 4 {
		r := <-results
		switch {
		case r.code == 0 && strings.Contains(r.out, "submitted run "+s.ExecID+" again"):
			won++
		case r.code != 0 && (strings.Contains(r.errOut, "another hpcrun is changing this run") || strings.Contains(r.errOut, "before resuming")):
		default:
			t.Errorf("submit --resume: exit %d, %q %q", r.code, r.out, r.errOut)
		}
	}
	if won != 1 {
		t.Errorf("%d of 4 concurrent resumes started a job, want 1", won)
	}
	e.mustRun("cancel", s.ExecID)
	waitState(t, e, s.ExecID, "CANCELLED")
	var supervisors int
	ents, _ := os.ReadDir("/proc")
	for _, ent := range ents {
		if b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline")); err == nil && strings.Contains(string(b), s.ExecID+"/.local/job") {
			supervisors++
		}
	}
	if supervisors != 0 {
		t.Errorf("%d local job supervisors of run %s live on after its cancel: orphans", supervisors, s.ExecID)
	}
}

// TestE2EResumeKeepsEarlierJobs: after a resume, the earlier job's id
// still names the run (metrics, logs), logs --all shows each job's log,
// wall time is the sum over the segments, and a completed run is not
// resumed (its job would train nothing).
func TestE2EResumeKeepsEarlierJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	s := cancelledRun(t, e, time.Second) // a first segment long enough to see in the sum
	out := e.mustRun("submit", "--resume", s.ExecID, "--json")
	var again map[string]string
	if err := json.Unmarshal([]byte(out), &again); err != nil || again["jobid"] == "" || again["jobid"] == s.JobID {
		t.Fatalf("submit --resume --json: %q, %v", out, err)
	}
	time.Sleep(2 * time.Second)
	e.mustRun("cancel", s.ExecID)
	waitState(t, e, s.ExecID, "CANCELLED")

	if out := e.mustRun("metrics", s.JobID); !strings.Contains(out, s.ExecID) {
		t.Errorf("metrics %s (the run's first job): %q", s.JobID, out)
	}
	first, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".out"))
	if out := e.mustRun("logs", s.JobID); out != string(first) || out == "" {
		t.Errorf("logs %s (the first job) printed %d bytes, want its log's %d", s.JobID, len(out), len(first))
	}
	all := e.mustRun("logs", "--all", s.ExecID)
	for _, h := range []string{"==> job " + s.JobID + " (1 of 2) <==", "==> job " + again["jobid"] + " (2 of 2) <=="} {
		if !strings.Contains(all, h) {
			t.Errorf("logs --all lacks %q:\n%s", h, all)
		}
	}
	var sum struct {
		WallS float64 `json:"wall_s"`
	}
	json.Unmarshal([]byte(e.mustRun("metrics", "--json", s.ExecID)), &sum)
	var walls []float64
	b, _ := os.ReadFile(filepath.Join(s.RunDir, "metrics", "rank-00000.jsonl"))
	for _, line := range strings.Split(string(b), "\n") {
		var end struct {
			Type  string  `json:"type"`
			WallS float64 `json:"wall_s"`
		}
		if json.Unmarshal([]byte(line), &end) == nil && end.Type == "end" {
			walls = append(walls, end.WallS)
		}
	}
	if len(walls) != 2 || walls[0] < 1 || math.Abs(sum.WallS-(walls[0]+walls[1])) > 1e-6 {
		t.Errorf("wall time %v s after the segments of %v s; want their sum", sum.WallS, walls)
	}

	done := e.submit("--executor", "local", "--wait", "--ntasks", "1", "--tp", "1", "--steps", "3")
	if _, errOut, code := e.run("submit", "--resume", done.ExecID); code == 0 || !strings.Contains(errOut, "completed all its 3 steps: there is nothing to resume") {
		t.Errorf("submit --resume of a completed run: exit %d, %q", code, errOut)
	}
}

// TestE2EKilledRunIsFailed: kill -9 of every rank, of srun alone, or of
// hpcrun run's launcher leaves no run "running" forever: metrics, queue and
// watch say it failed, killed, at the step it reached, and the launcher's
// ranks stop with it instead of training on as orphans.
func TestE2EKilledRunIsFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	args := []string{"--executor", "slurm", "--ntasks", "2", "--tp", "2", "--steps", "100000", "--eval-every", "100000"}
	for _, victim := range []string{"ranks", "srun"} {
		s := e.submit(args...)
		waitForSteps(t, s.RunDir, 3)
		if victim == "ranks" {
			// Stopped first, all of them: a rank that outlived its peer by
			// a moment would notice and write its own end line.
			pids := rankPids(s.RunDir)
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGSTOP)
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		} else {
			exec.Command("pkill", "-KILL", "-f", "^srun .*train --run-dir "+s.RunDir).Run()
		}
		_, errOut, code := e.run("watch", s.ExecID)
		if code != 1 || !strings.Contains(errOut, s.ExecID) || strings.Contains(errOut, "at step 0:") {
			t.Errorf("kill -9 of %s: watch: exit %d, %q; want exit 1 at the step reached", victim, code, errOut)
		}
		var m struct {
			Status, Error string
			Step          int
			Failure       struct{ Class string }
		}
		json.Unmarshal([]byte(e.mustRun("metrics", "--json", s.ExecID)), &m)
		if m.Failure.Class != "killed" || m.Step == 0 || m.Status == "running" {
			t.Errorf("kill -9 of %s: metrics: %s (%s) at step %d, class %q; want killed at the step reached", victim, m.Status, m.Error, m.Step, m.Failure.Class)
		}
		if victim == "ranks" && (m.Status != "failed" || !strings.HasPrefix(m.Error, "ranks 0-1 wrote no end line")) {
			t.Errorf("kill -9 of every rank: metrics: %s: %q", m.Status, m.Error)
		}
		if row, _ := e.row(true, s.ExecID); row.State != slurm.Failed || row.Failure != "killed" {
			t.Errorf("kill -9 of %s: queue: %+v, want FAILED, killed", victim, row)
		}
	}

	e = newEnv(t) // startRun finds the run as the only one
	cmd, _, dir := e.startRun(t, "run", "--nproc", "2", "--tp", "2", "--steps", "100000", "--eval-every", "100000")
	waitForSteps(t, dir, 3)
	cmd.Process.Kill()
	cmd.Wait()
	for deadline := time.Now().Add(30 * time.Second); len(rankPids(dir)) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			for _, pid := range rankPids(dir) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("the ranks of hpcrun run train on 30 s after their launcher was killed")
		}
	}
	var m struct{ Failure struct{ Class, Why string } }
	json.Unmarshal([]byte(e.mustRun("metrics", "--json", filepath.Base(dir))), &m)
	if m.Failure.Class != "killed" || m.Failure.Why != slurm.ReasonLauncherDied {
		t.Errorf("kill -9 of hpcrun run: failure %+v, want killed (%s)", m.Failure, slurm.ReasonLauncherDied)
	}
}

// TestE2ERejectedSubmissionIsNotSubmitted: a submission sbatch refused is
// "not submitted" with sbatch's words in metrics and queue, not pending.
func TestE2ERejectedSubmissionIsNotSubmitted(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	if _, errOut, code := e.run("submit", "--executor", "slurm", "--partition", "nope", "--ntasks", "2"); code == 0 {
		t.Fatalf("submit --partition nope: exit 0, %q", errOut)
	}
	var m struct{ Status, Error string }
	json.Unmarshal([]byte(e.mustRun("metrics", "--json", "--last", "1")), &m)
	if m.Status != "not submitted" || !strings.Contains(m.Error, "sbatch: error") {
		t.Errorf("metrics of a rejected submission: %s: %q, want not submitted with sbatch's error", m.Status, m.Error)
	}
	if out := e.mustRun("metrics", "--last", "1"); !strings.Contains(out, "not submitted: sbatch: error") {
		t.Errorf("metrics of a rejected submission:\n%s", out)
	}
}
