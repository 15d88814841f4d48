package plan

import (
	"cmp"
	"math"
	"slices"

	"github.com/hpcrun/hpcrun/train/metrics"
)

// Figure is one quantity a plan predicted beside what the run measured.
type Figure struct {
	// Key names the quantity: engine_peak, device_total (only when the
	// ranks sampled the device through NVML), step_s, comm_share,
	// tokens_per_s, mfu.
	Key       string
	Predicted metrics.Float
	Measured  metrics.Float
	ErrorPct  metrics.Float // ErrorPct(Predicted, Measured)
}

// ErrorPct is a prediction's error in percent of what was measured,
// 100*(predicted-measured)/measured, the one convention of hpcrun metrics,
// sweep show and the dashboard: positive when the plan over-estimates.
// It is unknown when either figure is, or when nothing was measured (0).
func ErrorPct(predicted, measured metrics.Float) metrics.Float {
	if !predicted.Known() || !measured.Known() || measured == 0 {
		return metrics.Float(math.NaN())
	}
	return 100 * (predicted - measured) / measured
}

// Compare sets p beside a run's summary s, figure by figure in the order
// of Figure.Key: memory per rank (the largest rank's), then the step
// time (the summary's p50), its communication share (as the engine counts
// it: a pipeline's bubble included), the throughput and the MFU.
func Compare(p *Plan, s metrics.Summary) []Figure {
	var peak, gpuPeak int64
	for _, r := range s.Memory {
		peak, gpuPeak = max(peak, r.EnginePeakBytes), max(gpuPeak, r.GPUPeakBytes)
	}
	measuredBytes := func(v int64) metrics.Float {
		if v <= 0 {
			return metrics.Float(math.NaN()) // no rank recorded it
		}
		return metrics.Float(v)
	}
	fig := func(key string, predicted float64, measured metrics.Float) Figure {
		pf := metrics.Float(predicted)
		return Figure{Key: key, Predicted: pf, Measured: measured, ErrorPct: ErrorPct(pf, measured)}
	}
	figs := []Figure{fig("engine_peak", float64(p.Memory.EnginePeak), measuredBytes(peak))}
	if gpuPeak > 0 {
		figs = append(figs, fig("device_total", float64(p.Memory.Total), metrics.Float(gpuPeak)))
	}
	return append(figs,
		fig("step_s", p.Time.StepS, s.StepP50S),
		fig("comm_share", p.Time.EngineCommS()/p.Time.StepS, s.CommShare),
		fig("tokens_per_s", p.Time.TokensPerS, s.TokensPerS),
		fig("mfu", p.Time.MFU, s.MFU),
	)
}

// Ranks ranks values from the largest (1) down, equal ones in their
// order; an unknown value has rank 0 and takes no place.
func Ranks(values []metrics.Float) []int {
	idx := make([]int, 0, len(values))
	for i, v := range values {
		if v.Known() {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(values[b], values[a]) })
	ranks := make([]int, len(values))
	for r, i := range idx {
		ranks[i] = r + 1
	}
	return ranks
}
