package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/metrics"
)

// onlyRun returns the one run directory under the env's runs dir.
func (e *env) onlyRun() string {
	e.t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.dir, "runs"))
	if err != nil || len(ents) != 1 {
		e.t.Fatalf("runs dir holds %d entries (%v), want 1", len(ents), err)
	}
	return filepath.Join(e.dir, "runs", ents[0].Name())
}

// TestRunTinyBERTLearns is must-show (2) without Slurm: the tiny BERT at
// tp=2 x dp=2 on the synthetic set passes 90% validation accuracy, every
// rank writing a complete metrics file.
func TestRunTinyBERTLearns(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "4", "--tp", "2")
	run, err := metrics.ReadRun(e.onlyRun())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := metrics.Summarize(run)
	var sb strings.Builder
	metrics.WriteSummary(&sb, s)
	if len(run.Ranks) != 4 {
		t.Fatalf("%d rank files, want 4", len(run.Ranks))
	}
	for _, r := range run.Ranks {
		if r.End == nil || r.End.Status != metrics.StatusCompleted {
			t.Errorf("rank %s did not complete:\n%s", r.Path, sb.String())
		}
		if len(r.Evals) == 0 {
			t.Fatalf("rank %s has no eval line", r.Path)
		}
		if acc := r.Evals[len(r.Evals)-1].Accuracy; !(acc > 0.9) {
			t.Errorf("rank %s: final validation accuracy %.3f, want > 0.9\n%s", r.Path, acc, sb.String())
		}
	}
}

// TestRunGPTLossFalls is must-show (3): the tiny GPT's loss falls on a text
// file, at tp=2.
func TestRunGPTLossFalls(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	var sb strings.Builder
	for i := 0; sb.Len() < 40000; i++ {
		fmt.Fprintf(&sb, "The %s cat sat on the %s mat, line %d.\n", []string{"red", "big", "old"}[i%3], []string{"blue", "small", "new", "warm"}[i%4], i%10)
	}
	text := filepath.Join(e.dir, "text.txt")
	if err := os.WriteFile(text, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	e.mustRun("run", "--nproc", "2", "--tp", "2", "--model", "gpt", "--data", text, "--steps", "40", "--seq", "64", "--bsz", "8", "--eval-every", "20")
	run, err := metrics.ReadRun(e.onlyRun())
	if err != nil {
		t.Fatal(err)
	}
	steps := run.Ranks[0].Steps
	if len(steps) != 40 {
		t.Fatalf("%d steps, want 40", len(steps))
	}
	first, last := steps[0].Loss, steps[len(steps)-1].Loss
	if !(last < 0.6*first) {
		t.Errorf("loss %.3f -> %.3f: did not fall by 40%%", first, last)
	}
}

// TestRunBadInput checks that bad requests fail before any rank starts,
// with one line that says what to change, and leave no run directory.
func TestRunBadInput(t *testing.T) {
	e := newEnv(t)
	empty := filepath.Join(e.dir, "empty.csv")
	os.WriteFile(empty, nil, 0o644)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--data", filepath.Join(e.dir, "missing.csv")}, "no such file"},
		{[]string{"--data", empty}, "empty CSV"},
		{[]string{"--nproc", "3", "--tp", "2"}, "ntasks 3 is not a multiple of tp 2"},
		{[]string{"--heads", "3", "--tp", "2", "--nproc", "2"}, "heads 3 is not a multiple of tp 2"},
		{[]string{"--preset", "huge"}, `preset "huge"`},
		{[]string{"--samples", "20", "--bsz", "16", "--nproc", "2"}, "no full step"},
		{[]string{"--device", "cuda"}, "device cuda"},
	}
	for _, tt := range tests {
		_, errOut, code := e.run(append([]string{"run"}, tt.args...)...)
		if code != 2 || !strings.Contains(errOut, tt.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("run %v: exit %d, stderr %q; want exit 2 and one line containing %q", tt.args, code, errOut, tt.want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) != 0 {
		t.Errorf("bad requests left %d run dirs", len(ents))
	}
}

// TestTrainTaskBadConfig checks `hpcrun train` on a run dir whose
// train.toml is wrong.
func TestTrainTaskBadConfig(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.dir, "r")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "train.toml"), []byte("layerz = 2\n"), 0o644)
	_, errOut, code := e.run("train", "--run-dir", dir)
	if code != 2 || !strings.Contains(errOut, "unknown key(s) layerz") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = e.run("train", "--run-dir", filepath.Join(e.dir, "nope"))
	if code != 2 || !strings.Contains(errOut, "no such file") {
		t.Errorf("missing run dir: exit %d, stderr %q", code, errOut)
	}
}

// TestRunPipeline runs pp 2 x tp 2 as 4 processes (activations and
// gradients between stages over the process backends): every rank
// completes with the bubble beside its theory, and the loss curve equals
// a one-process run accumulating as many micro-batches to 1e-6.
func TestRunPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	losses := func(e *env, args ...string) []float64 {
		e.mustRun(append([]string{"run", "--steps", "10", "--layers", "2", "--device", "cpu"}, args...)...)
		run, err := metrics.ReadRun(e.onlyRun())
		if err != nil {
			t.Fatal(err)
		}
		var out []float64
		for _, st := range run.Ranks[len(run.Ranks)-1].Steps {
			out = append(out, st.Loss)
		}
		for _, r := range run.Ranks {
			if r.End == nil || r.End.Status != metrics.StatusCompleted || len(r.Steps) != 10 {
				t.Fatalf("rank %s: %d steps, end %+v", r.Path, len(r.Steps), r.End)
			}
			if pp := r.Info.PP; pp > 1 && (r.Steps[9].BubbleTheory != 1.0/3 || r.Info.PPRank != r.Rank/2) {
				t.Errorf("rank %d: stage %d, bubble %v theory %v", r.Rank, r.Info.PPRank, r.Steps[9].Bubble, r.Steps[9].BubbleTheory)
			}
		}
		return out
	}
	pipe := losses(newEnv(t), "--nproc", "4", "--pp", "2", "--tp", "2", "--micro-batches", "2")
	one := losses(newEnv(t), "--nproc", "1", "--grad-accum", "2")
	for i := range one {
		if d := math.Abs(pipe[i]-one[i]) / one[i]; d > 1e-6 {
			t.Errorf("step %d: loss %.8f at pp 2 x tp 2, %.8f in one process", i+1, pipe[i], one[i])
		}
	}
}

// TestRunRecordsPlanAndMFU: hpcrun run keeps its plan in meta.json as
// submit does, so metrics sets the plan beside the run, and the run's MFU
// is over the peak that plan used: hpcrun plan, metrics and the dashboard
// have one MFU, on the CPU too.
func TestRunRecordsPlanAndMFU(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a second")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--steps", "6", "--eval-every", "0", "--recompute", "full")
	dir := e.onlyRun()
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		Plan *struct {
			Time struct {
				PeakFlops     float64 `json:"peak_flops"`
				FlopsPerToken float64 `json:"flops_per_token"`
				MFU           float64 `json:"mfu"`
				HFU           float64 `json:"hfu"`
				TokensPerS    float64 `json:"tokens_per_s"`
			} `json:"time"`
		} `json:"plan"`
	}
	if err := json.Unmarshal(b, &meta); err != nil || meta.Plan == nil || !(meta.Plan.Time.PeakFlops > 0) || !(meta.Plan.Time.MFU > 0) {
		t.Fatalf("meta.json of hpcrun run keeps no plan with a peak (%v):\n%s", err, b)
	}
	peak := meta.Plan.Time.PeakFlops
	id := filepath.Base(dir)
	var got struct {
		ModelFlopsPerS float64               `json:"model_flops_per_s"`
		TokensPerS     float64               `json:"tokens_per_s"`
		PeakFlops      float64               `json:"peak_flops"`
		MFU            float64               `json:"mfu"`
		HFU            float64               `json:"hfu"`
		Plan           *struct{ Rows []any } `json:"plan"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("metrics", "--json", id)), &got); err != nil {
		t.Fatal(err)
	}
	if got.PeakFlops != peak || !(got.ModelFlopsPerS > 0) || math.Abs(got.MFU-got.ModelFlopsPerS/peak) > 1e-12*got.MFU {
		t.Errorf("metrics --json: peak %g, model FLOP/s %g, MFU %g; want the plan's peak %g and MFU model FLOP/s / peak = %g",
			got.PeakFlops, got.ModelFlopsPerS, got.MFU, peak, got.ModelFlopsPerS/peak)
	}
	if got.Plan == nil || len(got.Plan.Rows) == 0 {
		t.Errorf("metrics --json has no plan beside the run")
	}
	// The plan's MFU and the run's are over one peak and one FLOPs per
	// token: they stand as the throughputs do.
	if fpt := got.ModelFlopsPerS / got.TokensPerS; math.Abs(fpt-meta.Plan.Time.FlopsPerToken) > 1e-9*fpt ||
		math.Abs(meta.Plan.Time.MFU/got.MFU-meta.Plan.Time.TokensPerS/got.TokensPerS) > 1e-9*meta.Plan.Time.MFU/got.MFU {
		t.Errorf("plan: %g FLOPs a token, MFU %g at %g tokens/s; run: %g FLOPs a token, MFU %g at %g tokens/s",
			meta.Plan.Time.FlopsPerToken, meta.Plan.Time.MFU, meta.Plan.Time.TokensPerS, fpt, got.MFU, got.TokensPerS)
	}
	// Under recomputation HFU stands to MFU as hardware FLOPs to model
	// FLOPs, in the plan and in the run alike.
	if r, want := got.HFU/got.MFU, meta.Plan.Time.HFU/meta.Plan.Time.MFU; !(r > 1) || math.Abs(r-want) > 1e-12*want {
		t.Errorf("recompute full: run HFU/MFU %g, the plan's %g; want them equal and over 1", r, want)
	}
	// hpcrun plan of the same run (its one rank on every core, as hpcrun
	// run gives it) prices it at the same peak.
	var pl struct {
		Time struct {
			PeakFlops float64 `json:"peak_flops"`
		} `json:"time"`
	}
	out := e.mustRun("plan", "--ntasks", "1", "--cpus-per-task", strconv.Itoa(runtime.NumCPU()), "--steps", "6", "--eval-every", "0", "--json")
	if err := json.Unmarshal([]byte(out), &pl); err != nil || pl.Time.PeakFlops != peak {
		t.Errorf("hpcrun plan's peak %g (%v), the run's plan's %g", pl.Time.PeakFlops, err, peak)
	}
	text := e.mustRun("metrics", id)
	for _, want := range []string{"plan vs run", "tokens/s", fmt.Sprintf("MFU %s of ", pctText(got.MFU)), fmt.Sprintf("HFU %s: ", pctText(got.HFU))} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics %s lacks %q:\n%s", id, want, text)
		}
	}
}

// pctText is a share as metrics prints it.
func pctText(f float64) string {
	if v := 100 * f; v != 0 && math.Abs(v) < 0.1 {
		return fmt.Sprintf("%.2g%%", v)
	}
	return fmt.Sprintf("%.1f%%", 100*f)
}

// run --json prints the run's summary and final state as JSON, alone on
// stdout (the ranks' lines go to stderr).
func TestRunJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	out := e.mustRun("run", "--json", "--nproc", "1", "--steps", "3")
	var got struct {
		ExecID string `json:"execid"`
		Status string `json:"status"`
		Step   int    `json:"step"`
		Final  struct{ State string }
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.ExecID == "" || got.Status != "completed" || got.Step != 3 || got.Final.State != "COMPLETED" {
		t.Errorf("run --json: %v\n%s", err, out)
	}
}

// generate of a BERT run fails on a line of its own: the prompt is echoed
// with the first generated text, not before a model that cannot generate.
func TestGenerateBERTRunFailsCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--steps", "2")
	out, errOut, code := e.run("generate", filepath.Base(e.onlyRun()), "--prompt", "Once upon", "--tokens", "3")
	if code == 0 || strings.Contains(out, "Once upon") || errOut == "" {
		t.Errorf("generate of a BERT run: exit %d, stdout %q, stderr %q; want a failure and no echoed prompt", code, out, errOut)
	}
}
