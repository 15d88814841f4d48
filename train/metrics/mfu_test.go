package metrics

import (
	"math"
	"os"
	"path/filepath"
	"testing"
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
