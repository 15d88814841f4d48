package metrics

import "math"

// MFU is model FLOPs utilisation, the one rule the summary, the plan and
// the dashboard's per-step chart share: the model's training FLOPs per
// token (forward plus backward, the whole model) times the tokens per
// second of the run, over world devices of peakFlops each. It is NaN
// (unknown) without FLOPs per token, a peak or a world.
func MFU(flopsPerToken, tokensPerS, peakFlops float64, world int) float64 {
	if flopsPerToken <= 0 || peakFlops <= 0 || world <= 0 {
		return math.NaN()
	}
	return flopsPerToken * tokensPerS / (peakFlops * float64(world))
}

// HFU is hardware FLOPs utilisation: MFU's rule over the FLOPs the devices
// run, the forward that activation recomputation runs again counted
// (spec.HardwareFlopsPerToken); without recomputation it is MFU.
func HFU(hardwareFlopsPerToken, tokensPerS, peakFlops float64, world int) float64 {
	return MFU(hardwareFlopsPerToken, tokensPerS, peakFlops, world)
}
