package metrics

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"

	"github.com/hpcrun/hpcrun/train/spec"
)

func TestMFU(t *testing.T) {
	for _, c := range []struct {
		name                    string
		flopsPerToken, tokS, pk float64
		world                   int
		want                    float64 // NaN: unknown
	}{
		{"one device", 6e9, 1e3, 1e13, 1, 0.6},
		{"peak of every rank", 6e9, 1e3, 1e13, 4, 0.15},
		{"no tokens yet", 6e9, 0, 1e13, 2, 0},
		{"no flops per token", 0, 1e3, 1e13, 1, math.NaN()},
		{"no peak (a CPU run)", 6e9, 1e3, 0, 1, math.NaN()},
		{"no world", 6e9, 1e3, 1e13, 0, math.NaN()},
		{"unknown throughput", 6e9, math.NaN(), 1e13, 1, math.NaN()},
	} {
		got := MFU(c.flopsPerToken, c.tokS, c.pk, c.world)
		if math.IsNaN(c.want) != math.IsNaN(got) || !math.IsNaN(c.want) && math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: MFU = %v, want %v", c.name, got, c.want)
		}
	}
}

// The summary's MFU is MFU of its own throughput: one rule, bit for bit.
func TestSummaryMFUIsMFU(t *testing.T) {
	s := Summary{TokensPerS: 1234.5, MFU: nanF, ModelFlopsPerS: nanF}
	info := &RunInfo{FlopsPerToken: 7.1e8, PeakFlops: 3.3e12}
	s.flops(info, Meta{}, 3)
	if want := MFU(info.FlopsPerToken, 1234.5, info.PeakFlops, 3); float64(s.MFU) != want {
		t.Errorf("summary MFU %v, MFU() %v", s.MFU, want)
	}
	s = Summary{TokensPerS: 1234.5, MFU: nanF, ModelFlopsPerS: nanF}
	s.flops(&RunInfo{FlopsPerToken: 7.1e8}, Meta{}, 3)
	if s.MFU.Known() || !s.ModelFlopsPerS.Known() {
		t.Errorf("without a peak: MFU %v (want unknown), model FLOP/s %v (want known)", s.MFU, s.ModelFlopsPerS)
	}
}

// A run whose meta.json keeps a plan has its MFU over the plan's peak,
// read by both readers, so that hpcrun plan's MFU and the run's are over
// one peak; a plan made for a GPU does not price a CPU run's.
func TestSummaryMFUOverPlanPeak(t *testing.T) {
	src := filepath.Join("testdata", "runs", "20261121-143005-a3f9") // 4 CPU ranks, no peak in their run lines
	for _, c := range []struct {
		name     string
		plan     string
		wantPeak float64 // 0: unknown
	}{
		{"CPU plan", `{"device":{"name":"cpu","cuda":false},"time":{"peak_flops":1.5e11}}`, 1.5e11},
		{"GPU plan of a CPU run", `{"device":{"name":"h100-80","cuda":true},"time":{"peak_flops":6.7e13}}`, 0},
		{"no plan", ``, 0},
	} {
		dir := filepath.Join(t.TempDir(), "20261121-143005-a3f9")
		mustOK(t, os.CopyFS(dir, os.DirFS(src)))
		meta := `{"execid":"20261121-143005-a3f9"}`
		if c.plan != "" {
			meta = `{"execid":"20261121-143005-a3f9","plan":` + c.plan + `}`
		}
		mustOK(t, os.WriteFile(filepath.Join(dir, "meta.json"), []byte(meta), 0o644))
		streamed, _, err := ReadSummary(dir, NoCurves)
		mustOK(t, err)
		run, err := ReadRun(dir)
		mustOK(t, err)
		whole, _ := Summarize(run)
		for _, s := range []Summary{streamed, whole} {
			if !s.ModelFlopsPerS.Known() {
				t.Fatalf("%s: model FLOP/s unknown", c.name)
			}
			if c.wantPeak == 0 {
				if s.PeakFlops.Known() || s.MFU.Known() {
					t.Errorf("%s: peak %v, MFU %v, want both unknown", c.name, s.PeakFlops, s.MFU)
				}
				continue
			}
			want := float64(s.ModelFlopsPerS) / (c.wantPeak * 4)
			if float64(s.PeakFlops) != c.wantPeak || math.Abs(float64(s.MFU)-want) > 1e-15 {
				t.Errorf("%s: peak %v, MFU %v, want %g and %g", c.name, s.PeakFlops, s.MFU, c.wantPeak, want)
			}
		}
	}
}

// A run that recomputes shows HFU beside MFU: MFU's rule over the
// hardware FLOPs, so that HFU/MFU is their ratio, for GPT-2 124M under
// full recomputation 1,067,959,296 / 860,101,632 (worked out by hand in
// config's TestFlopsPerTokenGPT2). A run that does not, or whose run line
// has no hardware FLOPs (an older hpcrun), shows MFU alone.
func TestSummaryHFU(t *testing.T) {
	for _, c := range []struct {
		recompute string
		hardware  bool // the run line has hardware_flops_per_token
		wantRatio float64
	}{
		{"full", true, 1067959296.0 / 860101632.0},
		{"selective", true, 897850368.0 / 860101632.0},
		{"none", true, 1},
		{"full", false, math.NaN()},
	} {
		cfg := config.DefaultConfig()
		mustOK(t, cfg.ApplyPreset("gpt2-124m"))
		cfg.Recompute = c.recompute
		mustOK(t, cfg.Validate())
		info := &RunInfo{FlopsPerToken: spec.ModelFlopsPerToken(cfg, 50257), PeakFlops: 989e12}
		if c.hardware {
			info.HardwareFlopsPerToken = spec.HardwareFlopsPerToken(cfg, 50257)
		}
		s := Summary{Step: 10, TokensPerS: 4e5, MFU: nanF, HFU: nanF, ModelFlopsPerS: nanF, PeakFlops: nanF,
			Config: RunConfig{Recompute: c.recompute, NTasks: 8}}
		s.flops(info, Meta{}, 8)
		if got := float64(s.HFU / s.MFU); math.IsNaN(c.wantRatio) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-c.wantRatio) > 1e-15 {
			t.Errorf("recompute %s: HFU %v / MFU %v = %v, want %v", c.recompute, s.HFU, s.MFU, got, c.wantRatio)
		}
		var b strings.Builder
		mustOK(t, WriteSummary(&b, s))
		hfuLine := "HFU " + pct(s.HFU) + ": the forward that recompute " + c.recompute + " runs again counted"
		if shown := strings.Contains(b.String(), hfuLine); shown != (c.hardware && c.recompute != "none") {
			t.Errorf("recompute %s: HFU line %q shown %v:\n%s", c.recompute, hfuLine, shown, b.String())
		}
		if n := strings.Count(b.String(), "HFU"); n > 1 {
			t.Errorf("recompute %s: HFU on %d lines:\n%s", c.recompute, n, b.String())
		}
	}
}
