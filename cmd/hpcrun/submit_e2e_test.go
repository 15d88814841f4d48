package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/slurm"
)

// These tests run the hpcrun binary, built once, as a user would: on the
// real local Slurm (scripts/slurm-local.sh up) when sinfo answers, and on the
// Local executor always.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// TestMain removes the binary the e2e tests built. (This package's only
// TestMain: other tests needing set-up should hook in here.)
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

func hpcrunBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hpcrun-e2e-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "hpcrun")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

// env is one isolated user: a work dir with its own runs dir and no config
// files but the ones a test writes.
type env struct {
	t    testing.TB
	bin  string
	dir  string
	path string // PATH for the binary
	// extra are more KEY=VALUE variables for the binary (the CPU
	// simulation's library path).
	extra []string
}

func newEnv(t testing.TB) *env {
	dir := t.TempDir()
	return &env{t: t, bin: hpcrunBinary(t), dir: dir, path: os.Getenv("PATH")}
}

// run runs hpcrun with args and returns stdout, stderr and the exit code.
func (e *env) run(args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command(e.bin, args...)
	cmd.Dir = e.dir
	cmd.Env = []string{"PATH=" + e.path, "HOME=" + e.dir, "XDG_CONFIG_HOME=" + filepath.Join(e.dir, ".config"),
		"XDG_CACHE_HOME=" + filepath.Join(e.dir, ".cache"), "HPCRUN_RUNS_DIR=" + filepath.Join(e.dir, "runs")}
	cmd.Env = append(cmd.Env, e.extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("hpcrun %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

func (e *env) mustRun(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("hpcrun %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

type submitted struct {
	ExecID, JobID, Executor, RunDir string
}

func (e *env) submit(args ...string) submitted {
	e.t.Helper()
	var s submitted
	out := e.mustRun(append([]string{"submit", "--json"}, args...)...)
	var m map[string]string
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		e.t.Fatalf("submit --json printed %q: %v", out, err)
	}
	s.ExecID, s.JobID, s.Executor, s.RunDir = m["execid"], m["jobid"], m["executor"], m["run_dir"]
	return s
}

func (e *env) queue(all bool) []slurm.QueueRow {
	e.t.Helper()
	args := []string{"queue", "--json"}
	if all {
		args = append(args, "--all")
	}
	var rows []slurm.QueueRow
	if err := json.Unmarshal([]byte(e.mustRun(args...)), &rows); err != nil {
		e.t.Fatal(err)
	}
	return rows
}

func (e *env) row(all bool, execID string) (slurm.QueueRow, bool) {
	for _, r := range e.queue(all) {
		if r.ExecID == execID {
			return r, true
		}
	}
	return slurm.QueueRow{}, false
}

func slurmUp(t testing.TB) {
	if err := exec.Command("sinfo").Run(); err != nil {
		t.Skip("Slurm is not up (sinfo fails); as root: scripts/slurm-local.sh up")
	}
}

func TestE2ESlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	testE2E(t, "slurm")
}

func TestE2ELocal(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	testE2E(t, "local")
}

func testE2E(t *testing.T, executor string) {
	e := newEnv(t)
	// A template that holds the job for a while, so that it can be seen in
	// the queue and cancelled.
	tmpl := filepath.Join(e.dir, "slow.tmpl")
	b, _ := os.ReadFile(filepath.Join("..", "..", "templates", "sbatch.tmpl"))
	os.WriteFile(tmpl, bytes.Replace(b, []byte("\nsrun "), []byte("\nsleep 120\nsrun "), 1), 0o644)

	slow := e.submit("--executor", executor, "--template", tmpl, "--name", "e2e-slow", "--ntasks", "2")
	if slow.Executor != executor || slow.JobID == "" {
		t.Fatalf("submitted %+v", slow)
	}
	for _, f := range []string{"job.sbatch", "train.toml", "meta.json"} {
		if _, err := os.Stat(filepath.Join(slow.RunDir, f)); err != nil {
			t.Errorf("run dir: %v", err)
		}
	}
	if fi, err := os.Stat(filepath.Join(slow.RunDir, "token")); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 16 {
		t.Errorf("run dir token: %v, %v; want a secret of mode 0600", fi, err)
	}
	row, ok := e.row(false, slow.ExecID)
	if !ok || row.JobID != slow.JobID || row.Name != "e2e-slow" || row.State.Done() {
		t.Fatalf("queue: row %+v, found %v", row, ok)
	}
	e.mustRun("cancel", slow.ExecID)
	waitState(t, e, slow.ExecID, "CANCELLED")
	if _, errOut, code := e.run("cancel", slow.ExecID); code == 0 || !strings.Contains(errOut, "already over") {
		t.Errorf("second cancel: exit %d, %q", code, errOut)
	}

	// The real job: tiny model, a few steps, followed to the end.
	out, errOut, code := e.run("submit", "--executor", executor, "--wait", "--ntasks", "2", "--tp", "2",
		"--preset", "tiny", "--steps", "3", "--samples", "64", "--device", "cpu")
	if !strings.Contains(out, "submitted run ") {
		t.Fatalf("submit --wait: exit %d\n%s%s", code, out, errOut)
	}
	execID := strings.Fields(strings.TrimPrefix(out, "submitted run "))[0]
	row, ok = e.row(true, execID)
	if !ok || !row.State.Done() {
		t.Fatalf("after --wait, queue --all: %+v, found %v", row, ok)
	}
	if code != 0 || row.State != "COMPLETED" {
		logs, _, _ := e.run("logs", "--err", execID)
		t.Fatalf("submit --wait: exit %d, state %s\n%s\n%s", code, row.State, errOut, logs)
	}
	if logs := e.mustRun("logs", execID); logs == "" {
		t.Errorf("logs: empty stdout")
	}
	if m, _ := filepath.Glob(filepath.Join(e.dir, "runs", execID, "metrics", "rank-*.jsonl")); len(m) != 2 {
		t.Errorf("metrics files: %v", m)
	}
}

func waitState(t *testing.T, e *env, execID, want string) {
	t.Helper()
	var row slurm.QueueRow
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		row, _ = e.row(true, execID)
		if string(row.State) == want {
			return
		}
	}
	t.Fatalf("run %s: state %s after 30 s, want %s", execID, row.State, want)
}

// fakeBin puts scripts named like Slurm's commands first on PATH.
func fakeBin(t *testing.T, e *env, scripts map[string]string) {
	bin := filepath.Join(e.dir, "fakebin")
	os.MkdirAll(bin, 0o755)
	for name, body := range scripts {
		os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755)
	}
	e.path = bin + ":" + e.path
}

func TestSubmitErrors(t *testing.T) {
	e := newEnv(t)
	// Bad requests are refused before anything is written.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--ntasks", "3", "--tp", "2"}, "ntasks 3 is not a multiple of tp 2"},
		{[]string{"--name", "a;rm -rf x"}, "job name"},
		{[]string{"--executor", "pbs"}, `executor "pbs"`},
		{[]string{"--template", "/nonexistent.tmpl"}, "sbatch template"},
		{[]string{"--preset", "gpt9"}, "gpt9"},
		{[]string{"--data", "/nonexistent/reviews.csv"}, "/nonexistent/reviews.csv"},
		{[]string{"--samples", "8", "--bsz", "8", "--ntasks", "4", "--tp", "1"}, "no full step"},
	} {
		_, errOut, code := e.run(append([]string{"submit", "--executor", "local"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("submit %v: exit %d, stderr %q; want one line with %q", tt.args, code, errOut, tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "runs")); err == nil {
		ents, _ := os.ReadDir(filepath.Join(e.dir, "runs"))
		if len(ents) > 0 {
			t.Errorf("refused submissions left %d run dirs", len(ents))
		}
	}

	// sbatch's own error is shown as is and recorded in the run dir.
	const msg = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
	fakeBin(t, e, map[string]string{"sbatch": "echo '" + msg + "' >&2; exit 1"})
	_, errOut, code := e.run("submit", "--executor", "slurm")
	if code == 0 || !strings.Contains(errOut, msg) {
		t.Fatalf("submit with failing sbatch: exit %d, %q", code, errOut)
	}
	runs, _ := filepath.Glob(filepath.Join(e.dir, "runs", "*", "meta.json"))
	if len(runs) != 1 {
		t.Fatalf("meta files: %v", runs)
	}
	b, _ := os.ReadFile(runs[0])
	if !strings.Contains(string(b), "Invalid account") {
		t.Errorf("meta.json does not record the failure:\n%s", b)
	}
	if _, errOut, code := e.run("logs", filepath.Base(filepath.Dir(runs[0]))); code == 0 || !strings.Contains(errOut, "never submitted") {
		t.Errorf("logs of a failed submission: %d %q", code, errOut)
	}

	// Slurm not reachable: one clear line, and the runs it can list.
	fakeBin(t, e, map[string]string{"squeue": "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1"})
	if out, errOut, _ := e.run("queue", "--all"); !strings.Contains(errOut, "slurmctld running?") || !strings.Contains(out, "EXECID") {
		t.Errorf("queue with Slurm down: %q %q", out, errOut)
	}
	// Unknown execid.
	for _, cmd := range []string{"logs", "metrics", "watch", "ckpt info"} {
		args := append(strings.Fields(cmd), "20300101-000000-abcd")
		if _, errOut, code := e.run(args...); code == 0 || !strings.Contains(errOut, `"20300101-000000-abcd" is not the execid or an execid prefix of a run`) {
			t.Errorf("%s of an unknown execid: %d %q", cmd, code, errOut)
		}
	}
	// cancel cancels only runs of hpcrun's, and says when it cancelled nothing.
	if _, errOut, code := e.run("cancel", "20300101-000000-abcd"); code != 2 || !strings.Contains(errOut, "nothing cancelled") {
		t.Errorf("cancel of an unknown execid: %d %q", code, errOut)
	}
}

func TestSubmitDryRun(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("submit", "--dry-run", "--executor", "local", "--ntasks", "4", "--tp", "2", "--name", "dry")
	for _, want := range []string{"#SBATCH --job-name=dry", "#SBATCH --ntasks-per-node=4", " train --run-dir "} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "runs")); err == nil {
		if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) > 0 {
			t.Errorf("--dry-run created %d run dirs", len(ents))
		}
	}
}
