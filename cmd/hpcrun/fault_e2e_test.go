package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// A rank that fails on its own error (its metrics file cannot be opened)
// makes it the job's: the other ranks stop within seconds, each quoting
// that rank, its host and its message, and their end lines say so;
// nobody waits out the collective timeout to blame a healthy rank. On
// the CPU, and on four simulated GPUs over NCCL, where the others wait in
// NCCL's communicator setup when rank 2 fails.
func TestOwnFailureStopsThePeersQuotingIt(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	t.Run("cpu", func(t *testing.T) { ownFailureStopsThePeers(t, newEnv(t)) })
	t.Run("simulated-gpus", func(t *testing.T) {
		ownFailureStopsThePeers(t, simEnv(t, 4), "--device", "cuda", "--comm", "nccl", "--eval-samples", "32")
	})
}

func ownFailureStopsThePeers(t *testing.T, e *env, args ...string) {
	e.mustRun(append([]string{"run", "--nproc", "4", "--tp", "2", "--steps", "1"}, args...)...)
	dir := rundir.Dir(e.onlyRun())
	bad := dir.RankMetrics(2)
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bad, 0o755); err != nil { // opening it for appending fails
		t.Fatal(err)
	}
	ln, port, err := slurm.ListenMaster()
	if err != nil {
		t.Fatal(err)
	}
	stderr := make([]bytes.Buffer, 4)
	tasks := slurm.Tasks{N: 4, Program: e.bin, Args: []string{"train", "--run-dir", dir.Path()}, Master: ln, Env: e.extra,
		Vars: slurm.TorchrunVars(4, port, dir.ExecID(), "run"), Grace: time.Minute,
		Output: func(r int) (_, _ io.Writer) { return io.Discard, &stderr[r] }}
	start := time.Now()
	failed, err := tasks.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if len(failed) != 4 {
		t.Fatalf("%d ranks failed, want all 4", len(failed))
	}
	host := slurm.Host()
	for r := range 4 {
		msg := stderr[r].String()
		if r == 2 {
			if !strings.Contains(msg, "rank 2: metrics:") || !strings.Contains(msg, "is a directory") {
				t.Errorf("rank 2 says %q: want its own error", msg)
			}
			continue
		}
		if !strings.Contains(msg, "rank 2 ("+host+"): metrics:") || !strings.Contains(msg, "is a directory") {
			t.Errorf("rank %d says %q: want rank 2 on %s and its error", r, msg, host)
		}
		l, err := metrics.ReadRank(dir.RankMetrics(r))
		if err != nil {
			t.Fatal(err)
		}
		if l.End == nil || l.End.Status != metrics.StatusFailed || !strings.Contains(l.End.Error, "rank 2 (") || !strings.Contains(l.End.Error, "is a directory") {
			t.Errorf("rank %d's end line %+v: want failed, quoting rank 2", r, l.End)
		}
	}
	if took > 15*time.Second {
		t.Errorf("the ranks took %v to stop: they waited for rank 2 instead of hearing of its failure", took)
	}
}

// A time-limit signal that comes before the task could handle it (right
// after a requeue, while it still reads its config) is held: the task
// trains one step, saves and stops as a signalled task does (ExitStopped),
// instead of losing the signal (Go ignores an unhandled USR1; Slurm sends
// it once) and training on until the time limit kills it unsaved. The
// config file is a FIFO so that the signal lands while the task is
// provably reading it.
func TestEarlyStopSignalIsHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--steps", "3")
	dir := rundir.Dir(e.onlyRun())
	conf, err := os.ReadFile(dir.Config())
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir.Ckpt())
	os.Remove(dir.RankMetrics(0))
	os.Remove(dir.Config())
	if err := syscall.Mkfifo(dir.Config(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e.bin, "train", "--run-dir", dir.Path())
	cmd.Env = append(os.Environ(), slurm.TorchrunVars(1, 1, dir.ExecID(), "run")(0)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fifo, err := os.OpenFile(dir.Config(), os.O_WRONLY, 0) // returns once the task opened it
	if err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGUSR1)
	time.Sleep(100 * time.Millisecond)
	fifo.Write(conf)
	fifo.Close()
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != slurm.ExitStopped {
		t.Fatalf("task ended with %v (exit %d), want exit %d (stopped and saved): %s", err, code, slurm.ExitStopped, stderr.String())
	}
	l, err := metrics.ReadRank(dir.RankMetrics(0))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Steps) != 1 || l.End == nil || l.End.Status != metrics.StatusInterrupted {
		t.Fatalf("%d steps, end %+v: want one step, then a stop", len(l.Steps), l.End)
	}
	if latest, _ := os.ReadFile(filepath.Join(dir.Ckpt(), "latest")); !strings.Contains(string(latest), "step-000001") {
		t.Fatalf("latest = %q, want the checkpoint of step 1", latest)
	}
}

// A time limit no longer than the stop signal's lead is warned about:
// Slurm would signal the job as soon as it starts.
func TestSubmitWarnsWhenTimeIsShorterThanSignalLead(t *testing.T) {
	e := newEnv(t)
	conf := filepath.Join(e.dir, "hpcrun.toml")
	if err := os.WriteFile(conf, []byte("default_profile = \"ck\"\n[profiles.ck]\ncheckpoint = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut := e.mustRunErr("submit", "--dry-run", "--ntasks", "2", "--time", "00:01:00")
	if !strings.Contains(errOut, "warning: time limit 00:01:00 (60 s) is not longer than the stop signal's lead (USR1@120)") {
		t.Fatalf("no warning for --time 00:01:00 with USR1@120: %s", errOut)
	}
	_, errOut = e.mustRunErr("submit", "--dry-run", "--ntasks", "2", "--time", "00:20:00")
	if strings.Contains(errOut, "warning: time limit") {
		t.Fatalf("warning for --time 00:20:00: %s", errOut)
	}
}

// A run whose meta.json is not JSON is still listed by queue --all,
// flagged with why, instead of vanishing.
func TestQueueAllListsARunWithBrokenMeta(t *testing.T) {
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--steps", "1")
	dir := rundir.Dir(e.onlyRun())
	if err := os.WriteFile(dir.Meta(), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	row, ok := e.row(true, dir.ExecID())
	if !ok {
		t.Fatalf("queue --all does not list run %s with a broken meta.json", dir.ExecID())
	}
	if row.State != "UNKNOWN" || !strings.Contains(row.Reason, "unreadable meta.json: invalid character") {
		t.Fatalf("row %+v: want state UNKNOWN and the reason", row)
	}
	if _, ok := e.row(false, dir.ExecID()); ok {
		t.Fatal("plain queue lists a run whose state nothing knows")
	}
}

// Sizes from a flag or a file are bounded, and what does not fit this
// machine is refused as submit refuses it, before any rank allocates:
// run, generate and eval answer at once with the key or the memory at
// fault instead of allocating until the process dies.
func TestSizesRefusedBeforeAllocating(t *testing.T) {
	e := newEnv(t)
	huge := filepath.Join(e.dir, "huge")
	os.Mkdir(huge, 0o755)
	os.WriteFile(filepath.Join(huge, "config.json"), []byte(`{"model_type":"gpt2","n_embd":16384,"n_layer":96,"n_head":128,"n_positions":1024,"vocab_size":50257}`), 0o644)
	if f, err := os.Create(filepath.Join(huge, "model.safetensors")); err == nil {
		f.Truncate(412 << 30) // sparse: takes no disk
		f.Close()
	}
	absurd := filepath.Join(e.dir, "absurd")
	os.Mkdir(absurd, 0o755)
	os.WriteFile(filepath.Join(absurd, "config.json"), []byte(`{"model_type":"gpt2","n_embd":768,"n_layer":1000000000000,"n_head":12,"n_positions":1024,"vocab_size":50257}`), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--nproc", "1", "--layers", "1000000000"}, 2, "layers = 1000000000: more than"},
		{[]string{"run", "--nproc", "1", "--dim", "4611686018427387904"}, 2, "dim = 4611686018427387904: more than"},
		{[]string{"run", "--nproc", "1", "--vocab", "1099511627776"}, 2, "vocab = 1099511627776: more than"},
		{[]string{"run", "--nproc", "1", "--dim", "100000"}, 1, "run --force to start it anyway"},
		{[]string{"run", "--nproc", "1", "--init-from", absurd}, 2, "n_layer = 1000000000000: more than"},
		{[]string{"generate", "--nproc", "1", huge}, 1, "the model's weights alone need"},
		{[]string{"eval", "--nproc", "1", "--data", filepath.Join(e.dir, "x.txt"), huge}, 1, "the model's weights alone need"},
	} {
		start := time.Now()
		out, errOut, code := e.run(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || time.Since(start) > 20*time.Second {
			t.Errorf("hpcrun %s: exit %d after %v: %s%s\nwant exit %d saying %q", strings.Join(tc.args, " "), code, time.Since(start).Round(time.Millisecond), out, errOut, tc.code, tc.want)
		}
	}
}

// A rank whose world never forms still ends its metrics file with why:
// here rank 1 of 2 waits for a master that never comes and is cancelled
// (TERM, then TERM again to stop at once). Before, such a rank left no
// file at all, and on a job whose peer failed while the others were still
// joining, "hpcrun metrics" showed ranks with no end.
func TestRankThatNeverJoinedRecordsWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	dir, cmd, stderr := joiningRank(t)
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(100 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the task did not stop within 30 s of a second TERM: %s", stderr.String())
	}
	l, err := metrics.ReadRank(dir.RankMetrics(1))
	if err != nil {
		t.Fatalf("%v (stderr: %s)", err, stderr.String())
	}
	if l.End == nil || l.End.Status != metrics.StatusInterrupted || l.End.Error == "" || len(l.Steps) != 0 {
		t.Fatalf("end line %+v after %d steps: want interrupted, saying why, and no step", l.End, len(l.Steps))
	}
}

// A run's comm_timeout bounds how long a rank waits for its peers: rank 1
// of 2, whose master never comes, fails after the 2 s its train.toml
// gives, saying so, and records it as its end.
func TestCommTimeoutBoundsTheWait(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "2", "--steps", "1", "--comm-timeout", "2s")
	dir := rundir.Dir(e.onlyRun())
	if conf, _ := os.ReadFile(dir.Config()); !strings.Contains(string(conf), `comm_timeout = "2s"`) {
		t.Fatalf("train.toml lacks comm_timeout:\n%s", conf)
	}
	start := time.Now()
	cmd, stderr := startRankWithoutMaster(t, e, dir)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("rank 1 still waits 20 s after it started, with comm_timeout 2s: %s", stderr.String())
	}
	if took := time.Since(start); !strings.Contains(stderr.String(), "2s") || took < time.Second {
		t.Errorf("after %v: %s; want a failure naming the 2s wait (the default waits 30 s)", took, stderr.String())
	}
	if l, err := metrics.ReadRank(dir.RankMetrics(1)); err != nil || l.End == nil || l.End.Status != metrics.StatusFailed {
		t.Errorf("end line: %+v, %v; want failed", l, err)
	}
}

// joiningRank is rank 1 of 2 of a run dir, started half a second ago and
// waiting for a master that never comes (startRankWithoutMaster).
func joiningRank(t *testing.T) (rundir.Dir, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	e := newEnv(t)
	e.mustRun("run", "--nproc", "2", "--steps", "1")
	dir := rundir.Dir(e.onlyRun())
	cmd, stderr := startRankWithoutMaster(t, e, dir)
	time.Sleep(500 * time.Millisecond)
	return dir, cmd, stderr
}

// startRankWithoutMaster starts the training task of rank 1 of the 2 of
// run dir, without its metrics file, pointed at a master port nobody
// serves: a rank whose world never forms.
func startRankWithoutMaster(t *testing.T, e *env, dir rundir.Dir) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	os.Remove(dir.RankMetrics(1))
	ln, port, err := slurm.ListenMaster()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	cmd := exec.Command(e.bin, "train", "--run-dir", dir.Path())
	cmd.Env = append(os.Environ(), slurm.TorchrunVars(2, port, dir.ExecID(), "run")(1)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// One TERM stops a rank still joining its world at once, saying so: before,
// the first TERM waited for the world to form (up to the comm timeout: the
// run took 25 s to end).
func TestOneTermStopsAJoiningRank(t *testing.T) {
	if testing.Short() {
		t.Skip("trains")
	}
	dir, cmd, stderr := joiningRank(t)
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the joining task did not stop within 10 s of one TERM: %s", stderr.String())
	}
	if took := time.Since(sent); took > 5*time.Second {
		t.Errorf("one TERM took %v to stop a joining rank", took)
	}
	l, err := metrics.ReadRank(dir.RankMetrics(1))
	if err != nil {
		t.Fatalf("%v (stderr: %s)", err, stderr.String())
	}
	if l.End == nil || l.End.Status != metrics.StatusInterrupted || !strings.Contains(l.End.Error, "stopped by SIGTERM") || !strings.Contains(l.End.Error, "while joining the world") {
		t.Errorf("end line %+v, want interrupted: stopped by SIGTERM while joining the world", l.End)
	}
	if strings.Contains(stderr.String(), "no answer within") {
		t.Errorf("a stopped join says it timed out: %s", stderr.String())
	}
}
