package train

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/interop"
)

// generateTraced runs generate at tp with or without the key/value cache
// and returns rank 0's tokens and trace (every rank's tokens must agree).
func generateTraced(t *testing.T, opt GenerateOptions, tp int, cached bool) ([]int, *genTrace) {
	t.Helper()
	outs := make([][]int, tp)
	traces := make([]*genTrace, tp)
	err := nccl.RunInProcess(tp, func(c nccl.Comm) error {
		tr := &genTrace{keep: true}
		ids, err := generate(context.Background(), c, opt, cached, tr)
		outs[c.Rank()], traces[c.Rank()] = ids, tr
		return err
	})
	if err != nil {
		t.Fatalf("tp %d cached %v: %v", tp, cached, err)
	}
	for r := range outs {
		if !reflect.DeepEqual(outs[r], outs[0]) {
			t.Fatalf("tp %d cached %v: rank %d drew %v, rank 0 %v", tp, cached, r, outs[r], outs[0])
		}
	}
	return outs[0], traces[0]
}

// TestGenerateKVCache: greedy generation with the key/value cache draws the
// tokens of the uncached path (the whole window forwarded at every step),
// and every step's logits agree within 1e-5, for GPT-2 and for a Llama
// with grouped-query heads and Llama 3's rope scaling, at tp 1 and 2; one
// run outgrows the model's positions (the cache is filled again from the
// last window). The cached path forwards prompt + tokens - 1 positions
// (linear), the uncached one window * tokens.
func TestGenerateKVCache(t *testing.T) {
	py := numpyPython(t)
	gpt := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})
	llama := makeTinyLlama(t, py, "--dtype", "float32", "--llama3-rope", "--positions", "32")
	for _, tc := range []struct {
		name, dir string
		tokens    int
		overflow  bool
	}{
		{"gpt", gpt, 20, false},
		{"gpt past its positions", gpt, 70, true},
		{"llama", llama, 16, false},
		{"llama past its positions", llama, 40, true},
	} {
		for _, tp := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s tp %d", tc.name, tp), func(t *testing.T) {
				opt := GenerateOptions{Source: tc.dir, Prompt: "alpha beta", Tokens: tc.tokens, Device: "cpu"}
				want, old := generateTraced(t, opt, tp, false)
				got, kv := generateTraced(t, opt, tp, true)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("cached drew %v, uncached %v", got, want)
				}
				if len(kv.logits) != tc.tokens || len(old.logits) != tc.tokens {
					t.Fatalf("%d and %d steps of logits for %d tokens", len(kv.logits), len(old.logits), tc.tokens)
				}
				worst := 0.0
				for k := range old.logits {
					for j, w := range old.logits[k] {
						worst = math.Max(worst, math.Abs(float64(kv.logits[k][j]-w)))
					}
				}
				if worst > 1e-5 {
					t.Errorf("logits differ by up to %.3g", worst)
				}
				window := old.positions / tc.tokens
				prompt := window - tc.tokens // the window is prompt + tokens, or the positions
				t.Logf("max |cached - uncached logit| %.2g; positions forwarded: cached %d, uncached %d (window %d)", worst, kv.positions, old.positions, window)
				if !tc.overflow {
					if want := prompt + tc.tokens - 1; kv.positions != want {
						t.Errorf("cached path forwarded %d positions, want prompt %d + tokens %d - 1 = %d", kv.positions, prompt, tc.tokens, want)
					}
					if old.positions != (prompt+tc.tokens)*tc.tokens {
						t.Errorf("uncached path forwarded %d positions, want %d", old.positions, (prompt+tc.tokens)*tc.tokens)
					}
				}
			})
		}
	}
}
