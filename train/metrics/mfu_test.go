package metrics

import (
	"math"
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
	s.flops(info, 3)
	if want := MFU(info.FlopsPerToken, 1234.5, info.PeakFlops, 3); float64(s.MFU) != want {
		t.Errorf("summary MFU %v, MFU() %v", s.MFU, want)
	}
	s = Summary{TokensPerS: 1234.5, MFU: nanF, ModelFlopsPerS: nanF}
	s.flops(&RunInfo{FlopsPerToken: 7.1e8}, 3)
	if s.MFU.Known() || !s.ModelFlopsPerS.Known() {
		t.Errorf("without a peak: MFU %v (want unknown), model FLOP/s %v (want known)", s.MFU, s.ModelFlopsPerS)
	}
}
