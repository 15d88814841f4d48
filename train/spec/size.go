package spec

import (
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/config"
)

// ParamCount is the number of parameters of the whole model (all shards,
// each once), with the vocabulary padded for the config's tp: Params' of
// the model in one stage. 0 for a config Params refuses.
func ParamCount(cfg config.Config, vocab int) int64 {
	c := cfg
	c.PP, c.PPSplit = 1, ""
	ps, err := Params(c, vocab, 0, 0)
	if err != nil {
		return 0
	}
	var n int64
	for _, p := range ps {
		n += p.Elems()
	}
	return n
}

// blockParams is one transformer block's parameters (all shards): those of
// Params' first block.
func blockParams(cfg config.Config) int64 {
	c := cfg
	c.Layers, c.PP, c.PPSplit, c.TP = 1, 1, "", 1
	ps, err := Params(c, 1, 0, 0)
	if err != nil {
		return 0
	}
	var n int64
	for _, p := range ps {
		if strings.HasPrefix(p.Name, "h.0.") || strings.HasPrefix(p.Name, "model.layers.0.") {
			n += p.Elems()
		}
	}
	return n
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
func ModelFlopsPerToken(cfg config.Config, vocab int) float64 {
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
func HardwareFlopsPerToken(cfg config.Config, vocab int) float64 {
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
func attentionForwardFlops(cfg config.Config) float64 {
	return 4 * float64(cfg.Layers) * float64(cfg.Seq) * float64(cfg.Dim)
}
