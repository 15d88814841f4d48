package train

import (
	"math"
	"strings"
	"testing"
)

// TestSPZeroLossCurves trains the same model from the same seed on the
// same global batch with sequence parallelism and ZeRO-1 (alone and
// together with tp x dp): every loss curve must equal tp1's to 1e-6
// relative over 20 steps, for the classifier and the language model.
func TestSPZeroLossCurves(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		t.Run(model, func(t *testing.T) {
			base := smallConfig(model)
			if model == "gpt" {
				base.Data = textFile(t)
			}
			layouts := []struct {
				name          string
				ntasks, tp, b int
				sp            bool
				zero          int
			}{
				{"tp1", 1, 1, 16, false, 0},
				{"tp2+sp", 2, 2, 16, true, 0},
				{"dp2+zero1", 2, 1, 8, false, 1},
				{"tp2xdp2+sp+zero1", 4, 2, 8, true, 1},
			}
			var ref []float64
			for _, l := range layouts {
				if testing.Short() && l.ntasks > 2 {
					continue
				}
				cfg := base
				cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.b, l.sp, l.zero
				res := runInProcess(t, cfg, "")
				if len(res.Losses) != 20 {
					t.Fatalf("%s: %d steps", l.name, len(res.Losses))
				}
				if ref == nil {
					ref = res.Losses
					continue
				}
				worst := 0.0
				for i, v := range res.Losses {
					d := math.Abs(v-ref[i]) / math.Abs(ref[i])
					worst = math.Max(worst, d)
					if d > 1e-6 {
						t.Errorf("%s step %d: loss %.8f, tp1 %.8f (relative difference %.2g)", l.name, i+1, v, ref[i], d)
					}
				}
				t.Logf("%s: losses %.4f -> %.4f, largest relative difference from tp1 %.2g", l.name, res.Losses[0], res.Losses[19], worst)
			}
		})
	}
}

// TestSPZeroRefused checks the combinations the config refuses, each with
// a one-line error that names the fix.
func TestSPZeroRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"sp at tp 1", func(c *Config) { c.SP = true }, "sp needs tp > 1"},
		{"sp with seq % tp", func(c *Config) { c.NTasks, c.TP, c.Heads, c.Seq, c.SP = 4, 4, 4, 18, true }, "seq 18 is not a multiple of tp 4"},
		{"zero 2", func(c *Config) { c.NTasks, c.Zero = 2, 2 }, "zero = 2"},
		{"zero at dp 1", func(c *Config) { c.NTasks, c.TP, c.Zero = 2, 2, 1 }, "data-parallel degree > 1"},
		{"zero on cuda", func(c *Config) { c.NTasks, c.Zero, c.Device = 2, 1, "cuda" }, "zero 1 runs on the CPU only"},
	} {
		cfg := smallConfig("gpt")
		tc.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line with %q", tc.name, err, tc.want)
		}
	}
}
