package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stepLosses reads a rank's metrics file: the loss of every step (the last
// written wins, as in the metrics reader after a resume), the run lines
// (one per start) and the end statuses.
func stepLosses(t *testing.T, path string) (losses map[int]float64, starts int, ends []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil
	}
	defer f.Close()
	losses = map[int]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Type   string  `json:"type"`
			Step   int     `json:"step"`
			Loss   float64 `json:"loss"`
			Status string  `json:"status"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Type {
		case "run":
			starts++
		case "step":
			losses[l.Step] = l.Loss
		case "end":
			ends = append(ends, l.Status)
		}
	}
	return losses, starts, ends
}

var restartsRE = regexp.MustCompile(`Restarts=(\d+)`)
var jobStateRE = regexp.MustCompile(`JobState=(\S+)`)

// slurmJob is scontrol's state and restart count of a job.
func slurmJob(t *testing.T, id string) (state string, restarts int) {
	t.Helper()
	out, err := exec.Command("scontrol", "show", "job", id).CombinedOutput()
	if err != nil {
		t.Fatalf("scontrol show job %s: %v: %s", id, err, out)
	}
	if m := jobStateRE.FindSubmatch(out); m != nil {
		state = string(m[1])
	}
	if m := restartsRE.FindSubmatch(out); m != nil {
		restarts, _ = strconv.Atoi(string(m[1]))
	}
	return state, restarts
}

// requeueNow waits until the job of s is pending again after its restarts-th
// requeue, then moves its start up: Slurm holds a requeued job for about
// two minutes, the lifetime of the revoked job credential. A job seen
// already running or completed after that requeue (it was not held, or
// the pending spell fell between two looks) needs nothing. While the job
// is held, pending (when set) is called.
func requeueNow(t *testing.T, s submitted, restarts int, deadline time.Time, pending func()) {
	t.Helper()
	var seen time.Time
	for {
		st, n := slurmJob(t, s.JobID)
		if st == "PENDING" && n == restarts {
			if pending != nil {
				pending()
			}
			seen = time.Now()
			break
		}
		if (st == "RUNNING" || st == "COMPLETED") && n == restarts {
			return // requeued and started again between two looks: nothing to hurry
		}
		if st == "COMPLETED" || st == "FAILED" || time.Now().After(deadline) {
			errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
			t.Fatalf("job %s (restarts %d), want it requeued for the %d. time\n%s", st, n, restarts, errLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// slurmd refuses a credential whose creation time (whole seconds) is
	// not after the revocation time of the job's previous one ("Job
	// credential revoked"). slurmctld stamped that revocation when it
	// requeued the job, before the job read PENDING here, so a credential
	// created in a later second than seen is accepted.
	time.Sleep(time.Until(seen.Truncate(time.Second).Add(time.Second)))
	exec.Command("scontrol", "update", "jobid="+s.JobID, "starttime=now").Run()
}

// waitCompleted waits for the job of s to complete and returns how many
// times it was restarted.
func waitCompleted(t *testing.T, s submitted, deadline time.Time) int {
	t.Helper()
	for {
		st, restarts := slurmJob(t, s.JobID)
		if st == "COMPLETED" {
			return restarts
		}
		if st == "FAILED" || st == "CANCELLED" || time.Now().After(deadline) {
			errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
			t.Fatalf("job %s, want COMPLETED\n%s", st, errLog)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestE2ERequeue runs a checkpointing job (--signal=USR1@.. and --requeue
// in its script) on the local Slurm and stops it twice the way a time limit
// does: USR1 to its tasks. Each time the tasks agree on a step, save, rank
// 0 requeues the job and it resumes from the checkpoint; the third start
// finishes. The losses of every step must equal those of the same training
// run without a stop (another job), bit for bit.
//
// Two shortcuts keep it under a minute, where a real time limit would take
// minutes: the test sends USR1 itself (scancel --signal=USR1, what Slurm
// does signal_secs before the limit, whose timer has up to a minute of
// slack), and it moves each requeued job's begin time to the second after
// the requeue (scontrol update starttime=now): Slurm holds a requeued job for
// about two minutes, the lifetime of the revoked job credential.
func TestE2ERequeue(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte(`default_profile = "rq"
[profiles.rq]
executor = "slurm"
time = "10:00"
checkpoint = true
signal_secs = 60
[train]
max_requeues = 2
ckpt_keep = 2
`), 0o644)
	args := []string{"--ntasks", "2", "--tp", "2", "--preset", "tiny", "--steps", "400", "--samples", "512", "--device", "cpu", "--eval-every", "0"}
	s := e.submit(args...)
	script, _ := os.ReadFile(filepath.Join(s.RunDir, "job.sbatch"))
	for _, want := range []string{"#SBATCH --signal=USR1@60", "#SBATCH --requeue", "#SBATCH --open-mode=append"} {
		if !strings.Contains(string(script), want) {
			t.Fatalf("job.sbatch lacks %q:\n%s", want, script)
		}
	}
	metricsFile := filepath.Join(s.RunDir, "metrics", "rank-00000.jsonl")
	deadline := time.Now().Add(150 * time.Second)
	for round := 0; round < 2; round++ {
		// Wait for this start to make some steps, then signal it.
		for {
			losses, starts, _ := stepLosses(t, metricsFile)
			if starts == round+1 && len(losses) >= 60*(round+1) {
				break
			}
			if st, _ := slurmJob(t, s.JobID); st == "COMPLETED" || st == "FAILED" || time.Now().After(deadline) {
				errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
				t.Fatalf("round %d: job %s before it could be signalled (%d steps)\n%s", round, st, len(losses), errLog)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if out, err := exec.Command("scancel", "--signal=USR1", s.JobID).CombinedOutput(); err != nil {
			t.Fatalf("scancel --signal=USR1: %v: %s", err, out)
		}
		// Held pending, the run is requeued, not interrupted, and says
		// which restart this is.
		requeueNow(t, s, round+1, deadline, func() {
			var m struct{ Status, Error string }
			json.Unmarshal([]byte(e.mustRun("metrics", "--json", s.ExecID)), &m)
			want := fmt.Sprintf("restart %d of at most 2, job pending", round+1)
			if m.Status != "requeued" || !strings.HasPrefix(m.Error, want) {
				t.Errorf("metrics of the requeued job: %s: %q, want requeued: %s...", m.Status, m.Error, want)
			}
		})
	}
	if restarts := waitCompleted(t, s, deadline); restarts != 2 {
		t.Errorf("completed after %d restarts, want 2", restarts)
	}
	errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
	if n := strings.Count(string(errLog), "requeued job "+s.JobID); n != 2 {
		t.Errorf("the job log says %d times that rank 0 requeued the job, want 2:\n%s", n, errLog)
	}
	losses, starts, ends := stepLosses(t, metricsFile)
	if starts != 3 || strings.Join(ends, ",") != "interrupted,interrupted,completed" {
		t.Errorf("%d starts, ends %v; want 3 and interrupted, interrupted, completed", starts, ends)
	}
	latest, _ := os.ReadFile(filepath.Join(s.RunDir, "ckpt", "latest"))
	if strings.TrimSpace(string(latest)) != "step-000400" {
		t.Errorf("ckpt/latest = %q, want step-000400", latest)
	}
	if steps, _ := filepath.Glob(filepath.Join(s.RunDir, "ckpt", "step-*")); len(steps) != 2 {
		t.Errorf("ckpt_keep = 2 but %d step dirs: %v", len(steps), steps)
	}

	// The same training without a stop, as a job of the same shape (the
	// GEMMs' thread count, hence their summation order, follows the job's
	// CPUs: hpcrun run on this machine differs in the last bits).
	sameAsUndisturbed(t, e, args, metricsFile, losses, 400)
}

// sameAsUndisturbed submits the job of args again and waits for it; every
// one of its steps losses must equal those of the disturbed run (whose
// rank 0 file is metricsFile) bit for bit.
func sameAsUndisturbed(t *testing.T, e *env, args []string, metricsFile string, losses map[int]float64, steps int) {
	t.Helper()
	e.run(append([]string{"submit", "--wait"}, args...)...)
	runs, _ := filepath.Glob(filepath.Join(e.dir, "runs", "*", "metrics", "rank-00000.jsonl"))
	var ref map[int]float64
	for _, r := range runs {
		if r != metricsFile {
			ref, _, _ = stepLosses(t, r)
		}
	}
	if len(ref) != steps || len(losses) != steps {
		t.Fatalf("%d steps undisturbed, %d disturbed; want %d each", len(ref), len(losses), steps)
	}
	for step := 1; step <= steps; step++ {
		if math.Float64bits(losses[step]) != math.Float64bits(ref[step]) {
			t.Fatalf("step %d: loss %v disturbed, %v undisturbed", step, losses[step], ref[step])
		}
	}
}
