package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestCheckAcrossProcesses runs every equivalence check at tp=2 in two real
// processes over the TCP backend, as `hpcrun check all --tp 2` does on a
// workstation, and reads the JSON table back.
func TestCheckAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("--json", "check", "all", "--tp", "2")
	var table struct {
		Results []struct {
			Check  string  `json:"check"`
			TP     int     `json:"tp"`
			Pass   bool    `json:"pass"`
			MaxErr float64 `json:"max_err"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &table); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	results := table.Results
	if len(results) < 10 {
		t.Fatalf("%d checks ran, want every layer:\n%s", len(results), out)
	}
	for _, r := range results {
		if !r.Pass || r.TP != 2 {
			t.Errorf("%s at tp %d: pass=%v max err %.3g", r.Check, r.TP, r.Pass, r.MaxErr)
		}
	}
	if _, errOut, code := e.run("check", "NoSuchLayer", "--tp", "2"); code == 0 || !strings.Contains(errOut, "NoSuchLayer") {
		t.Errorf("check of an unknown layer: exit %d, %q", code, errOut)
	}
}

// TestCheckUnderSrun runs the checks as a Slurm job step on the local
// cluster: each srun task is one rank, and rank 0 prints the table.
func TestCheckUnderSrun(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	cmd := exec.Command("srun", "-n", "2", "--time", "2", hpcrunBinary(t), "--json", "check", "all", "--tp", "2")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("srun -n 2 hpcrun check all --tp 2: %v\n%s", err, out)
	}
	var table struct {
		TP      int `json:"tp"`
		Results []struct {
			Check string `json:"check"`
			Pass  bool   `json:"pass"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &table); err != nil || table.TP != 2 || len(table.Results) < 10 {
		t.Fatalf("check table: %v, tp %d, %d results\n%s", err, table.TP, len(table.Results), out)
	}
	for _, r := range table.Results {
		if !r.Pass {
			t.Errorf("%s failed under srun", r.Check)
		}
	}
}

// TestSubmitCheck submits the checks as a job (`hpcrun submit --check all
// --tp 2`) through the Local executor, and through Slurm when it is up.
func TestSubmitCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	executors := []string{"local"}
	if exec.Command("sinfo").Run() == nil {
		executors = append(executors, "slurm")
	}
	for _, ex := range executors {
		t.Run(ex, func(t *testing.T) {
			e := newEnv(t)
			out, errOut, code := e.run("submit", "--executor", ex, "--check", "all", "--tp", "2", "--wait")
			if code != 0 || !strings.Contains(out, "submitted run ") {
				t.Fatalf("submit --check: exit %d\n%s%s", code, out, errOut)
			}
			execID := strings.Fields(strings.TrimPrefix(out, "submitted run "))[0]
			logs := e.mustRun("logs", execID)
			if !strings.Contains(logs, "checks passed") || strings.Contains(logs, "FAIL") {
				t.Errorf("check job log:\n%s", logs)
			}
			// A check writes no metrics: its run is over, not pending.
			if met := e.mustRun("metrics", execID); strings.Contains(met, "pending") || !strings.Contains(met, "hpcrun logs "+execID) {
				t.Errorf("metrics of a finished check run:\n%s", met)
			}
		})
	}
	e := newEnv(t)
	if _, errOut, code := e.run("submit", "--executor", "local", "--check", "NoSuchLayer", "--tp", "2"); code == 0 || !strings.Contains(errOut, "NoSuchLayer") {
		t.Errorf("submit --check NoSuchLayer: exit %d %q", code, errOut)
	}
}
