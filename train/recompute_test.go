package train

import "testing"

// TestRecomputeLossCurves trains each layout without recomputation and
// with selective and full recomputation: the loss curves are the same to
// the bit (the backward runs the same kernels on the same inputs again),
// for the classifier and the language model, unsharded, at tp 2, tp 2
// with sequence parallelism and gradient accumulation, and on a 2-stage
// pipeline whose stages hold several micro-batches in flight.
func TestRecomputeLossCurves(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		base := smallConfig(model)
		base.CkptEvery = -1
		if model == "gpt" {
			base.Data = textFile(t)
		}
		for _, l := range []struct {
			name                     string
			ntasks, tp, pp, b, accum int
			sp                       bool
		}{{"tp1", 1, 1, 0, 8, 1, false}, {"tp2", 2, 2, 0, 8, 1, false}, {"tp2+sp accum2", 2, 2, 0, 4, 2, true}, {"pp2", 2, 1, 2, 4, 1, false}} {
			cfg := base
			cfg.NTasks, cfg.TP, cfg.PP, cfg.BatchSize, cfg.GradAccum, cfg.SP = l.ntasks, l.tp, l.pp, l.b, l.accum, l.sp
			if l.pp > 1 {
				cfg.MicroBatches = 4
			}
			plain := runInProcess(t, cfg, "").Losses
			for _, mode := range []string{"selective", "full"} {
				cfg.Recompute = mode
				bitIdentical(t, model+" "+l.name+" recompute "+mode, runInProcess(t, cfg, "").Losses, "none", plain)
			}
		}
	}
}
