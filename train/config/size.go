package config

import (
	"fmt"

	"github.com/hpcrun/hpcrun/parallel"
)

// NumClasses is the number of labels of the BERT classifier's head.
const NumClasses = 2

// BERTTypes is the number of token types (segments) of BERT's table;
// hpcrun's single-text samples are all of type 0.
const BERTTypes = 2

// ParamCount is the number of parameters of the whole model (all shards),
// with the vocabulary padded for the config's tp.
func ParamCount(cfg Config, vocab int) int64 {
	vp, err := parallel.PadVocab(vocab, max(cfg.TP, 1))
	if err != nil {
		return 0
	}
	C, L := int64(cfg.Dim), int64(cfg.Layers)
	if cfg.Model == "llama" {
		n := int64(vp)*C + L*blockParams(cfg) + C
		if cfg.UntiedHead {
			n += int64(vp) * C
		}
		return n
	}
	n := int64(vp)*C + int64(cfg.PositionRows())*C + L*blockParams(cfg) + 2*C
	if cfg.Model == "bert" {
		n += C*C + C + NumClasses*C + NumClasses
	}
	if cfg.Arch == "hf" {
		n += BERTTypes * C // token types; the embedding layer norm stands for ln_f
	}
	return n
}

// blockParams is one transformer block's parameters (all shards). A GPT or
// BERT block: ln_1, ln_2 (2C each), c_attn (3C*C + 3C), attn.c_proj (C*C +
// C), mlp.c_fc (4C*C + 4C), mlp.c_proj (4C*C + C). A Llama block: two
// RMSNorm weights, the fused Q,K,V projection (heads query and 2*kv_heads
// key/value heads of dim/heads rows), the output projection and the three
// SwiGLU matrices.
func blockParams(cfg Config) int64 {
	C := int64(cfg.Dim)
	if cfg.Model != "llama" {
		return 12*C*C + 13*C
	}
	hd := C / int64(max(cfg.Heads, 1))
	qkv := int64(cfg.Heads+2*cfg.KVHeadCount()) * hd
	return 2*C + qkv*C + C*C + 3*int64(cfg.Hidden())*C
}

// ModelFlopsPerToken is the training FLOPs per token of the whole model,
// forward and backward, that MFU counts everywhere (the plan, a run's
// metrics, bench step): 6 per parameter plus attention's 12*layers*seq*dim
// (the scores and the weighted values of every query head). The parameters
// are ParamCount's, the padded vocabulary's rows included (the head
// multiplies by them), so grouped-query attention counts its smaller
// key/value projections and SwiGLU its three matrices; an untied Llama's
// embedding table is looked up, not multiplied, and does not count.
// Activation recomputation is not counted: see HardwareFlopsPerToken.
func ModelFlopsPerToken(cfg Config, vocab int) float64 {
	n := ParamCount(cfg, vocab)
	if cfg.Model == "llama" && cfg.UntiedHead {
		vp, _ := parallel.PadVocab(vocab, max(cfg.TP, 1))
		n -= int64(vp) * int64(cfg.Dim)
	}
	return 6*float64(n) + 3*attentionForwardFlops(cfg)
}

// HardwareFlopsPerToken is ModelFlopsPerToken plus the forward that
// activation recomputation runs again in the backward, what HFU counts (as
// Megatron-LM and torchtitan report HFU beside MFU): under selective
// recomputation attention's two products, under full every block's
// forward, 2 a block parameter and attention's. Without recomputation it
// is ModelFlopsPerToken.
func HardwareFlopsPerToken(cfg Config, vocab int) float64 {
	f := ModelFlopsPerToken(cfg, vocab)
	switch cfg.RecomputeMode() {
	case parallel.RecomputeSelective:
		f += attentionForwardFlops(cfg)
	case parallel.RecomputeFull:
		f += 2*float64(int64(cfg.Layers)*blockParams(cfg)) + attentionForwardFlops(cfg)
	}
	return f
}

// attentionForwardFlops is the forward FLOPs per token of attention's two
// products in every layer, Q K^T and P V over seq keys: 4*layers*seq*dim
// (the backward is twice that).
func attentionForwardFlops(cfg Config) float64 {
	return 4 * float64(cfg.Layers) * float64(cfg.Seq) * float64(cfg.Dim)
}

// The largest model shape hpcrun accepts from a file or a flag, far past
// any real model (GPT-3 has 96 layers of 12288): a size beyond them is
// refused before anything is allocated for it, so that a corrupt or
// hostile header cannot make a rank allocate until it dies.
const (
	MaxLayers    = 1 << 12
	MaxDim       = 1 << 17
	MaxPositions = 1 << 20
	MaxVocab     = 1 << 24
	// MaxParams bounds the whole model (about 1.1e12 parameters).
	MaxParams = 1 << 40
)

// CheckSize refuses a shape past the Max limits, naming the first key that
// is: key(name) gives the name the source uses for a field (n_layer,
// --layers).
func CheckSize(layers, dim, positions, vocab int, key func(name string) string) error {
	for _, k := range []struct {
		name  string
		v, at int
	}{{"layers", layers, MaxLayers}, {"dim", dim, MaxDim}, {"positions", positions, MaxPositions}, {"vocab", vocab, MaxVocab}} {
		if k.v > k.at {
			return fmt.Errorf("%s = %d: more than the %d hpcrun accepts", key(k.name), k.v, k.at)
		}
	}
	L, C, P, V := float64(layers), float64(dim), float64(positions), float64(vocab)
	if n := 12*L*C*C + (V+P)*C; n > MaxParams {
		return fmt.Errorf("%s %d, %s %d, %s %d: %.3g parameters, more than the %.3g hpcrun accepts",
			key("layers"), layers, key("dim"), dim, key("vocab"), vocab, n, float64(MaxParams))
	}
	return nil
}
