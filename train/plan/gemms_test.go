package plan

import (
	"fmt"
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/config"
)

// TestStepGemmsAreTheEngines runs a step of a small GPT at tp 1 and
// checks that the products the plan prices (StepGemms) are the engine's
// calls, shape for shape and count for count (tensor.CPUDevice.ObserveGemm).
func TestStepGemmsAreTheEngines(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("small"); err != nil {
		t.Fatal(err)
	}
	cfg.Layers, cfg.BatchSize, cfg.Seq = 2, 2, 16
	cpu := tensor.NewCPU()
	seen := map[tensor.GemmShape]int{}
	cpu.ObserveGemm(func(g tensor.GemmShape) { seen[g]++ })
	if _, err := train.BenchStep(cfg, cpu, 0, 1); err != nil {
		t.Fatal(err)
	}
	cfg.NTasks, cfg.TP, cfg.GradAccum = 1, 1, 1
	gs, err := StepGemms(cfg, 256) // BenchStep's vocabulary without a tokenizer
	if err != nil {
		t.Fatal(err)
	}
	want := map[tensor.GemmShape]int{}
	for _, g := range gs {
		g.Batch = max(g.Batch, 1)
		want[g.GemmShape] += g.Count
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("the engine ran %v\nthe plan prices %v", seen, want)
	}
}

// TestGemmFlops: the products' FLOPs are the model's, 6 N x the block's
// weights and 12 B T^2 C for attention (over tp), what recomputation
// runs again, and the head's.
func TestGemmFlops(t *testing.T) {
	for _, tt := range []struct {
		model, recompute string
		tp               int
	}{{"gpt", "", 1}, {"gpt", "", 2}, {"gpt", "selective", 2}, {"gpt", "full", 1}, {"llama", "", 2}, {"bert", "", 2}} {
		cfg := config.DefaultConfig()
		cfg.Model = tt.model
		if tt.model == "llama" {
			if err := cfg.ApplyPreset("llama-tiny"); err != nil {
				t.Fatal(err)
			}
		}
		cfg.NTasks, cfg.TP, cfg.Recompute = tt.tp, tt.tp, tt.recompute
		s, err := newShapes(cfg, 512, 0, cfg.Layers, cfg.NTasks, false)
		if err != nil {
			t.Fatal(err)
		}
		N, C, T, B, tp := float64(s.N), float64(s.C), float64(s.T), float64(s.B), float64(s.tp)
		w := 12 * C * C
		if s.llama {
			qkv := float64(cfg.Heads+2*cfg.KVHeadCount()) * C / float64(cfg.Heads)
			w = qkv*C + C*C + 3*float64(cfg.Hidden())*C
		}
		want := float64(s.L) * (6*N*w + 12*B*T*T*C) / tp
		switch tt.recompute {
		case "selective":
			want += float64(s.L) * 4 * B * T * T * C / tp
		case "full":
			want += float64(s.L) * (2*N*w + 4*B*T*T*C) / tp
		}
		if s.gpt {
			want += 6 * N * C * float64(s.vl)
		} else {
			want += 4*B*N*C + 6*B*C*float64(s.cl)
		}
		if got := gemmFlops(s.gemms()); math.Abs(got-want) > 1e-6*want {
			t.Errorf("%s tp %d recompute %q: %g FLOPs, want %g", tt.model, tt.tp, tt.recompute, got, want)
		}
	}
}

// TestCalibrateElementwise: a step that took its GEMMs' time, the
// optimizer's and its activation and gradient-zeroing bytes at 3 GB/s
// gives 3 GB/s back, and the plan of that step at 3 GB/s takes it; one
// that took less than its GEMMs, 0.
func TestCalibrateElementwise(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("small"); err != nil {
		t.Fatal(err)
	}
	r := testRates()
	s, err := newShapes(cfg, 256, 0, cfg.Layers, cfg.NTasks, false)
	if err != nil {
		t.Fatal(err)
	}
	dev := Device{Rates: r, Threads: 2, Cores: 2}
	p := float64(s.paramElems) * f32
	step := dev.gemmSeconds(s.gemms()) + 7*p/16e9 + (p+activationTouches*float64(s.activationBytes()))/3e9
	if got, err := CalibrateElementwise(cfg, 256, step, r, 2); err != nil || math.Abs(got-3) > 1e-9 {
		t.Errorf("CalibrateElementwise = %g GB/s, %v; want 3", got, err)
	}
	dev.Name, dev.FP32Flops, dev.MemBandwidth, dev.OptBandwidth, dev.MemBytes = "cpu", 1e11, 3e9, 16e9, 8*gib
	pl, err := New(Request{Config: cfg, Vocab: 256, Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(pl.Time.StepS-step) > 1e-12 {
		t.Errorf("the plan of the calibrated step takes %v s, want %v", pl.Time.StepS, step)
	}
	if got, err := CalibrateElementwise(cfg, 256, dev.gemmSeconds(s.gemms())/2, r, 2); err != nil || got != 0 {
		t.Errorf("a step faster than its GEMMs: %g, %v; want 0", got, err)
	}
	if _, err := CalibrateElementwise(cfg, 256, step, r, 3); err == nil {
		t.Error("calibrated at 3 threads, not measured")
	}
}
