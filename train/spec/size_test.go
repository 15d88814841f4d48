package spec

import (
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// GPT-2 124M's FLOPs a token against numbers worked out by hand from the
// definition (checked with python3), not from the code: N = 124,439,808
// parameters at vocab 50257 (tied), 124,475,904 with the 47 rows that pad
// the table to 50304; the blocks hold 12 x (12 x 768^2 + 13 x 768) =
// 85,054,464 of them. Model FLOPs are 6N + 12 x 12 x 1024 x 768; selective
// recomputation adds attention's forward, 4 x 12 x 1024 x 768 =
// 37,748,736; full adds that and 2 x 85,054,464.
func TestFlopsPerTokenGPT2(t *testing.T) {
	const (
		params   = 124_475_904 // 124,439,808 + 47 x 768
		model    = 860_101_632 // 6 x 124,475,904 + 113,246,208
		attnFwd  = 37_748_736
		blockFwd = 170_108_928
	)
	for _, c := range []struct {
		recompute string
		hardware  float64
	}{
		{"none", model},
		{"selective", model + attnFwd},       // 897,850,368
		{"full", model + attnFwd + blockFwd}, // 1,067,959,296
	} {
		cfg := config.DefaultConfig()
		if err := cfg.ApplyPreset("gpt2-124m"); err != nil {
			t.Fatal(err)
		}
		cfg.Recompute = c.recompute
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := ParamCount(cfg, 50257); got != params {
			t.Errorf("%d parameters, want %d", got, params)
		}
		if got := ModelFlopsPerToken(cfg, 50257); got != model {
			t.Errorf("recompute %s: model FLOPs a token %.0f, want %.0f (recomputation does not count)", c.recompute, got, float64(model))
		}
		if got := HardwareFlopsPerToken(cfg, 50257); got != c.hardware {
			t.Errorf("recompute %s: hardware FLOPs a token %.0f, want %.0f", c.recompute, got, c.hardware)
		}
	}
}

// Full recomputation runs each block's forward once more: hardware FLOPs
// are 8 a block parameter and 16*layers*seq*dim of attention where the
// model's are 6 and 12, the rest (the head, the position table) alike,
// for a Llama with grouped-query attention and an untied head as for a
// GPT.
func TestHardwareFlopsFullRecompute(t *testing.T) {
	for _, preset := range []string{"gpt2-124m", "smollm-135m", "llama-1b"} {
		cfg := config.DefaultConfig()
		if err := cfg.ApplyPreset(preset); err != nil {
			t.Fatal(err)
		}
		cfg.Recompute, cfg.UntiedHead = "full", cfg.Model == "llama"
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		vocab := 50257
		if cfg.Model == "llama" {
			vocab = 49152
		}
		blocks := float64(int64(cfg.Layers) * blockParams(cfg))
		attn := float64(cfg.Layers * cfg.Seq * cfg.Dim)
		rest := ModelFlopsPerToken(cfg, vocab) - 6*blocks - 12*attn
		if rest <= 0 {
			t.Fatalf("%s: %g FLOPs a token outside the blocks", preset, rest)
		}
		if got, want := HardwareFlopsPerToken(cfg, vocab), 8*blocks+16*attn+rest; got != want {
			t.Errorf("%s: hardware FLOPs a token %.0f, want 8 x %.0f + 16 x %.0f + %.0f = %.0f", preset, got, blocks, attn, rest, want)
		}
	}
}

// The Llama presets count the published models' parameters exactly
// (SmolLM-135M: 134,515,008; Llama 3.2 1B: 1,235,814,400, both tied), and
// the FLOPs are 6 a parameter plus attention's, an untied head's table
// not counted as a product.
func TestLlamaParamCount(t *testing.T) {
	for _, tc := range []struct {
		preset string
		vocab  int
		want   int64
	}{{"smollm-135m", 49152, 134515008}, {"llama-1b", 128256, 1235814400}} {
		c := config.DefaultConfig()
		if err := c.ApplyPreset(tc.preset); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := ParamCount(c, tc.vocab); got != tc.want {
			t.Errorf("%s: %d parameters, want %d", tc.preset, got, tc.want)
		}
		if got, want := ModelFlopsPerToken(c, tc.vocab), 6*float64(tc.want)+12*float64(c.Layers*c.Seq*c.Dim); got != want {
			t.Errorf("%s: %g FLOPs a token, want %g", tc.preset, got, want)
		}
		c.UntiedHead = true
		if got, want := ModelFlopsPerToken(c, tc.vocab), 6*float64(tc.want)+12*float64(c.Layers*c.Seq*c.Dim); got != want {
			t.Errorf("%s untied: %g FLOPs a token, want %g (the table is looked up)", tc.preset, got, want)
		}
		if got := ParamCount(c, tc.vocab); got != tc.want+int64(tc.vocab*c.Dim) {
			t.Errorf("%s untied: %d parameters, want %d", tc.preset, got, tc.want+int64(tc.vocab*c.Dim))
		}
	}
}
