package train

import (
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
)

// BenchStep frees everything it allocates on the device it is given: the
// model, its activations and the optimizer's moments (the same accounting
// that TestGPUBenchStepMatchesCPU checks on a GPU).
func TestBenchStepFreesEverything(t *testing.T) {
	for _, model := range []string{"gpt", "bert"} {
		cfg := config.DefaultConfig()
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

// On a device with the GPU step's operations, BenchStep times the GPU step
// (one host synchronisation a step) and gives the host step's loss.
func TestBenchStepDeviceStep(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.Model, cfg.Tokenizer, cfg.BatchSize, cfg.Seq = "gpt", "byte", 2, 16
	want, err := BenchStep(cfg, tensor.NewCPU(), 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	dev := &hostScalars{CPUDevice: tensor.NewCPU()}
	got, err := BenchStep(cfg, dev, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got.Loss-want.Loss) > 1e-5*want.Loss || got.HostSyncs != 1 || want.HostSyncs != 0 {
		t.Errorf("GPU step: loss %.6f, %d host syncs; host step: %.6f, %d", got.Loss, got.HostSyncs, want.Loss, want.HostSyncs)
	}
	if s := dev.MemStats(); s.Current != 0 {
		t.Errorf("%d bytes still allocated after the GPU step's BenchStep", s.Current)
	}
}
