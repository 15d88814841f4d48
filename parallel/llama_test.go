package parallel

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// The Llama block's Backward is the gradient of its Forward: central
// differences on the input and on entries of every parameter, with
// grouped heads and Llama 3's rope scaling.
func TestLlamaBlockFiniteDifferences(t *testing.T) {
	const b, tt, c = 2, 5, 16
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(15, 16))
	blk, err := NewLlamaBlock(dev, nil, "model.layers.0", LlamaBlockConfig{Dim: c, Heads: 4, KVHeads: 2, Hidden: 24, Eps: 1e-5, Seed: 9, Std: 0.3,
		RoPE: RoPE{Theta: 100, Scaling: &RoPEScaling{Factor: 4, LowFreqFactor: 1, HighFreqFactor: 2, OriginalMaxPositions: 8}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*RMSNorm{blk.InputNorm, blk.PostNorm} {
		_, v := uploadRand(t, dev, r, c)
		for i := range v {
			v[i] = 1 + 0.3*v[i]
		}
		dev.CopyFromHost(n.Weight.Data, v)
	}
	checkBlockGradients(t, dev, r, blk, b, tt, c, nil, []int{0, 7, 21, 40, 63, 100, 159}, func(n int) []int { return []int{0, n / 3, n / 2, n - 1} })
}

// Llama 3's rope scaling keeps the high frequencies, divides the low ones
// by the factor and interpolates between (the wave lengths of Hugging
// Face's _compute_llama3_parameters).
func TestRoPEFrequencies(t *testing.T) {
	r := RoPE{Theta: 500000, Scaling: &RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	plain := RoPE{Theta: 500000}.Frequencies(128)
	got := r.Frequencies(128)
	for j, f := range plain {
		wave := 2 * math.Pi / f
		want := f
		switch {
		case wave < 8192/4:
		case wave > 8192:
			want = f / 8
		default:
			s := (8192/wave - 1) / (4 - 1)
			want = (1-s)*f/8 + s*f
		}
		if math.Abs(got[j]-want) > 1e-15*want {
			t.Errorf("freq %d: %g, want %g", j, got[j], want)
		}
	}
	if f := (RoPE{}).Frequencies(4); f[0] != 1 || math.Abs(f[1]-0.01) > 1e-15 {
		t.Errorf("theta 10000, hd 4: %v, want [1 0.01]", f)
	}
	tab := RoPE{}.Table(3, 4)
	if s, c := math.Sincos(2 * 0.01); tab[2*4+1] != float32(c) || tab[2*4+3] != float32(s) {
		t.Errorf("table row 2: %v", tab[8:12])
	}
}

// Bad shapes get one-line errors that say the rule.
func TestLlamaAttentionRefuses(t *testing.T) {
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		for _, tc := range []struct {
			cfg  LlamaAttentionConfig
			want string
		}{
			{LlamaAttentionConfig{Dim: 576, Heads: 9, KVHeads: 3}, "tp 2 with 9 query and 3 key/value heads: tp must divide the query heads and either divide the key/value heads or be a multiple of them (each key/value head then replicated over tp/kv ranks): tp 1, 3, 9 work"},
			{LlamaAttentionConfig{Dim: 64, Heads: 8, KVHeads: 3}, "heads 8 is not a multiple of kv heads 3"},
			{LlamaAttentionConfig{Dim: 24, Heads: 8, KVHeads: 2}, "heads of an even size"},
		} {
			_, err := NewLlamaAttention(dev, c, "attn", tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
