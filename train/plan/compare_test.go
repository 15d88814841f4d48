package plan

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/hpcrun/hpcrun/train/metrics"
)

func TestErrorPct(t *testing.T) {
	nan := metrics.Float(math.NaN())
	for _, c := range []struct {
		predicted, measured metrics.Float
		want                float64 // NaN: unknown
	}{
		{800, 1000, -20},
		{1100, 1000, 10},
		{1000, 1000, 0},
		{0, 0.25, -100}, // a plan of no communication against some
		{1000, 0, math.NaN()},
		{nan, 1000, math.NaN()},
		{1000, nan, math.NaN()},
		{metrics.Float(math.Inf(1)), 1000, math.NaN()},
	} {
		got := ErrorPct(c.predicted, c.measured)
		if math.IsNaN(c.want) {
			if got.Known() {
				t.Errorf("ErrorPct(%v, %v) = %v, want unknown", c.predicted, c.measured, got)
			}
		} else if !got.Known() || math.Abs(float64(got)-c.want) > 1e-9 {
			t.Errorf("ErrorPct(%v, %v) = %v, want %v", c.predicted, c.measured, got, c.want)
		}
	}
}

func TestCompare(t *testing.T) {
	p := &Plan{Memory: Memory{EnginePeak: 1100, Total: 1500},
		// A pipeline's: its comm share as the engine counts it takes in
		// the bubble, (0.06 + 0.04) / 0.5.
		Time: Time{StepS: 0.5, CommS: 0.06, BubbleS: 0.04, CommShare: 0.12, TokensPerS: 800, MFU: 0.3}}
	s := metrics.Summary{
		Memory:     []metrics.RankMemory{{Rank: 0, EnginePeakBytes: 900}, {Rank: 1, EnginePeakBytes: 1000}},
		StepP50S:   0.4,
		CommShare:  metrics.Float(math.NaN()),
		TokensPerS: 1000,
		MFU:        0.4,
	}
	type want struct {
		predicted, measured, errPct float64 // NaN: unknown
	}
	nan := math.NaN()
	check := func(figs []Figure, wants map[string]want, order []string) {
		t.Helper()
		if len(figs) != len(order) {
			t.Fatalf("%d figures, want %d (%v)", len(figs), len(order), order)
		}
		same := func(a metrics.Float, b float64) bool {
			return !a.Known() && math.IsNaN(b) || a.Known() && math.Abs(float64(a)-b) < 1e-9
		}
		for i, f := range figs {
			w := wants[f.Key]
			if f.Key != order[i] || !same(f.Predicted, w.predicted) || !same(f.Measured, w.measured) || !same(f.ErrorPct, w.errPct) {
				t.Errorf("figure %d: %+v, want %s %+v", i, f, order[i], w)
			}
		}
	}
	wants := map[string]want{
		"engine_peak":  {1100, 1000, 10},
		"step_s":       {0.5, 0.4, 25},
		"comm_share":   {0.2, nan, nan},
		"tokens_per_s": {800, 1000, -20},
		"mfu":          {0.3, 0.4, -25},
		"device_total": {1500, 2000, -25},
	}
	check(Compare(p, s), wants, []string{"engine_peak", "step_s", "comm_share", "tokens_per_s", "mfu"})

	// NVML samples add the device's memory; a run that recorded no
	// engine peak has it unknown, not 0.
	s.Memory = []metrics.RankMemory{{Rank: 0, GPUPeakBytes: 2000}}
	wants["engine_peak"] = want{1100, nan, nan}
	check(Compare(p, s), wants, []string{"engine_peak", "device_total", "step_s", "comm_share", "tokens_per_s", "mfu"})
}

// TestRanks: the largest first, equal ones in their order, unknown none.
func TestRanks(t *testing.T) {
	nan := metrics.Float(math.NaN())
	got := Ranks([]metrics.Float{10, nan, 30, 10, 20})
	if want := []int{3, 0, 1, 4, 2}; !slices.Equal(got, want) {
		t.Errorf("Ranks = %v, want %v", got, want)
	}
}

// The summary reads the peak of a plan as meta.json keeps it (the Plan
// marshalled): the two must agree on where it is.
func TestPlanPeakReadBack(t *testing.T) {
	b, err := json.Marshal(&Plan{Device: Device{Name: "h100-80", CUDA: true}, Time: Time{PeakFlops: 4.9e14}})
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if peak, cuda := (metrics.Meta{Raw: map[string]any{"plan": raw}}).PlanPeak(); peak != 4.9e14 || !cuda {
		t.Errorf("PlanPeak of a marshalled plan = %g, %v; want 4.9e14, true", peak, cuda)
	}
}
