package dashboard

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
)

// A run whose meta.json holds the plan made at submission shows it beside
// what was measured; a run without one shows no plan.
func TestPlanAgainstMeasured(t *testing.T) {
	runs := t.TempDir()
	const withPlan, without = "20261123-150000-aaaa", "20261123-150001-bbbb"
	writeRun(t, runs, withPlan, 4, 1, 30, true)
	writeRun(t, runs, without, 4, 1, 30, true)
	p := tinyGPTPlan(t)
	meta, _ := json.Marshal(map[string]any{"execid": withPlan, "executor": "run", "plan": p})
	if err := os.WriteFile(filepath.Join(runs, withPlan, "meta.json"), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, _, err := metrics.ReadSummary(filepath.Join(runs, withPlan), metrics.NoCurves)
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, runs)
	cookie := tokenCookie(ts)
	_, body := get(t, http.DefaultClient, ts.URL+"/run/"+withPlan, cookie)
	var peak int64
	for _, m := range sum.Memory {
		peak = max(peak, m.EnginePeakBytes)
	}
	for _, want := range []string{
		`<tr data-key="step_s"><th>step time (p50)</th><td class="num" data-planned="` + exact(metrics.Float(p.Time.StepS)) + `"`,
		`data-measured="` + exact(sum.StepP50S) + `"`,
		`data-planned="` + exact(metrics.Float(p.Memory.EnginePeak)) + `"`,
		`data-measured="` + exact(metrics.Float(peak)) + `"`,
		`data-planned="` + exact(metrics.Float(p.Time.TokensPerS)) + `"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("run page with a plan lacks %s", want)
		}
	}
	if _, body := get(t, http.DefaultClient, ts.URL+"/run/"+without, cookie); strings.Contains(body, "plan vs measured") {
		t.Errorf("a run without a plan shows one")
	}
}

// The run page's MFU, its plan row and its per-step chart are over the
// peak the plan used, as hpcrun plan's and hpcrun metrics' are, not over
// another peak a run line may carry.
func TestMFUOverThePlanPeak(t *testing.T) {
	runs := t.TempDir()
	const id = "20261123-150000-aaaa"
	writeRun(t, runs, id, 4, 1, 30, true) // run lines with a peak of 1e12
	p := tinyGPTPlan(t)
	peak := p.Time.PeakFlops
	if peak <= 0 || peak == 1e12 {
		t.Fatalf("the plan's peak %g does not tell it from the run lines'", peak)
	}
	meta, _ := json.Marshal(map[string]any{"execid": id, "executor": "run", "plan": p})
	if err := os.WriteFile(filepath.Join(runs, id, "meta.json"), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	d := rundir.Dir(filepath.Join(runs, id))
	sum, _, err := metrics.ReadSummary(d.Path(), metrics.NoCurves)
	if err != nil {
		t.Fatal(err)
	}
	if want := metrics.MFU(1e6, float64(sum.TokensPerS), peak, 4); float64(sum.MFU) != want {
		t.Fatalf("summary MFU %v, want %v over the plan's peak", sum.MFU, want)
	}
	smp := newSampler(d)
	if err := smp.read(); err != nil {
		t.Fatal(err)
	}
	_, rc := smp.series(sum)
	tok, mfu := rc.Tokens.Series[0].Y, rc.MFU.Series[0].Y
	if !rc.HasMFU || len(mfu) == 0 {
		t.Fatal("no MFU chart")
	}
	for i := range mfu {
		if want := metrics.MFU(1e6, tok[i], peak, 4); mfu[i] != want {
			t.Fatalf("chart point %d: MFU %g, want %g over the plan's peak", i, mfu[i], want)
		}
	}
	for _, r := range planOf(d, sum) {
		if r.Key == "mfu" && r.MeasureV != exact(sum.MFU) {
			t.Errorf("plan row MFU measured %s, the summary's %s", r.MeasureV, exact(sum.MFU))
		}
	}
	ts := newTestServer(t, runs)
	if _, body := get(t, http.DefaultClient, ts.URL+"/run/"+id, tokenCookie(ts)); !strings.Contains(body, `data-key="mfu" data-value="`+exact(sum.MFU)+`"`) {
		t.Errorf("run page lacks the summary's MFU %s", exact(sum.MFU))
	}
}

// tinyGPTPlan is the plan of a tiny GPT on 4 CPU ranks at tp 2.
func tinyGPTPlan(t *testing.T) *plan.Plan {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.NTasks, cfg.TP, cfg.Device = 4, 2, "cpu"
	p, err := plan.New(plan.Request{Config: cfg, Vocab: 256, Device: plan.CPU(plan.DefaultCPUFlops, 8<<30, 2, "test")})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A run that recomputes shows its HFU beside its MFU, on the run page and
// in the MFU chart's note, the summary's figure; a run that does not
// shows none.
func TestHFUWhenRecomputing(t *testing.T) {
	runs := t.TempDir()
	const recomputes, plain = "20261123-150000-aaaa", "20261123-150001-bbbb"
	writeRun(t, runs, recomputes, 4, 1, 30, true)
	writeRun(t, runs, plain, 4, 1, 30, true)
	files, err := filepath.Glob(filepath.Join(runs, recomputes, "metrics", "rank-*.jsonl"))
	if err != nil || len(files) != 4 {
		t.Fatalf("rank files %v, %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Replace(string(b), `"tp":2}`, `"tp":2,"recompute":"full"}`, 1)
		s = strings.Replace(s, `"flops_per_token":1000000`, `"flops_per_token":1000000,"hardware_flops_per_token":1300000`, 1)
		if s == string(b) || !strings.Contains(s, "hardware_flops_per_token") || !strings.Contains(s, `"recompute":"full"`) {
			t.Fatalf("%s: run line not rewritten:\n%.400s", f, s)
		}
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := rundir.Dir(filepath.Join(runs, recomputes))
	sum, _, err := metrics.ReadSummary(d.Path(), metrics.NoCurves)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Recomputes() || float64(sum.HFU/sum.MFU) != 1.3 {
		t.Fatalf("summary HFU %v, MFU %v: want 1.3 times", sum.HFU, sum.MFU)
	}
	smp := newSampler(d)
	if err := smp.read(); err != nil {
		t.Fatal(err)
	}
	if _, rc := smp.series(sum); !strings.Contains(rc.MFU.Note, "HFU "+pct(sum.HFU)) {
		t.Errorf("MFU chart note %q lacks HFU %s", rc.MFU.Note, pct(sum.HFU))
	}
	ts := newTestServer(t, runs)
	cookie := tokenCookie(ts)
	if _, body := get(t, http.DefaultClient, ts.URL+"/run/"+recomputes, cookie); !strings.Contains(body, `data-key="hfu" data-value="`+exact(sum.HFU)+`"`) {
		t.Errorf("run page lacks the summary's HFU %s", exact(sum.HFU))
	}
	if _, body := get(t, http.DefaultClient, ts.URL+"/run/"+plain, cookie); strings.Contains(body, `data-key="hfu"`) {
		t.Errorf("a run without recomputation shows an HFU")
	}
}
