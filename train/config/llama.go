package config

import (
	"fmt"
	"math"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
)

// LM reports whether the model is a causal language model (gpt, llama).
func (c Config) LM() bool { return c.Model == "gpt" || c.Model == "llama" }

// KVHeadCount is the key/value heads of attention: kv_heads, or heads.
func (c Config) KVHeadCount() int {
	if c.KVHeads > 0 {
		return c.KVHeads
	}
	return c.Heads
}

// QKVRows is the rows of a Llama's fused Q,K,V weight on one of tp ranks:
// its heads/tp query heads and its key/value heads, kv_heads/tp of them,
// or the one it shares with tp/kv_heads ranks (parallel.KVSplit), each of
// dim/heads rows.
func (c Config) QKVRows(tp int) int {
	tp = max(tp, 1)
	kv, _, err := parallel.KVSplit(c.Heads, c.KVHeadCount(), tp)
	if err != nil {
		kv = c.KVHeadCount() / tp // refused by Validate
	}
	return (c.Heads/tp + 2*kv) * (c.Dim / c.Heads)
}

// Hidden is the MLP width: 4*dim for gpt and bert; for llama ffn, or
// Llama's rule (8/3 dim rounded up to a multiple of 256) when 0.
func (c Config) Hidden() int {
	if c.Model != "llama" {
		return 4 * c.Dim
	}
	if c.FFN > 0 {
		return c.FFN
	}
	return (8*c.Dim/3 + 255) / 256 * 256
}

// DefaultRopeTheta is the rotary embeddings' base when rope_theta is unset
// (Llama's and Llama 2's).
const DefaultRopeTheta = 10000

// DefaultNormEps is RMSNorm's epsilon when norm_eps is unset (Llama's).
const DefaultNormEps = 1e-5

// NormEpsilon is RMSNorm's epsilon as the config says it: norm_eps, or
// DefaultNormEps (what an exported config.json holds).
func (c Config) NormEpsilon() float64 {
	if c.NormEps > 0 {
		return c.NormEps
	}
	return DefaultNormEps
}

// Eps is RMSNorm's epsilon as the kernels use it: NormEpsilon in float32.
func (c Config) Eps() float32 { return float32(c.NormEpsilon()) }

// RoPE is the rotary embeddings the config's attention uses.
func (c Config) RoPE() parallel.RoPE {
	r := parallel.RoPE{Theta: c.RopeTheta}
	if c.RopeFactor != 0 {
		r.Scaling = &parallel.RoPEScaling{Factor: c.RopeFactor, LowFreqFactor: c.RopeLowFreq, HighFreqFactor: c.RopeHighFreq, OriginalMaxPositions: c.RopeOriginalSeq}
	}
	return r
}

// LlamaBlockShape is the shape of one of the config's Llama blocks on a
// rank (parallel.LlamaBlockSizes).
func (c Config) LlamaBlockShape() parallel.LlamaBlockShape {
	tp := max(c.TP, 1)
	return parallel.LlamaBlockShape{Dim: c.Dim, Heads: c.Heads, KVHeads: c.KVHeadCount(), Hidden: c.Hidden(), TP: tp, SP: c.SP && tp > 1, Recompute: c.RecomputeMode()}
}

// validateLlama reports the Llama settings that cannot run.
func (c Config) validateLlama(bad func(format string, args ...any)) {
	// Before any range: NaN compares false with every bound.
	for _, f := range []struct {
		name string
		v    float64
	}{{"norm_eps", c.NormEps}, {"rope_theta", c.RopeTheta}, {"rope_factor", c.RopeFactor},
		{"rope_low_freq", c.RopeLowFreq}, {"rope_high_freq", c.RopeHighFreq}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			bad("%s = %g: must be a finite number", f.name, f.v)
			return
		}
	}
	if c.KVHeads < 0 || c.FFN < 0 || c.NormEps < 0 || c.RopeTheta < 0 {
		bad("kv_heads %d, ffn %d, norm_eps %g, rope_theta %g: must not be negative", c.KVHeads, c.FFN, c.NormEps, c.RopeTheta)
		return
	}
	// An epsilon below 1e-12 is 0 or a denormal in the float32 kernels.
	if c.NormEps != 0 && (c.NormEps < 1e-12 || c.NormEps > 1) {
		bad("norm_eps = %g: must be 1e-12 to 1 (0: %g)", c.NormEps, DefaultNormEps)
	}
	if c.RopeTheta != 0 && c.RopeTheta <= 1 {
		bad("rope_theta = %g: must be more than 1 (0: %d)", c.RopeTheta, DefaultRopeTheta)
	}
	kv := c.KVHeadCount()
	if c.Heads > 0 && kv > 0 && c.Heads%kv != 0 {
		bad("heads %d is not a multiple of kv_heads %d: each key/value head serves a group of query heads", c.Heads, kv)
	}
	if c.TP > 0 && kv > 0 && c.Heads > 0 && c.Heads%kv == 0 {
		if _, _, err := parallel.KVSplit(c.Heads, kv, c.TP); err != nil {
			// The MLP splits too: name the tp values both allow when it
			// rules out some the attention does not.
			var both []string
			narrower := false
			for t := 1; t <= c.Heads; t++ {
				if _, _, e := parallel.KVSplit(c.Heads, kv, t); e == nil {
					if c.Hidden()%t == 0 {
						both = append(both, fmt.Sprint(t))
					} else {
						narrower = true
					}
				}
			}
			if narrower {
				bad("%v; with ffn %d (tp must divide it too): tp %s", err, c.Hidden(), strings.Join(both, ", "))
			} else {
				bad("%v", err)
			}
		}
	}
	if c.Dim > 0 && c.Heads > 0 && c.Dim%c.Heads == 0 && (c.Dim/c.Heads)%2 != 0 {
		bad("dim %d / heads %d = %d: rotary embeddings need an even head size", c.Dim, c.Heads, c.Dim/c.Heads)
	}
	if c.TP > 0 && c.Hidden()%c.TP != 0 {
		bad("ffn %d is not a multiple of tp %d", c.Hidden(), c.TP)
	}
	if c.RopeFactor != 0 && (!(c.RopeFactor > 0) || !(c.RopeHighFreq > c.RopeLowFreq) || !(c.RopeLowFreq > 0) || c.RopeOriginalSeq < 1) {
		bad("rope_factor %g, rope_low_freq %g, rope_high_freq %g, rope_original_seq %d: Llama 3's scaling wants factor > 0, 0 < low < high and original seq >= 1",
			c.RopeFactor, c.RopeLowFreq, c.RopeHighFreq, c.RopeOriginalSeq)
	}
	if c.RopeFactor == 0 && (c.RopeLowFreq != 0 || c.RopeHighFreq != 0 || c.RopeOriginalSeq != 0) {
		bad("rope_low_freq, rope_high_freq and rope_original_seq scale the rotary embeddings only with rope_factor: set rope_factor (--rope-factor) or leave them out")
	}
}
