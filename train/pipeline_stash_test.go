package train

import (
	"sync/atomic"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/data"
)

// TestPipelineForwardsOnce counts the forwards each stage runs in a step,
// from the matrix products its device sees (one fused Q,K,V projection
// per block and forward; the step's share is the difference of a 3-step
// and a 1-step run, which validate alike): every stage runs each of the
// step's micro-batches forward exactly once, holding the activations of
// those in flight instead of running a forward again before a backward.
func TestPipelineForwardsOnce(t *testing.T) {
	for _, tc := range []struct {
		model      string
		pp, layers int
	}{{"gpt", 2, 4}, {"gpt", 4, 4}, {"bert", 2, 4}} {
		cfg := smallConfig(tc.model)
		if tc.model == "gpt" {
			cfg.Data = textFile(t)
		}
		cfg.NTasks, cfg.PP, cfg.Layers, cfg.MicroBatches, cfg.BatchSize, cfg.CkptEvery, cfg.EvalEvery = tc.pp, tc.pp, tc.layers, 4, 2, -1, 0
		ds, err := data.Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		qkvForwards := func(steps int) []int64 {
			c := cfg
			c.Steps = steps
			n := make([]atomic.Int64, c.NTasks)
			_, err := runRanks(t, c, ds, func(rank int) Options {
				dev := tensor.NewCPU()
				dev.ObserveGemm(func(g tensor.GemmShape) {
					if !g.TransA && g.TransB && g.N == 3*c.Dim && g.K == c.Dim {
						n[rank].Add(1)
					}
				})
				return Options{Device: dev}
			})
			if err != nil {
				t.Fatalf("%s pp %d: %v", tc.model, tc.pp, err)
			}
			out := make([]int64, len(n))
			for r := range n {
				out[r] = n[r].Load()
			}
			return out
		}
		one, three := qkvForwards(1), qkvForwards(3)
		blocks := int64(tc.layers / tc.pp)
		for s := range tc.pp {
			if got := (three[s] - one[s]) / 2 / blocks; got != int64(cfg.MicroBatches) {
				t.Errorf("%s pp %d stage %d: %d forwards a step, want %d (one per micro-batch)", tc.model, tc.pp, s, got, cfg.MicroBatches)
			}
		}
	}
}
