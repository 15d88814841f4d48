package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
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
