package train

import (
	"fmt"
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// TestEvalIsExactMean checks that a validation pass reports the exact mean
// loss and accuracy over the real samples, although the set does not fill
// its last batches and is split unevenly over the DP ranks (13 samples,
// batch 4, dp 2: 7 and 6 samples, each rank's last batch padded with
// repeats), with and without tensor parallelism. The reference runs every
// sample alone, as a batch of B copies of itself, whose mean loss is that
// sample's loss.
func TestEvalIsExactMean(t *testing.T) {
	for _, tc := range []struct {
		model      string
		ntasks, tp int
	}{{"bert", 2, 1}, {"gpt", 2, 1}, {"bert", 4, 2}, {"gpt", 4, 2}} {
		model := tc.model
		t.Run(fmt.Sprintf("%s/tp%d", model, tc.tp), func(t *testing.T) {
			cfg := smallConfig(model)
			if model == "gpt" {
				cfg.Data = textFile(t)
			}
			cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.EvalSamples, cfg.LR = tc.ntasks, tc.tp, 4, 13, 3e-3
			ds, err := data.Prepare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if n := ds.Val.Len(); n != 13 {
				t.Fatalf("%d validation samples, want 13", n)
			}
			got := make([]EvalResult, cfg.NTasks)
			want := make([]EvalResult, cfg.NTasks)
			err = nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
				tr, err := newTrainer(cfg, c, Options{Data: ds}, nil)
				if err != nil {
					return err
				}
				defer tr.close()
				// A few steps so that the samples' losses differ.
				for step := 0; step < 8; step++ {
					if _, err := tr.trainStep(step); err != nil {
						return err
					}
				}
				if got[c.Rank()], err = tr.evaluate(8); err != nil {
					return err
				}
				want[c.Rank()], err = sampleBySample(tr, cfg)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for r := range got {
				g, w := got[r], want[r]
				if d := math.Abs(g.Loss - w.Loss); d > 1e-5*math.Max(1, w.Loss) {
					t.Errorf("rank %d: eval loss %.7f, exact mean over the 13 samples %.7f", r, g.Loss, w.Loss)
				}
				if model == "bert" && math.Abs(g.Accuracy-w.Accuracy) > 1e-6 {
					t.Errorf("rank %d: eval accuracy %.6f, exact %.6f", r, g.Accuracy, w.Accuracy)
				}
				if model == "gpt" && !math.IsNaN(g.Accuracy) {
					t.Errorf("rank %d: accuracy %v for a language model, want NaN", r, g.Accuracy)
				}
			}
		})
	}
}

// sampleBySample is the validation loss and accuracy of tr's model computed
// one sample at a time, in float64.
func sampleBySample(tr *trainer, cfg config.Config) (EvalResult, error) {
	val := tr.data.Val
	idx := make([]int, cfg.BatchSize)
	var b data.Batch
	var loss, correct float64
	for i := 0; i < val.Len(); i++ {
		for j := range idx {
			idx[j] = i
		}
		val.Gather(&b, idx)
		l, err := tr.model.Forward(&b, false)
		if err != nil {
			return EvalResult{}, err
		}
		loss += l
		if pred := tr.model.Predictions(); pred != nil && pred[0] == b.Labels[0] {
			correct++
		}
	}
	n := float64(val.Len())
	e := EvalResult{Loss: loss / n, Accuracy: math.NaN()}
	if cfg.Model == "bert" {
		e.Accuracy = correct / n
	}
	return e, nil
}
