package train

import (
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// llamaConfig is a small Llama with grouped heads (4 query, 2 key/value)
// on the text of textFile.
func llamaConfig(t *testing.T) config.Config {
	cfg := smallConfig("llama")
	cfg.KVHeads, cfg.FFN, cfg.RopeTheta = 2, 48, 500
	cfg.Data, cfg.CkptEvery = textFile(t), -1
	return cfg
}

// TestLlamaLossCurves trains the Llama from the same seed on the same
// global batch at every layout the engine has: tp, dp, sequence
// parallelism, ZeRO-1, the pipeline, with and without recomputation, tied
// and untied: each curve equals tp1's within 1e-6 relative, and the
// recomputations and ZeRO-1 change no bit.
func TestLlamaLossCurves(t *testing.T) {
	for _, untied := range []bool{false, true} {
		base := llamaConfig(t)
		base.UntiedHead = untied
		base.Layers = 4
		layouts := []struct {
			name                            string
			ntasks, tp, pp, b, micro, accum int
			sp                              bool
			zero                            int
			recompute                       string
		}{
			{"tp1", 1, 1, 0, 16, 0, 1, false, 0, ""},
			{"tp2", 2, 2, 0, 16, 0, 1, false, 0, ""},
			{"tp2+sp", 2, 2, 0, 16, 0, 1, true, 0, ""},
			{"dp2", 2, 1, 0, 8, 0, 1, false, 0, ""},
			{"dp2+zero1", 2, 1, 0, 8, 0, 1, false, 1, ""},
			{"tp2xdp2+sp+zero1", 4, 2, 0, 8, 0, 1, true, 1, ""},
			{"pp2", 2, 1, 2, 4, 4, 1, false, 0, ""},
			{"pp2tp2sp", 4, 2, 2, 4, 4, 1, true, 0, ""},
			{"tp2 selective", 2, 2, 0, 16, 0, 1, false, 0, "selective"},
			{"tp2 full", 2, 2, 0, 16, 0, 1, false, 0, "full"},
		}
		curves := map[string][]float64{}
		exact := map[string]string{"dp2+zero1": "dp2", "tp2 selective": "tp2", "tp2 full": "tp2"}
		for _, l := range layouts {
			if testing.Short() && l.ntasks > 2 {
				continue
			}
			cfg := base
			cfg.NTasks, cfg.TP, cfg.PP, cfg.BatchSize, cfg.MicroBatches, cfg.GradAccum = l.ntasks, l.tp, l.pp, l.b, l.micro, l.accum
			cfg.SP, cfg.Zero, cfg.Recompute = l.sp, l.zero, l.recompute
			res := runInProcess(t, cfg, "")
			name := l.name
			if untied {
				name += " untied"
			}
			if len(res.Losses) != 20 {
				t.Fatalf("%s: %d steps", name, len(res.Losses))
			}
			curves[l.name] = res.Losses
			ref := curves["tp1"]
			if l.name == "tp1" {
				if !(ref[19] < ref[0]-0.5) {
					t.Errorf("%s: the loss does not fall: %v", name, ref)
				}
				continue
			}
			if same := exact[l.name]; same != "" {
				bitIdentical(t, name, res.Losses, same, curves[same])
			}
			sameCurve(t, name, res.Losses, ref)
		}
	}
}
