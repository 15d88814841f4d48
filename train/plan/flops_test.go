package plan

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"

	"github.com/hpcrun/hpcrun/train/spec"
)

// gpt2Config is GPT-2 124M (seq 1024, vocab 50257) with recompute, one
// rank.
func gpt2Config(t *testing.T, recompute string) config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("gpt2-124m"); err != nil {
		t.Fatal(err)
	}
	cfg.Recompute, cfg.BatchSize = recompute, 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The products a step runs (StepGemms, the engine's own calls by
// TestStepGemmsAreTheEngines) are the hardware FLOPs a token of config's
// definition, recomputation's forward included, but for the biases, norms
// and position table, which are no products: 0.6% of GPT-2 124M's.
// Recomputation's forward is 3.5% (selective) and 19% (full) of them,
// past that gap.
func TestStepGemmsAreHardwareFlops(t *testing.T) {
	for _, rc := range []string{"none", "selective", "full"} {
		cfg := gpt2Config(t, rc)
		gs, err := StepGemms(cfg, 50257)
		if err != nil {
			t.Fatal(err)
		}
		perToken := gemmFlops(gs) / float64(cfg.BatchSize*cfg.Seq)
		hw := spec.HardwareFlopsPerToken(cfg, 50257)
		if gap := 1 - perToken/hw; gap < 0 || gap > 0.007 {
			t.Errorf("recompute %s: the step's GEMMs are %.0f FLOPs a token, config's hardware FLOPs %.0f: %.2f%% apart, want 0 to 0.7%%",
				rc, perToken, hw, 100*gap)
		}
	}
}

// A plan's MFU and HFU are over config's two counts: HFU/MFU is hardware
// over model FLOPs, for GPT-2 124M under full recomputation 1,067,959,296 /
// 860,101,632 (config's TestFlopsPerTokenGPT2), and hpcrun plan shows HFU
// on a line of its own only when the run recomputes.
func TestPlanHFU(t *testing.T) {
	for _, c := range []struct {
		recompute string
		ratio     float64
	}{{"none", 1}, {"selective", 897850368.0 / 860101632.0}, {"full", 1067959296.0 / 860101632.0}} {
		cfg := gpt2Config(t, c.recompute)
		dev, _ := LookupDevice("h100-80")
		p, err := New(Request{Config: cfg, Vocab: 50257, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		if p.Time.FlopsPerToken != spec.ModelFlopsPerToken(cfg, 50257) || p.Time.HardwareFlopsPerToken != spec.HardwareFlopsPerToken(cfg, 50257) {
			t.Errorf("recompute %s: FLOPs a token %g model, %g hardware; want config's", c.recompute, p.Time.FlopsPerToken, p.Time.HardwareFlopsPerToken)
		}
		if got := p.Time.HFU / p.Time.MFU; math.Abs(got-c.ratio) > 1e-15 {
			t.Errorf("recompute %s: HFU %g / MFU %g = %.17g, want %.17g", c.recompute, p.Time.HFU, p.Time.MFU, got, c.ratio)
		}
		var b bytes.Buffer
		if err := p.WriteText(&b, nil); err != nil {
			t.Fatal(err)
		}
		if shown := strings.Contains(b.String(), "  HFU "); shown != (c.recompute != "none") {
			t.Errorf("recompute %s: HFU line shown %v:\n%s", c.recompute, shown, b.String())
		}
	}
}

// A plan at scale counts MFU and HFU as a run does, with Megatron-LM's
// full recomputation; the paper's own FLOPs, which its TFLOP/s are set
// beside the table in, are those hardware FLOPs but for the biases, norms
// and position table it leaves out (under 0.5% for every row).
func TestAtScaleHFU(t *testing.T) {
	c, err := LookupCluster("dgx-a100-superpod")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range PaperTable {
		cfg := paperLayout(r)
		cfg.Recompute = "full"
		hw := spec.HardwareFlopsPerToken(cfg, PaperVocab)
		paper := PaperFlops(1, PaperSeq, r.Layers, r.Dim, PaperVocab) / PaperSeq
		if gap := 1 - paper/hw; gap < 0 || gap > 0.005 {
			t.Errorf("%.1fB: the paper's FLOPs a token %.4g, config's hardware %.4g: %.2f%% apart", r.ParamsB, paper, hw, 100*gap)
		}
		if i > 0 {
			continue
		}
		cfg.Recompute = "" // the plan at scale recomputes in full whatever the flag
		p, err := AtScale(ScaleRequest{Config: cfg, Vocab: PaperVocab, Cluster: c})
		if err != nil {
			t.Fatal(err)
		}
		if p.Time.HardwareFlopsPerToken != hw {
			t.Errorf("%.1fB: hardware FLOPs a token %g, want config's under full recomputation %g", r.ParamsB, p.Time.HardwareFlopsPerToken, hw)
		}
		if got, want := p.Time.HFU/p.Time.MFU, hw/spec.ModelFlopsPerToken(cfg, PaperVocab); math.Abs(got-want) > 1e-15 {
			t.Errorf("%.1fB: HFU/MFU %g, want %g", r.ParamsB, got, want)
		}
	}
}
