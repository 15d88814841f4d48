package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/sweep"
)

// TestE2ESweepSlurm submits a two-point sweep to the local Slurm as one job
// array and reads it back: every point done, its measured peak the
// predicted one, its logs found by execid through the array's, metrics
// showing plan beside run.
func TestE2ESweepSlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	out := e.mustRun("sweep", "--executor", "slurm", "--gpu", "cpu", "--device", "cpu", "--preset", "tiny", "--tp", "1,2", "--bsz", "4",
		"--ntasks", "2", "--steps", "3", "--samples", "64", "--eval-samples", "16", "--time", "00:05:00")
	m := regexp.MustCompile(`submitted sweep (\S+) as slurm job array (\d+) \(2 tasks`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("sweep:\n%s", out)
	}
	id, job := m[1], m[2]
	script, err := os.ReadFile(filepath.Join(e.dir, "runs", "sweeps", id, "job.sbatch"))
	if err != nil || !strings.Contains(string(script), "#SBATCH --array=0-1\n") {
		t.Fatalf("array script: %v\n%s", err, script)
	}
	var rows []sweep.Row
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		rows = nil
		if err := json.Unmarshal([]byte(e.mustRun("sweep", "show", "--json", id)), &rows); err != nil {
			t.Fatal(err)
		}
		over := 0
		for _, r := range rows {
			if r.State != "running" && r.State != "pending" {
				over++
			}
		}
		if over == len(rows) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweep %s not over after 2 minutes: %+v", id, rows)
		}
	}
	// The array's job id is no run: metrics says where the sweep's runs are.
	if _, errOut, code := e.run("metrics", job); code == 0 || !strings.Contains(errOut, "hpcrun sweep show "+id) {
		t.Errorf("metrics %s (the sweep's array job): exit %d, %s", job, code, errOut)
	}
	// The table of the submission and sweep show predict the same memory.
	show := e.mustRun("sweep", "show", id)
	for _, r := range rows {
		if pred := bytesIEC(r.PredMemBytes); !strings.Contains(out, pred) || !strings.Contains(show, pred) {
			t.Errorf("%s: predicted %s, not in both tables:\n%s\n%s", r.Point, pred, out, show)
		}
	}
	for _, r := range rows {
		// On a CPU, metrics knows no MFU (no device peak): nor does sweep
		// show (null in JSON, read back as 0).
		if r.MFU != 0 {
			t.Errorf("%s: sweep show says MFU %v where metrics has none", r.Point, r.MFU)
		}
		if r.State != "done" || r.MeasMemBytes != r.PredMemBytes || !r.FinalLoss.Known() {
			t.Errorf("%s: state %s, predicted %d B, measured %d B, loss %v", r.Point, r.State, r.PredMemBytes, r.MeasMemBytes, r.FinalLoss)
			continue
		}
		if logs := e.mustRun("logs", r.ExecID); !strings.Contains(logs, "step 3/3") {
			t.Errorf("logs %s (array job %s):\n%s", r.ExecID, job, logs)
		}
		met := e.mustRun("metrics", r.ExecID)
		if !strings.Contains(met, "plan vs run") || !strings.Contains(met, "+0.0%") {
			t.Errorf("metrics %s:\n%s", r.ExecID, met)
		}
		// sweep show gives the tokens/s prediction's error as metrics does.
		if m := regexp.MustCompile(`(?m)^tokens/s +\d+ +\d+ +(\S+%)$`).FindStringSubmatch(met); m == nil || !strings.Contains(show, m[1]) {
			t.Errorf("%s: the tokens/s error of metrics (%v) is not in sweep show:\n%s", r.Point, m, show)
		}
	}
}
