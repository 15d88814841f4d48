package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/train/plan"
)

// TestPlanCommand runs hpcrun plan and the submit refusal it drives: a run
// that does not fit its GPU is refused with what would fit, before any run
// dir exists; the dry run prints the plan after the placement.
func TestPlanCommand(t *testing.T) {
	e := newEnv(t)
	large := []string{"--executor", "local", "--preset", "bert-large", "--gpu", "v100-16", "--ntasks", "4"}
	var got struct {
		plan.Plan
		Suggestions []plan.Suggestion `json:"suggestions"`
	}
	out := e.mustRun(append([]string{"plan", "--json"}, large...)...)
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("plan --json: %v\n%s", err, out)
	}
	if got.Fits || got.Memory.Total <= got.Device.MemBytes || len(got.Suggestions) == 0 || got.Device.Name != "v100-16" {
		t.Errorf("bert-large on a V100 16 GB: fits %v, total %d of %d, suggestions %v", got.Fits, got.Memory.Total, got.Device.MemBytes, got.Suggestions)
	}

	_, errOut, code := e.run(append([]string{"submit"}, large...)...)
	if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
		t.Errorf("submit of a run that does not fit: exit %d, stderr %q; want one line", code, errOut)
	}
	for _, want := range []string{"over the", "v100-16", "--tp ", "--grad-accum", "--force"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("refusal %q lacks %q", errOut, want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) > 0 {
		t.Errorf("a refused submission left %d run dirs", len(ents))
	}

	text := e.mustRun("plan", "--executor", "local", "--ntasks", "2", "--tp", "2")
	for _, want := range []string{"= engine peak", "activations", "fits cpu", "tokens/s", "rates: default"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan lacks %q:\n%s", want, text)
		}
	}

	text = e.mustRun("plan", "--executor", "local", "--ntasks", "4", "--tp", "2", "--sp", "--zero", "1", "--device", "cpu")
	for _, want := range []string{"tp 2 x dp 2 + sequence parallel + ZeRO-1", "sequence-parallel bufs", "ZeRO-1: this rank's 1/2", "along the sequence"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan --sp --zero 1 lacks %q:\n%s", want, text)
		}
	}

	text = e.mustRun("plan", "--executor", "local", "--ntasks", "2", "--pp", "2", "--micro-batches", "4", "--device", "cpu")
	for _, want := range []string{"of the stage that needs the most", "stage 0's", "2 micro-batches in flight", "pipeline stages", "stage 1 ", "point-to-point (4 transfers)", "bubble", "= 0.20"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan --pp 2 lacks %q:\n%s", want, text)
		}
	}

	_, errOut = e.mustRunErr("submit", "--dry-run", "--executor", "local", "--ntasks", "2", "--tp", "2")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if !strings.HasPrefix(lines[0], "placement:") || len(lines) < 2 || !strings.HasPrefix(lines[1], "plan:") || !strings.Contains(errOut, "= engine peak") {
		t.Errorf("dry run's stderr: %q; want the placement then the plan", errOut)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--gpu", "tpu-v9"}, `device "tpu-v9"`},
		{[]string{"--gpus-per-node", "4", "--ntasks", "4"}, "none is named"},
	} {
		_, errOut, code := e.run(append([]string{"plan", "--executor", "local"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("plan %v: exit %d, stderr %q; want one line with %q", tt.args, code, errOut, tt.want)
		}
	}
}

// mustRunErr is mustRun that also returns stderr.
func (e *env) mustRunErr(args ...string) (string, string) {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("hpcrun %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out, errOut
}

// TestSweepLocal runs a small grid with the Local executor: the point that
// runs is a normal run whose measured peak is the predicted one, the invalid
// point is listed as skipped, and sweep show reads it all back. A dry run
// on a GPU lists the point that cannot fit it.
func TestSweepLocal(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("sweep", "--executor", "local", "--gpu", "cpu", "--preset", "tiny", "--tp", "1,3", "--bsz", "4", "--steps", "3", "--eval-samples", "16")
	if !strings.Contains(out, "invalid: heads 4 is not a multiple of tp 3") {
		t.Errorf("sweep does not list the invalid point:\n%s", out)
	}
	ids, _ := filepath.Glob(filepath.Join(e.dir, "runs", "sweeps", "*", "sweep.json"))
	if len(ids) != 1 {
		t.Fatalf("sweep dirs: %v", ids)
	}
	var rows []sweep.Row
	show := e.mustRun("sweep", "show", "--json", filepath.Base(filepath.Dir(ids[0])))
	if err := json.Unmarshal([]byte(show), &rows); err != nil {
		t.Fatalf("sweep show --json: %v\n%s", err, show)
	}
	states := map[string]string{}
	for _, r := range rows {
		states[r.Point] = r.State
		if r.State == "done" && (r.MeasMemBytes == 0 || r.MeasMemBytes != r.PredMemBytes || !r.MeasTokensPerS.Known() || !r.FinalLoss.Known()) {
			t.Errorf("%s: predicted %d B, measured %d B, tokens/s %v, loss %v", r.Point, r.PredMemBytes, r.MeasMemBytes, r.MeasTokensPerS, r.FinalLoss)
		}
	}
	for p, w := range map[string]string{"preset=tiny tp=1 bsz=4": "done", "preset=tiny tp=3 bsz=4": "skipped (invalid"} {
		if !strings.HasPrefix(states[p], w) {
			t.Errorf("%s: state %q, want %q...", p, states[p], w)
		}
	}
	text := e.mustRun("sweep", "show", filepath.Base(filepath.Dir(ids[0])))
	if !strings.Contains(text, "TOK/S MEAS") || !strings.Contains(text, "done") {
		t.Errorf("sweep show:\n%s", text)
	}

	dry := e.mustRun("sweep", "--dry-run", "--executor", "local", "--gpu", "v100-16", "--preset", "tiny,bert-large", "--bsz", "8")
	for _, want := range []string{"skipped: cannot fit", "#SBATCH --array=0-0", "slurm-%A_%a.out", "sweep task --sweep-dir"} {
		if !strings.Contains(dry, want) {
			t.Errorf("sweep --dry-run lacks %q:\n%s", want, dry)
		}
	}
	if _, errOut, code := e.run("sweep", "--tp", "1,x"); code == 0 || !strings.Contains(errOut, `"x" is not a positive integer`) {
		t.Errorf("sweep --tp 1,x: exit %d, %q", code, errOut)
	}
}
