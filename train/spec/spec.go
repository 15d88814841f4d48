// Package spec is a model's layout written once: for a config, every
// parameter of every pipeline stage in the model's order (its name, its
// unsharded shape, how tensor parallelism cuts it, whether AdamW decays it,
// whether sequence parallelism sums its gradient), the model's own
// buffers, and what follows from them: the parameter count and the FLOPs
// a token costs. train's transformer checks what it built against Params,
// and the plan (train/plan), the gradient buckets, the parameter count and
// the FLOP counts read Params instead of listing the layout again.
//
// The models are train's transformer (gpt and bert of arch native, and
// llama) and arch hf's BERT (train/bert.go, Hugging Face's post-LN layout,
// one stage).
package spec

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/config"
)

// Param is one parameter of a stage as a tensor-parallel rank holds it.
type Param struct {
	Name  string         // e.g. "h.0.attn.c_attn.weight": the checkpoint's and the init seed's key
	Full  []int          // the unsharded shape (the padded vocabulary included)
	Shard parallel.Shard // this rank's piece
	Decay bool           // AdamW decays it (weights and embeddings, not biases or norms)
	// SeqReduce: a replicated parameter used in a sequence-parallel
	// region, whose gradient sequence parallelism sums over tp.
	SeqReduce bool
}

// Elems is the unsharded parameter's element count.
func (p Param) Elems() int64 {
	n := int64(1)
	for _, d := range p.Full {
		n *= int64(d)
	}
	return n
}

// LocalElems is the element count of this rank's piece.
func (p Param) LocalElems() int64 {
	n := int64(1)
	for _, d := range p.Shard.LocalShape(p.Full) {
		n *= int64(d)
	}
	return n
}

// Params lists the parameters tensor-parallel rank tpRank (of cfg.TP)
// holds on pipeline stage stage (of cfg.Stages()), in the order the model
// lists them: the embedding (on the first stage, and on the last of a GPT
// for its tied head) and the position table (gpt, bert), the stage's
// blocks, and on the last stage the final norm and the head.
func Params(cfg config.Config, vocab, tpRank, stage int) ([]Param, error) {
	tp := max(cfg.TP, 1)
	if tpRank < 0 || tpRank >= tp {
		return nil, fmt.Errorf("spec: tp rank %d of %d", tpRank, tp)
	}
	split, err := cfg.StageLayers()
	if err != nil {
		return nil, err
	}
	if stage < 0 || stage >= len(split) {
		return nil, fmt.Errorf("spec: stage %d of %d", stage, len(split))
	}
	lo := 0
	for _, n := range split[:stage] {
		lo += n
	}
	return StageParams(cfg, vocab, tpRank, stage == 0, stage == len(split)-1, lo, lo+split[stage])
}

// StageParams is Params of a stage that holds blocks [lo, hi), and the
// embeddings when first, the final norm and the head when last.
func StageParams(cfg config.Config, vocab, tpRank int, first, last bool, lo, hi int) ([]Param, error) {
	tp := max(cfg.TP, 1)
	if tpRank < 0 || tpRank >= tp {
		return nil, fmt.Errorf("spec: tp rank %d of %d", tpRank, tp)
	}
	vp, err := parallel.PadVocab(vocab, tp)
	if err != nil {
		return nil, err
	}
	if cfg.Arch == "hf" {
		return hfBERTParams(cfg, vp, tp, tpRank), nil
	}
	llama, lm := cfg.Model == "llama", cfg.LM()
	tied := lm && !(llama && cfg.UntiedHead)
	sp := cfg.SP && tp > 1
	C := cfg.Dim

	cut := cutter(tp, tpRank)
	column := func(blocks int) parallel.Shard { return cut(parallel.Shard{Dim: 0, Blocks: blocks}) }
	row := cut(parallel.Shard{Dim: 1})
	var ps []Param
	add := func(name string, full []int, sh parallel.Shard, decay, seqReduce bool) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Decay: decay, SeqReduce: seqReduce})
	}
	norm := func(name string) { // a LayerNorm's weight and bias, or an RMSNorm's weight
		add(name+".weight", []int{C}, replicated, false, sp)
		if !llama {
			add(name+".bias", []int{C}, replicated, false, sp)
		}
	}

	wte := "wte"
	if llama {
		wte = "model.embed_tokens"
	}
	if first || (last && tied) {
		add(wte+".weight", []int{vp, C}, cut(parallel.Shard{Dim: 0}), true, false)
	}
	if first && !llama {
		add("wpe.weight", []int{cfg.PositionRows(), C}, replicated, true, sp)
	}
	for l := lo; l < hi; l++ {
		if llama {
			p := fmt.Sprintf("model.layers.%d", l)
			hd := C / cfg.Heads
			_, replicas, err := parallel.KVSplit(cfg.Heads, cfg.KVHeadCount(), tp)
			if err != nil {
				return nil, err
			}
			qkv := column(1)
			if replicas > 1 && tp > 1 {
				qkv = cut(parallel.Shard{Dim: 0, Replicas: replicas, Shared: 2 * hd})
			}
			F := cfg.Hidden()
			norm(p + ".input_layernorm")
			add(p+".self_attn.qkv_proj.weight", []int{(cfg.Heads + 2*cfg.KVHeadCount()) * hd, C}, qkv, true, false)
			add(p+".self_attn.o_proj.weight", []int{C, C}, row, true, false)
			norm(p + ".post_attention_layernorm")
			add(p+".mlp.gate_up_proj.weight", []int{2 * F, C}, column(2), true, false)
			add(p+".mlp.down_proj.weight", []int{C, F}, row, true, false)
			continue
		}
		p := fmt.Sprintf("h.%d", l)
		norm(p + ".ln_1")
		add(p+".attn.c_attn.weight", []int{3 * C, C}, column(3), true, false)
		add(p+".attn.c_attn.bias", []int{3 * C}, column(3), false, false)
		add(p+".attn.c_proj.weight", []int{C, C}, row, true, false)
		add(p+".attn.c_proj.bias", []int{C}, replicated, false, false)
		norm(p + ".ln_2")
		add(p+".mlp.c_fc.weight", []int{4 * C, C}, column(1), true, false)
		add(p+".mlp.c_fc.bias", []int{4 * C}, column(1), false, false)
		add(p+".mlp.c_proj.weight", []int{C, 4 * C}, row, true, false)
		add(p+".mlp.c_proj.bias", []int{C}, replicated, false, false)
	}
	if !last {
		return ps, nil
	}
	if llama {
		norm("model.norm")
	} else {
		norm("ln_f")
	}
	switch {
	case lm && !tied:
		add("lm_head.weight", []int{vp, C}, column(1), true, false)
	case !lm:
		add("cls.fc1.weight", []int{C, C}, column(1), true, false)
		add("cls.fc1.bias", []int{C}, column(1), false, false)
		add("cls.fc2.weight", []int{config.NumClasses, C}, row, true, false)
		add("cls.fc2.bias", []int{config.NumClasses}, replicated, false, false)
	}
	return ps, nil
}

// replicated is the shard rule of a parameter every tp rank holds whole.
var replicated = parallel.Shard{Parts: 1}

// cutter returns the shard rule of tp rank tpRank of tp for a split (Dim,
// Blocks, Replicas, Shared given): replicated when tp is 1, as the layers
// make it.
func cutter(tp, tpRank int) func(parallel.Shard) parallel.Shard {
	return func(s parallel.Shard) parallel.Shard {
		if tp == 1 {
			return replicated
		}
		s.Parts, s.Index = tp, tpRank
		return s
	}
}

// hfBERTParams are arch hf's BERT's (one stage, no sequence parallelism):
// the word, position and token-type tables and their LayerNorm; per layer
// attention, its output LayerNorm, the MLP and the layer's output
// LayerNorm; the pooler and the classifier.
func hfBERTParams(cfg config.Config, vp, tp, tpRank int) []Param {
	C := cfg.Dim
	cut := cutter(tp, tpRank)
	var ps []Param
	add := func(name string, full []int, sh parallel.Shard, decay bool) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Decay: decay})
	}
	norm := func(name string) {
		add(name+".weight", []int{C}, replicated, false)
		add(name+".bias", []int{C}, replicated, false)
	}
	add("embeddings.word_embeddings.weight", []int{vp, C}, cut(parallel.Shard{Dim: 0}), true)
	add("embeddings.position_embeddings.weight", []int{cfg.PositionRows(), C}, replicated, true)
	add("embeddings.token_type_embeddings.weight", []int{config.BERTTypes, C}, replicated, true)
	norm("embeddings.LayerNorm")
	for l := range cfg.Layers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		add(p+"attention.c_attn.weight", []int{3 * C, C}, cut(parallel.Shard{Dim: 0, Blocks: 3}), true)
		add(p+"attention.c_attn.bias", []int{3 * C}, cut(parallel.Shard{Dim: 0, Blocks: 3}), false)
		add(p+"attention.c_proj.weight", []int{C, C}, cut(parallel.Shard{Dim: 1}), true)
		add(p+"attention.c_proj.bias", []int{C}, replicated, false)
		norm(p + "attention.output.LayerNorm")
		add(p+"mlp.c_fc.weight", []int{4 * C, C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), true)
		add(p+"mlp.c_fc.bias", []int{4 * C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), false)
		add(p+"mlp.c_proj.weight", []int{C, 4 * C}, cut(parallel.Shard{Dim: 1}), true)
		add(p+"mlp.c_proj.bias", []int{C}, replicated, false)
		norm(p + "output.LayerNorm")
	}
	add("pooler.dense.weight", []int{C, C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), true)
	add("pooler.dense.bias", []int{C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), false)
	add("classifier.weight", []int{config.NumClasses, C}, cut(parallel.Shard{Dim: 1}), true)
	add("classifier.bias", []int{config.NumClasses}, replicated, false)
	return ps
}

// Check says how the parameters a model built (params, in its order)
// differ from the spec's (want); nil when they agree in every field.
func Check(params []*parallel.Param, want []Param) error {
	var diffs []string
	for i := range max(len(params), len(want)) {
		switch {
		case i >= len(params):
			diffs = append(diffs, fmt.Sprintf("missing %s", want[i].Name))
		case i >= len(want):
			diffs = append(diffs, fmt.Sprintf("extra %s", params[i].Name))
		default:
			p, w := params[i], want[i]
			if p.Name != w.Name || !slices.Equal(p.Full, w.Full) || p.Shard != w.Shard || p.Decay != w.Decay || p.SeqReduce != w.SeqReduce {
				diffs = append(diffs, fmt.Sprintf("#%d is %s %v %#v decay %v seq-reduce %v, the spec's %s %v %#v decay %v seq-reduce %v",
					i, p.Name, p.Full, p.Shard, p.Decay, p.SeqReduce, w.Name, w.Full, w.Shard, w.Decay, w.SeqReduce))
			}
		}
		if len(diffs) == 3 {
			diffs = append(diffs, "...")
			break
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("the model's parameters differ from its spec (train/spec): %s", strings.Join(diffs, "; "))
}

// LocalElems are the element counts of ps's pieces, in order (what the
// gradient buckets cut).
func LocalElems(ps []Param) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.LocalElems()
	}
	return out
}
