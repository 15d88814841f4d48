package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
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
	large := []string{"--executor", "local", "--preset", "bert-large", "--bsz", "16", "--gpu", "v100-16", "--ntasks", "4"}
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

	// The threads a rank gets are its launcher's: the Local executor's
	// splits the cores over the tasks whatever cpus_per_task says; srun
	// gives cpus_per_task. Nothing measured here: the output says so.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--executor", "local", "--cpus-per-task", "1"}, fmt.Sprintf("(GOMAXPROCS %d: the local launcher splits the cores over 2 tasks)", max(runtime.NumCPU()/2, 1))},
		{[]string{"--executor", "slurm", "--cpus-per-task", "1"}, "(GOMAXPROCS 1: cpus_per_task 1 under srun)"},
	} {
		text = e.mustRun(append([]string{"plan", "--device", "cpu", "--ntasks", "2", "--tp", "2"}, tt.args...)...)
		for _, want := range []string{tt.want, "warning: the CPU rates are not measured (defaults): run hpcrun bench gemm",
			"warning: the shm collectives are not measured (defaults): run hpcrun bench comm --nproc 2"} {
			if !strings.Contains(text, want) {
				t.Errorf("plan %v lacks %q:\n%s", tt.args, want, text)
			}
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

// TestPlanAuto runs hpcrun plan --auto: the ranked table of the top N
// with every column, its JSON, and one line saying what to change when
// nothing fits.
func TestPlanAuto(t *testing.T) {
	e := newEnv(t)
	text := e.mustRun("plan", "--auto", "--top", "3", "--executor", "local", "--preset", "tiny", "--model", "gpt", "--ntasks", "2", "--device", "cpu")
	for _, want := range []string{"global batch 32 samples a step", "RANK", "LAYOUT", "STEP S", "TOK/S", "MEM/RANK", "COMM", "BUBBLE", "WHY", "\n1 ", "\n3 ", "fastest:", "run the first: hpcrun submit --executor local --model gpt --preset tiny --device cpu --ntasks 2 --tp "} {
		if !strings.Contains(text, want) {
			t.Errorf("plan --auto lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "\n4 ") {
		t.Errorf("plan --auto --top 3 printed a 4th:\n%s", text)
	}
	var res plan.AutoResult
	if err := json.Unmarshal([]byte(e.mustRun("plan", "--auto", "--json", "--executor", "local", "--preset", "tiny", "--ntasks", "2", "--device", "cpu")), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) < 3 || res.Ranked[0].Rank != 1 || res.Ranked[0].Plan == nil || res.Ranked[0].Why == "" {
		t.Errorf("plan --auto --json: %+v", res)
	}
	_, errOut, code := e.run("plan", "--auto", "--executor", "local", "--preset", "gpt2-350m", "--layers", "192", "--gpu", "v100-16", "--ntasks", "2", "--bsz", "1")
	if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") > 0 || !strings.Contains(errOut, "no layout fits") || !strings.Contains(errOut, "--nodes") {
		t.Errorf("plan --auto where nothing fits: exit %d, %q; want one line saying what to change", code, errOut)
	}
	if _, errOut, code := e.run("plan", "--top", "3", "--executor", "local"); code != 2 || !strings.Contains(errOut, "--top needs --auto") {
		t.Errorf("plan --top without --auto: exit %d, %q", code, errOut)
	}
}

// TestPlanAutoFirstCommand runs the command plan --auto prints for its
// first layout, as plan: the user's model, preset, steps and lr stay, only
// the layout changes, and it plans the same model and global batch (the
// line once dropped every flag but the layout's: a GPT small request
// printed a command that trains a BERT tiny).
func TestPlanAutoFirstCommand(t *testing.T) {
	e := newEnv(t)
	asked := []string{"--executor", "local", "--preset", "small", "--model", "gpt", "--steps", "300", "--lr", "3e-4", "--ntasks", "2", "--device", "cpu"}
	text := e.mustRun(append([]string{"plan", "--auto"}, asked...)...)
	_, line, ok := strings.Cut(text, "run the first: hpcrun submit ")
	if !ok {
		t.Fatalf("plan --auto prints no command for the first:\n%s", text)
	}
	line, _, _ = strings.Cut(line, "\n")
	for _, want := range []string{"--preset small", "--model gpt", "--steps 300", "--lr 0.0003", "--executor local", "--device cpu", "--ntasks 2"} {
		if !strings.Contains(line, want) {
			t.Errorf("the first's command %q lacks %q", line, want)
		}
	}
	var res plan.AutoResult
	if err := json.Unmarshal([]byte(e.mustRun(append([]string{"plan", "--auto", "--json"}, asked...)...)), &res); err != nil {
		t.Fatal(err)
	}
	var got plan.Plan
	if err := json.Unmarshal([]byte(e.mustRun(append([]string{"plan", "--json"}, shellWords(t, line)...)...)), &got); err != nil {
		t.Fatal(err)
	}
	first := res.Ranked[0].Plan
	if got.Model != "gpt" || got.Preset != "small" || got.Model != first.Model || got.Layers != first.Layers || got.Dim != first.Dim || got.Seq != first.Seq || got.Vocab != first.Vocab {
		t.Errorf("the first's command plans %s (preset %s) %d layers dim %d seq %d vocab %d; plan --auto's first: %s (preset %s) %d layers dim %d seq %d vocab %d",
			got.Model, got.Preset, got.Layers, got.Dim, got.Seq, got.Vocab, first.Model, first.Preset, first.Layers, first.Dim, first.Seq, first.Vocab)
	}
	if batch := got.BatchSize * got.GradAccum * got.DP; batch != res.GlobalBatch || got.TP != first.TP || got.DP != first.DP {
		t.Errorf("the first's command plans tp %d dp %d, a global batch of %d; plan --auto's first: tp %d dp %d, %d", got.TP, got.DP, batch, first.TP, first.DP, res.GlobalBatch)
	}
}

// shellWords splits line as a POSIX shell does words with single quotes
// only, as plan's commands quote them (slurm.Quote).
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, w.String())
			}
			w.Reset()
			inWord = false
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// TestPlanCluster runs hpcrun plan --cluster on the 1T row of Narayanan et
// al.'s table: memory per GPU and whether it fits, TFLOP/s a GPU beside
// the paper's; --auto's search with the flags' layout beside its first;
// the one-line errors.
func TestPlanCluster(t *testing.T) {
	e := newEnv(t)
	row := []string{"--cluster", "dgx-a100-superpod", "--model", "gpt", "--layers", "128", "--dim", "25600", "--heads", "160", "--seq", "2048",
		"--vocab", "51200", "--tp", "8", "--pp", "64", "--ntasks", "3072", "--bsz", "1", "--micro-batches", "512", "--interleave", "2"}
	text := e.mustRun(append([]string{"plan"}, row...)...)
	for _, want := range []string{"plan-only", "384 nodes of 8 a100-80", "pp 64 x tp 8 x dp 6", "interleaved 1F1B, 2 virtual stages",
		"18 bytes a parameter", "fits a100-80", "TFLOP/s", "paper          163.0", "Table 1", "modelled:", "assumed:"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan --cluster lacks %q:\n%s", want, text)
		}
	}
	var p plan.Plan
	if err := json.Unmarshal([]byte(e.mustRun(append([]string{"plan", "--json"}, row...)...)), &p); err != nil {
		t.Fatal(err)
	}
	if p.Scale == nil || p.Scale.Paper == nil || math.Abs(p.Scale.ErrorPct) > 15 || !p.Fits {
		t.Errorf("plan --cluster --json: %+v", p.Scale)
	}
	text = e.mustRun(append([]string{"plan", "--auto", "--top", "3"}, row...)...)
	for _, want := range []string{"cluster dgx-a100-superpod", "TFLOP/S", "plan the first: hpcrun plan --cluster dgx-a100-superpod --model gpt --layers 128 --dim 25600 --heads 160 --seq 2048 ", "the flags' layout tp8 pp64 dp6 rc-full micro512 bsz1 v2", "reached 163 TFLOP/s"} {
		if !strings.Contains(text, want) {
			t.Errorf("plan --auto --cluster lacks %q:\n%s", want, text)
		}
	}
	// A profile's cluster key plans at scale; --cluster none the engine's run.
	toml := "default_profile = \"jz\"\n[profiles.jz]\nexecutor = \"local\"\ncluster = \"jean-zay-h100\"\n"
	if err := os.WriteFile(filepath.Join(e.dir, "hpcrun.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	small := []string{"--model", "gpt", "--layers", "24", "--dim", "2304", "--heads", "24", "--ntasks", "8", "--tp", "4", "--bsz", "1"}
	if text := e.mustRun(append([]string{"plan"}, small...)...); !strings.Contains(text, "cluster: jean-zay-h100, 2 nodes of 4 h100-80") {
		t.Errorf("plan on a profile with a cluster key:\n%s", text)
	}
	if text := e.mustRun("plan", "--cluster", "none", "--ntasks", "2", "--tp", "2", "--device", "cpu"); !strings.Contains(text, "= engine peak") {
		t.Errorf("plan --cluster none:\n%s", text)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster", "selene-2"}, `cluster "selene-2": use one of`},
		{[]string{"--cluster", "jean-zay-h100", "--model", "gpt", "--heads", "8", "--tp", "8", "--ntasks", "8"}, "more than the 4 GPUs"},
		{[]string{"--cluster", "none", "--interleave", "2"}, "--interleave needs --cluster"},
	} {
		_, errOut, code := e.run(append([]string{"plan"}, tt.args...)...)
		if code == 0 || !strings.Contains(errOut, tt.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("plan %v: exit %d, %q; want one line with %q", tt.args, code, errOut, tt.want)
		}
	}
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

	dry := e.mustRun("sweep", "--dry-run", "--executor", "local", "--gpu", "v100-16", "--preset", "tiny,bert-large", "--bsz", "16")
	for _, want := range []string{"skipped: cannot fit", "#SBATCH --array=0-0", "slurm-%A_%a.out", "sweep task --sweep-dir"} {
		if !strings.Contains(dry, want) {
			t.Errorf("sweep --dry-run lacks %q:\n%s", want, dry)
		}
	}
	if _, errOut, code := e.run("sweep", "--tp", "1,x"); code == 0 || !strings.Contains(errOut, `"x" is not a positive integer`) {
		t.Errorf("sweep --tp 1,x: exit %d, %q", code, errOut)
	}
}
