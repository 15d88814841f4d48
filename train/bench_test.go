package train

import (
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

// BenchStep frees everything it allocates on the device it is given: the
// model, its activations and the optimizer's moments (the same accounting
// that TestGPUBenchStepMatchesCPU checks on a GPU).
func TestBenchStepFreesEverything(t *testing.T) {
	for _, model := range []string{"gpt", "bert"} {
		cfg := DefaultConfig()
		if err := cfg.ApplyPreset("tiny"); err != nil {
			t.Fatal(err)
		}
		cfg.Model, cfg.Tokenizer, cfg.BatchSize, cfg.Seq = model, "byte", 2, 16
		dev := tensor.NewCPU()
		if _, err := BenchStep(cfg, dev, 0, 1); err != nil {
			t.Fatal(err)
		}
		if s := dev.MemStats(); s.Current != 0 || s.Peak == 0 {
			t.Errorf("%s: after BenchStep %d bytes still allocated (peak %d), want 0", model, s.Current, s.Peak)
		}
	}
}
