package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/plan"
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
		"--ntasks", "2", "--steps", "3", "--samples", "64", "--eval-samples", "16", "--time", "00:05:00", "--max-parallel", "1")
	m := regexp.MustCompile(`submitted sweep (\S+) as slurm job array (\d+) \(2 tasks`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("sweep:\n%s", out)
	}
	id, job := m[1], m[2]
	script, err := os.ReadFile(filepath.Join(e.dir, "runs", "sweeps", id, "job.sbatch"))
	if err != nil || !strings.Contains(string(script), "#SBATCH --array=0-1%1\n") { // --max-parallel 1
		t.Fatalf("array script: %v\n%s", err, script)
	}
	rows := waitSweep(t, e, id)
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
		// The MFU is over the peak of the point's plan, on a CPU too, and
		// sweep show says metrics' own.
		var mj struct {
			MFU float64 `json:"mfu"`
		}
		if err := json.Unmarshal([]byte(e.mustRun("metrics", "--json", r.ExecID)), &mj); err != nil || !(mj.MFU > 0) || float64(r.MFU) != mj.MFU {
			t.Errorf("%s: sweep show says MFU %v, metrics %v (%v)", r.Point, r.MFU, mj.MFU, err)
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
		if m := regexp.MustCompile(`(?m)^tokens/s +\d+ +\d+ +(\S+%)( |$)`).FindStringSubmatch(met); m == nil || !strings.Contains(show, m[1]) {
			t.Errorf("%s: the tokens/s error of metrics (%v) is not in sweep show:\n%s", r.Point, m, show)
		}
	}

	// Cancelling a sweep that is over, by its array's job id or its id,
	// cancels nothing and says so; rm says how many runs go with it.
	for _, ref := range []string{job, id} {
		if _, errOut, code := e.run("cancel", ref); code == 0 || !strings.Contains(errOut, "nothing cancelled: sweep "+id+" has no point queued or running (2 of its runs are over)") {
			t.Errorf("cancel %s (a finished sweep): exit %d, %q", ref, code, errOut)
		}
	}
	if out := e.mustRun("rm", id); out != "removed sweep "+id+" and its 2 runs\n" {
		t.Errorf("rm %s: %q", id, out)
	}

	// cancel <sweepid> cancels the live points of a sweep.
	out = e.mustRun("sweep", "--executor", "slurm", "--gpu", "cpu", "--device", "cpu", "--preset", "tiny", "--tp", "1,2", "--bsz", "4",
		"--ntasks", "2", "--steps", "100000", "--eval-every", "100000", "--time", "00:05:00")
	live := regexp.MustCompile(`submitted sweep (\S+) as slurm job array`).FindStringSubmatch(out)
	if live == nil {
		t.Fatalf("sweep:\n%s", out)
	}
	if out := e.mustRun("cancel", live[1]); !strings.Contains(out, "cancelled sweep "+live[1]+": 2 live points") {
		t.Errorf("cancel %s (a live sweep): %q", live[1], out)
	}
	for _, r := range waitSweep(t, e, live[1]) {
		if row, _ := e.row(true, r.ExecID); row.State != slurm.Cancelled {
			t.Errorf("point %s after cancel: %+v, want CANCELLED", r.Point, row)
		}
	}
}

// waitSweep waits for every point of sweep id to be over, at most 2
// minutes, and returns sweep show's rows.
func waitSweep(t *testing.T, e *env, id string) []sweep.Row {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		var rows []sweep.Row
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
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("sweep %s not over after 2 minutes: %+v", id, rows)
		}
	}
}

// TestE2ESweepAutoSlurm runs plan --auto's 3 fastest layouts of a tiny
// GPT on 2 tasks as a sweep on the local Slurm: the points are plan
// --auto's top 3 in its order, sweep.json keeps their predicted rank, and
// sweep show sets it beside the rank of the measured tokens/s, both
// filled for every point.
func TestE2ESweepAutoSlurm(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	common := []string{"--gpu", "cpu", "--device", "cpu", "--preset", "tiny", "--model", "gpt", "--ntasks", "2", "--bsz", "4"}
	var res plan.AutoResult
	if err := json.Unmarshal([]byte(e.mustRun(append([]string{"plan", "--auto", "--json", "--executor", "slurm"}, common...)...)), &res); err != nil {
		t.Fatal(err)
	}
	out := e.mustRun(append([]string{"sweep", "--auto", "--top", "3", "--executor", "slurm", "--steps", "3", "--samples", "64",
		"--eval-samples", "16", "--time", "00:05:00"}, common...)...)
	m := regexp.MustCompile(`submitted sweep (\S+) as slurm job array (\d+) \(3 tasks`).FindStringSubmatch(out)
	if m == nil || len(res.Ranked) < 3 {
		t.Fatalf("sweep --auto (plan --auto ranked %d):\n%s", len(res.Ranked), out)
	}
	id := m[1]
	b, err := os.ReadFile(filepath.Join(e.dir, "runs", "sweeps", id, "sweep.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st sweep.State
	if err := json.Unmarshal(b, &st); err != nil || !st.Auto || len(st.Points) != 3 {
		t.Fatalf("sweep.json: %v\n%s", err, b)
	}
	for i, p := range st.Points {
		if want := res.Ranked[i].Layout.String(); p.Label != want || p.PredRank != i+1 || p.Plan == nil {
			t.Errorf("point %d: %q, predicted rank %d; want plan --auto's #%d %q", i, p.Label, p.PredRank, i+1, want)
		}
	}
	rows := waitSweep(t, e, id)
	measured := map[int]bool{}
	for i, r := range rows {
		if r.State != "done" || r.PredRank != i+1 || r.MeasRank < 1 || r.MeasRank > 3 || !r.MeasTokensPerS.Known() {
			t.Errorf("%s: state %s, predicted rank %d, measured rank %d (%v tokens/s)", r.Point, r.State, r.PredRank, r.MeasRank, r.MeasTokensPerS)
		}
		measured[r.MeasRank] = true
	}
	if len(measured) != 3 {
		t.Errorf("measured ranks %v: want 1, 2 and 3", measured)
	}
	show := e.mustRun("sweep", "show", id)
	lines := strings.Split(strings.TrimSpace(show), "\n")
	if len(lines) < 5 || !strings.Contains(lines[1], "RANK PRED") || !strings.Contains(lines[1], "RANK MEAS") {
		t.Fatalf("sweep show:\n%s", show)
	}
	col := strings.Index(lines[1], "RANK PRED")
	for i, r := range rows {
		line := lines[2+i]
		if f := strings.Fields(line[col:]); len(f) < 2 || f[0] != strconv.Itoa(r.PredRank) || f[1] != strconv.Itoa(r.MeasRank) {
			t.Errorf("sweep show row %d: %q; want ranks %d and %d under RANK PRED and RANK MEAS", i, line, r.PredRank, r.MeasRank)
		}
	}
	t.Logf("sweep show:\n%s", show)
}

// TestSweepAutoBadInput: sweep --auto chooses the layouts, so a list of
// tp or bsz, or a --top below 1, is refused in one line before anything
// is written.
func TestSweepAutoBadInput(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--tp", "1,2"}, "--tp takes one value"},
		{[]string{"--bsz", "4,8"}, "--bsz takes one value"},
		{[]string{"--top", "0"}, "--top 0: give 1 or more"},
	} {
		args := append([]string{"sweep", "--auto", "--executor", "local", "--preset", "tiny", "--ntasks", "2"}, tt.args...)
		_, errOut, code := e.run(args...)
		if code == 0 || !strings.Contains(errOut, tt.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want one line with %q", tt.args, code, errOut, tt.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) > 0 {
		t.Errorf("refused sweeps left %d entries in the runs dir", len(ents))
	}
}
