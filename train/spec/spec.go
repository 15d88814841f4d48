// Package spec is a model's layout written once: for a config, every
// parameter of every pipeline stage in the model's order (its name, its
// unsharded shape, how tensor parallelism cuts it, whether AdamW decays it,
// whether sequence parallelism sums its gradient, how it starts), the
// model's own buffers, and what follows from them: the parameter count and
// the FLOPs a token costs. train's models allocate their parameters from
// Params (parallel.NewParamSet), their layers taking each by name, and the
// plan (train/plan), the gradient buckets, the checkpoints' names, the
// parameter count and the FLOP counts read it instead of listing the
// layout again.
//
// The models are train's transformer (gpt and bert of arch native, and
// llama) and arch hf's BERT (train/bert.go, Hugging Face's post-LN layout,
// one stage).
package spec

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/config"
)

// Param is one parameter of a stage as a tensor-parallel rank holds it:
// its name, shapes, decay and initial values (parallel.ParamSpec). The
// model allocates its parameters from these (parallel.NewParamSet) and
// its layers take them by name.
type Param = parallel.ParamSpec

// PositionStd is the initial spread of the position table. As in GPT-2,
// the other weights and embeddings start N(0, parallel.DefaultStd^2), the
// residual projections (the attention's and the MLP's output) at ProjStd,
// norms at 1 and biases at 0.
const PositionStd = 0.01

// ProjStd is the initial spread of a residual projection of a model of
// layers blocks.
func ProjStd(layers int) float32 {
	return float32(parallel.DefaultStd / math.Sqrt(2*float64(layers)))
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
		return hfBERTParams(cfg, vocab, vp, tp, tpRank), nil
	}
	llama, lm := cfg.Model == "llama", cfg.LM()
	tied := lm && !(llama && cfg.UntiedHead)
	sp := cfg.SP && tp > 1
	C := cfg.Dim

	cut := cutter(tp, tpRank)
	column := func(blocks int) parallel.Shard { return cut(parallel.Shard{Dim: 0, Blocks: blocks}) }
	row := cut(parallel.Shard{Dim: 1})
	var ps []Param
	// weight: N(0, std^2) over its first validRows rows (all: 0), decayed.
	weight := func(name string, full []int, sh parallel.Shard, std float32, validRows int, seqReduce bool) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Decay: true, SeqReduce: seqReduce, Std: std, ValidRows: validRows})
	}
	bias := func(name string, full []int, sh parallel.Shard) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Init: parallel.InitZeros})
	}
	norm := func(name string) { // a LayerNorm's weight and bias, or an RMSNorm's weight
		ps = append(ps, Param{Name: name + ".weight", Full: []int{C}, Shard: replicated, SeqReduce: sp, Init: parallel.InitOnes})
		if !llama {
			ps = append(ps, Param{Name: name + ".bias", Full: []int{C}, Shard: replicated, SeqReduce: sp, Init: parallel.InitZeros})
		}
	}
	proj := ProjStd(cfg.Layers)

	wte := "wte"
	if llama {
		wte = "model.embed_tokens"
	}
	if first || (last && tied) {
		weight(wte+".weight", []int{vp, C}, cut(parallel.Shard{Dim: 0}), parallel.DefaultStd, vocab, false)
	}
	if first && !llama {
		weight("wpe.weight", []int{cfg.PositionRows(), C}, replicated, PositionStd, 0, sp)
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
			weight(p+".self_attn.qkv_proj.weight", []int{(cfg.Heads + 2*cfg.KVHeadCount()) * hd, C}, qkv, parallel.DefaultStd, 0, false)
			weight(p+".self_attn.o_proj.weight", []int{C, C}, row, proj, 0, false)
			norm(p + ".post_attention_layernorm")
			weight(p+".mlp.gate_up_proj.weight", []int{2 * F, C}, column(2), parallel.DefaultStd, 0, false)
			weight(p+".mlp.down_proj.weight", []int{C, F}, row, proj, 0, false)
			continue
		}
		p := fmt.Sprintf("h.%d", l)
		norm(p + ".ln_1")
		weight(p+".attn.c_attn.weight", []int{3 * C, C}, column(3), parallel.DefaultStd, 0, false)
		bias(p+".attn.c_attn.bias", []int{3 * C}, column(3))
		weight(p+".attn.c_proj.weight", []int{C, C}, row, proj, 0, false)
		bias(p+".attn.c_proj.bias", []int{C}, replicated)
		norm(p + ".ln_2")
		weight(p+".mlp.c_fc.weight", []int{4 * C, C}, column(1), parallel.DefaultStd, 0, false)
		bias(p+".mlp.c_fc.bias", []int{4 * C}, column(1))
		weight(p+".mlp.c_proj.weight", []int{C, 4 * C}, row, proj, 0, false)
		bias(p+".mlp.c_proj.bias", []int{C}, replicated)
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
		weight("lm_head.weight", []int{vp, C}, column(1), parallel.DefaultStd, vocab, false)
	case !lm:
		weight("cls.fc1.weight", []int{C, C}, column(1), parallel.DefaultStd, 0, false)
		bias("cls.fc1.bias", []int{C}, column(1))
		weight("cls.fc2.weight", []int{config.NumClasses, C}, row, parallel.DefaultStd, 0, false)
		bias("cls.fc2.bias", []int{config.NumClasses}, replicated)
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
func hfBERTParams(cfg config.Config, vocab, vp, tp, tpRank int) []Param {
	C := cfg.Dim
	cut := cutter(tp, tpRank)
	var ps []Param
	// Every weight starts N(0, 0.02^2), the word table's padding rows 0.
	weight := func(name string, full []int, sh parallel.Shard, validRows int) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Decay: true, Std: parallel.DefaultStd, ValidRows: validRows})
	}
	bias := func(name string, full []int, sh parallel.Shard) {
		ps = append(ps, Param{Name: name, Full: full, Shard: sh, Init: parallel.InitZeros})
	}
	norm := func(name string) {
		ps = append(ps, Param{Name: name + ".weight", Full: []int{C}, Shard: replicated, Init: parallel.InitOnes})
		bias(name+".bias", []int{C}, replicated)
	}
	weight("embeddings.word_embeddings.weight", []int{vp, C}, cut(parallel.Shard{Dim: 0}), vocab)
	weight("embeddings.position_embeddings.weight", []int{cfg.PositionRows(), C}, replicated, 0)
	weight("embeddings.token_type_embeddings.weight", []int{config.BERTTypes, C}, replicated, 0)
	norm("embeddings.LayerNorm")
	for l := range cfg.Layers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		weight(p+"attention.c_attn.weight", []int{3 * C, C}, cut(parallel.Shard{Dim: 0, Blocks: 3}), 0)
		bias(p+"attention.c_attn.bias", []int{3 * C}, cut(parallel.Shard{Dim: 0, Blocks: 3}))
		weight(p+"attention.c_proj.weight", []int{C, C}, cut(parallel.Shard{Dim: 1}), 0)
		bias(p+"attention.c_proj.bias", []int{C}, replicated)
		norm(p + "attention.output.LayerNorm")
		weight(p+"mlp.c_fc.weight", []int{4 * C, C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), 0)
		bias(p+"mlp.c_fc.bias", []int{4 * C}, cut(parallel.Shard{Dim: 0, Blocks: 1}))
		weight(p+"mlp.c_proj.weight", []int{C, 4 * C}, cut(parallel.Shard{Dim: 1}), 0)
		bias(p+"mlp.c_proj.bias", []int{C}, replicated)
		norm(p + "output.LayerNorm")
	}
	weight("pooler.dense.weight", []int{C, C}, cut(parallel.Shard{Dim: 0, Blocks: 1}), 0)
	bias("pooler.dense.bias", []int{C}, cut(parallel.Shard{Dim: 0, Blocks: 1}))
	weight("classifier.weight", []int{config.NumClasses, C}, cut(parallel.Shard{Dim: 1}), 0)
	bias("classifier.bias", []int{config.NumClasses}, replicated)
	return ps
}

// Check says how the parameters a model holds (params, in its order)
// differ from the spec's (want); nil when they agree in every field. A
// model made from want differs only where a layer marked a parameter
// for sequence parallelism against the spec's SeqReduce.
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
