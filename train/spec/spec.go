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
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
)

// Param is one parameter of a stage as a tensor-parallel rank holds it:
// its name, shapes, decay and initial values (parallel.ParamSpec). The
// model allocates its parameters from these (parallel.NewParamSet) and
// its layers take them by name.
type Param = parallel.ParamSpec

// Compute is the dtype of what the matrix products read: the copies of
// the Product weights and the activations saved only for products, the
// activation kernels and the attention (the MLP's pre-activation and its
// GELU or SwiGLU output, the attention's Q, K and V and its output y, the
// pre-norm blocks' norm outputs (NormOut) and a language model's ln_f
// output), the gradients only they read (the MLP's hidden ones, the
// attention's of y and of Q, K, V, BERT's post-norm output projections'
// rounded output gradients), and the pre-norm blocks' residual stream,
// its gradient, the norms' outputs' gradients and the embeddings' output
// (Residual, NormOut). BFloat16 at
// precision bf16 (fp32 masters, which AdamW updates, and bf16 operands,
// as Megatron keeps them), Float32 otherwise (no copy: the products read
// the masters).
func Compute(cfg config.Config) tensor.DType {
	if cfg.Precision == "bf16" {
		return tensor.BFloat16
	}
	return tensor.Float32
}

// NormOut is what the blocks' norms store their outputs as, and so what
// sequence parallelism all-gathers into the column-parallel layers:
// Compute(cfg), but Float32 in BERT's post-norm layers (arch hf), whose
// norm outputs are the residual stream.
func NormOut(cfg config.Config) tensor.DType {
	if cfg.Arch == "hf" {
		return tensor.Float32
	}
	return Compute(cfg)
}

// Residual is what the blocks' residual stream (each block's output) is
// stored as: NormOut's, Compute(cfg) in the pre-norm blocks, which round
// their residual sums into it, float32 in BERT's post-norm layers.
func Residual(cfg config.Config) tensor.DType { return NormOut(cfg) }

// TokenEmbeddingOut is what the token embedding stores its output as:
// the residual stream's dtype (Residual) where that output is the first
// block's input (a Llama: no position table); Float32 where the position
// table adds to it first (PositionEmbeddingOut's sum rounds once).
func TokenEmbeddingOut(cfg config.Config) tensor.DType {
	if cfg.Model == "llama" {
		return Residual(cfg)
	}
	return tensor.Float32
}

// PositionEmbeddingOut is what the position table's sum (the token
// embedding plus the positions) is stored as: the residual stream's first
// value, Residual.
func PositionEmbeddingOut(cfg config.Config) tensor.DType { return Residual(cfg) }

// Logits is what a language model's head stores its logits as, and so
// their gradient, which the fused classifier writes over them: Compute(cfg)
// (the loss reads them widened and works in float32; the head's backward
// products read the bfloat16 gradient as it is). BERT's classifier keeps
// its two logits in float32.
func Logits(cfg config.Config) tensor.DType {
	if !cfg.LM() {
		return tensor.Float32
	}
	return Compute(cfg)
}

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
	b, err := newLayout(cfg, vocab, tpRank)
	if err != nil {
		return nil, err
	}
	if cfg.Arch == "hf" {
		b.hfBERT()
		return b.ps, nil
	}
	lm := cfg.LM()
	tied := lm && !(b.llama && cfg.UntiedHead)
	wte := "wte"
	if b.llama {
		wte = "model.embed_tokens"
	}
	if first || (last && tied) {
		b.table(wte+".weight", []int{b.vp, b.C}, b.cut(parallel.Shard{Dim: 0}), parallel.DefaultStd, vocab, false, last && tied)
	}
	if first && !b.llama {
		b.table("wpe.weight", []int{cfg.PositionRows(), b.C}, replicated, PositionStd, 0, b.sp, false)
	}
	for l := lo; l < hi; l++ {
		if err := b.block(l); err != nil {
			return nil, err
		}
	}
	if !last {
		return b.ps, nil
	}
	if b.llama {
		b.norm("model.norm")
	} else {
		b.norm("ln_f")
	}
	C := b.C
	switch {
	case lm && !tied:
		b.weight("lm_head.weight", []int{b.vp, C}, b.column(1), parallel.DefaultStd, vocab, false)
	case !lm:
		b.weight("cls.fc1.weight", []int{C, C}, b.column(1), parallel.DefaultStd, 0, false)
		b.bias("cls.fc1.bias", []int{C}, b.column(1))
		b.weight("cls.fc2.weight", []int{config.NumClasses, C}, b.row(), parallel.DefaultStd, 0, false)
		b.bias("cls.fc2.bias", []int{config.NumClasses}, replicated)
	}
	return b.ps, nil
}

// layout writes the parameters of a model of cfg for one tensor-parallel
// rank, in order, into ps.
type layout struct {
	cfg        config.Config
	tp, tpRank int
	vocab, vp  int  // the vocabulary, padded
	C          int  // the width
	llama      bool // RMSNorms (a weight, no bias)
	sp         bool // sequence parallelism sums the norms' and positions' gradients
	inBlock    int  // the block being written (Param.Block), -1 outside one
	ps         []Param
}

func newLayout(cfg config.Config, vocab, tpRank int) (*layout, error) {
	tp := max(cfg.TP, 1)
	if tpRank < 0 || tpRank >= tp {
		return nil, fmt.Errorf("spec: tp rank %d of %d", tpRank, tp)
	}
	vp, err := parallel.PadVocab(vocab, tp)
	if err != nil {
		return nil, err
	}
	hf := cfg.Arch == "hf" // one stage, no sequence parallelism
	return &layout{cfg: cfg, tp: tp, tpRank: tpRank, vocab: vocab, vp: vp, C: cfg.Dim, llama: cfg.Model == "llama", sp: cfg.SP && tp > 1 && !hf, inBlock: -1}, nil
}

// cut is the shard rule of this rank for a split (Dim, Blocks, Replicas,
// Shared given): replicated when tp is 1, as the layers make it.
func (b *layout) cut(s parallel.Shard) parallel.Shard {
	if b.tp == 1 {
		return replicated
	}
	s.Parts, s.Index = b.tp, b.tpRank
	return s
}

// column is a column-parallel weight's rule, its output of blocks fused
// blocks each split over tp.
func (b *layout) column(blocks int) parallel.Shard {
	return b.cut(parallel.Shard{Dim: 0, Blocks: blocks})
}

// row is a row-parallel weight's rule.
func (b *layout) row() parallel.Shard { return b.cut(parallel.Shard{Dim: 1}) }

// weight adds a decayed weight drawn from N(0, std^2) over its first
// validRows rows (0: all).
func (b *layout) weight(name string, full []int, sh parallel.Shard, std float32, validRows int, seqReduce bool) {
	b.ps = append(b.ps, Param{Name: name, Full: full, Shard: sh, Decay: true, SeqReduce: seqReduce, Std: std, ValidRows: validRows, Block: b.inBlock, Product: true})
}

// table adds an embedding table: a weight that is looked up, and read by
// a product only as a tied head's (product).
func (b *layout) table(name string, full []int, sh parallel.Shard, std float32, validRows int, seqReduce, product bool) {
	b.weight(name, full, sh, std, validRows, seqReduce)
	b.ps[len(b.ps)-1].Product = product
}

// bias adds a bias, 0 at the start.
func (b *layout) bias(name string, full []int, sh parallel.Shard) {
	b.ps = append(b.ps, Param{Name: name, Full: full, Shard: sh, Init: parallel.InitZeros, Block: b.inBlock})
}

// norm adds a LayerNorm's weight and bias, or an RMSNorm's weight.
func (b *layout) norm(name string) {
	b.ps = append(b.ps, Param{Name: name + ".weight", Full: []int{b.C}, Shard: replicated, SeqReduce: b.sp, Init: parallel.InitOnes, Block: b.inBlock})
	if !b.llama {
		b.ps = append(b.ps, Param{Name: name + ".bias", Full: []int{b.C}, Shard: replicated, SeqReduce: b.sp, Init: parallel.InitZeros, Block: b.inBlock})
	}
}

// block adds the transformer's block l: GPT-2's (gpt and bert of arch
// native) or a Llama's.
func (b *layout) block(l int) error {
	b.inBlock = l
	defer func() { b.inBlock = -1 }()
	cfg, C, proj := b.cfg, b.C, ProjStd(b.cfg.Layers)
	if b.llama {
		p := fmt.Sprintf("model.layers.%d", l)
		hd := C / cfg.Heads
		_, replicas, err := parallel.KVSplit(cfg.Heads, cfg.KVHeadCount(), b.tp)
		if err != nil {
			return err
		}
		qkv := b.column(1)
		if replicas > 1 && b.tp > 1 {
			qkv = b.cut(parallel.Shard{Dim: 0, Replicas: replicas, Shared: 2 * hd})
		}
		F := cfg.Hidden()
		b.norm(p + ".input_layernorm")
		b.weight(p+".self_attn.qkv_proj.weight", []int{(cfg.Heads + 2*cfg.KVHeadCount()) * hd, C}, qkv, parallel.DefaultStd, 0, false)
		b.weight(p+".self_attn.o_proj.weight", []int{C, C}, b.row(), proj, 0, false)
		b.norm(p + ".post_attention_layernorm")
		b.weight(p+".mlp.gate_up_proj.weight", []int{2 * F, C}, b.column(2), parallel.DefaultStd, 0, false)
		b.weight(p+".mlp.down_proj.weight", []int{C, F}, b.row(), proj, 0, false)
		return nil
	}
	p := fmt.Sprintf("h.%d", l)
	row := b.row()
	b.norm(p + ".ln_1")
	b.weight(p+".attn.c_attn.weight", []int{3 * C, C}, b.column(3), parallel.DefaultStd, 0, false)
	b.bias(p+".attn.c_attn.bias", []int{3 * C}, b.column(3))
	b.weight(p+".attn.c_proj.weight", []int{C, C}, row, proj, 0, false)
	b.bias(p+".attn.c_proj.bias", []int{C}, replicated)
	b.norm(p + ".ln_2")
	b.weight(p+".mlp.c_fc.weight", []int{4 * C, C}, b.column(1), parallel.DefaultStd, 0, false)
	b.bias(p+".mlp.c_fc.bias", []int{4 * C}, b.column(1))
	b.weight(p+".mlp.c_proj.weight", []int{C, 4 * C}, row, proj, 0, false)
	b.bias(p+".mlp.c_proj.bias", []int{C}, replicated)
	return nil
}

// replicated is the shard rule of a parameter every tp rank holds whole.
var replicated = parallel.Shard{Parts: 1}

// hfBERT adds arch hf's BERT's parameters (one stage, no sequence
// parallelism), every weight drawn from N(0, 0.02^2) (the word table's
// padding rows 0): the word, position and token-type tables and their
// LayerNorm; its layers; the pooler and the classifier.
func (b *layout) hfBERT() {
	C := b.C
	b.table("embeddings.word_embeddings.weight", []int{b.vp, C}, b.cut(parallel.Shard{Dim: 0}), parallel.DefaultStd, b.vocab, false, false)
	b.table("embeddings.position_embeddings.weight", []int{b.cfg.PositionRows(), C}, replicated, parallel.DefaultStd, 0, false, false)
	b.table("embeddings.token_type_embeddings.weight", []int{config.BERTTypes, C}, replicated, parallel.DefaultStd, 0, false, false)
	b.norm("embeddings.LayerNorm")
	for l := range b.cfg.Layers {
		b.hfLayer(l)
	}
	b.weight("pooler.dense.weight", []int{C, C}, b.column(1), parallel.DefaultStd, 0, false)
	b.bias("pooler.dense.bias", []int{C}, b.column(1))
	b.weight("classifier.weight", []int{config.NumClasses, C}, b.row(), parallel.DefaultStd, 0, false)
	b.bias("classifier.bias", []int{config.NumClasses}, replicated)
}

// hfLayer adds the hf BERT's layer l: attention, its output LayerNorm,
// the MLP and the layer's output LayerNorm.
func (b *layout) hfLayer(l int) {
	b.inBlock = l
	defer func() { b.inBlock = -1 }()
	C := b.C
	p := fmt.Sprintf("encoder.layer.%d.", l)
	b.weight(p+"attention.c_attn.weight", []int{3 * C, C}, b.column(3), parallel.DefaultStd, 0, false)
	b.bias(p+"attention.c_attn.bias", []int{3 * C}, b.column(3))
	b.weight(p+"attention.c_proj.weight", []int{C, C}, b.row(), parallel.DefaultStd, 0, false)
	b.bias(p+"attention.c_proj.bias", []int{C}, replicated)
	b.norm(p + "attention.output.LayerNorm")
	b.weight(p+"mlp.c_fc.weight", []int{4 * C, C}, b.column(1), parallel.DefaultStd, 0, false)
	b.bias(p+"mlp.c_fc.bias", []int{4 * C}, b.column(1))
	b.weight(p+"mlp.c_proj.weight", []int{C, 4 * C}, b.row(), parallel.DefaultStd, 0, false)
	b.bias(p+"mlp.c_proj.bias", []int{C}, replicated)
	b.norm(p + "output.LayerNorm")
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

// normFed says whether the weight named name is a block's projection a
// norm feeds: the fused Q,K,V (c_attn, qkv_proj) or the MLP's first
// (c_fc, gate_up_proj).
func normFed(name string) bool {
	for _, suffix := range []string{".c_attn.weight", ".qkv_proj.weight", ".c_fc.weight", ".gate_up_proj.weight"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
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

// Linear is a weight product of a tensor-parallel rank: In inputs to Out
// outputs a token, with the weight (Out, In) as the rank holds it.
type Linear struct {
	In, Out int
	// Input is what the layer's input (its products' A operand forward,
	// B of the weight gradient) is stored as: NormOut for the layers a
	// norm feeds (the fused Q,K,V and the MLP's first projections),
	// Compute for the others (reading the heads' output or the MLP's
	// hidden activation).
	Input tensor.DType
	// Weight is what the products read of the weight (B forward and for
	// the input gradient): Compute, its bfloat16 copy at bf16.
	Weight tensor.DType
	// Grad is what the gradient of the output is stored as (A of the
	// input gradient's and of the weight gradient's products): Compute
	// for the MLP's first projection (c_fc, gate_up_proj: the gradient
	// GELU's or SwiGLU's backward writes), for the fused Q,K,V as
	// parallel.QKVGradDType says (the gradient the attention writes), and
	// for the two output projections (c_proj, o_proj, down_proj: the
	// residual stream's gradient, Residual in the pre-norm blocks; in
	// BERT's post-norm layers float32, which the layer rounds once,
	// GradRounded); Logits for an LM head.
	Grad tensor.DType
	// GradRounded says the layer rounds its float32 output gradient into
	// Grad itself, once for both products (parallel.ProjGradDType): a
	// pass of Out elements a token where Grad is BFloat16.
	GradRounded bool
}

// BlockLinears are one block's weight products on tensor-parallel rank 0
// of cfg.TP, in the spec's order: the block's matrices (its parameters of
// two dimensions). GPT-2's are c_attn (C to 3C/tp), attn.c_proj (C/tp to
// C), mlp.c_fc (C to 4C/tp) and mlp.c_proj; a Llama's qkv_proj (its
// replicated key/value heads whole), o_proj, gate_up_proj and down_proj.
// fusedAttention says the attention runs in a device's fused kernels.
func BlockLinears(cfg config.Config, vocab int, fusedAttention bool) ([]Linear, error) {
	b, err := newLayout(cfg, vocab, 0)
	if err != nil {
		return nil, err
	}
	if cfg.Arch == "hf" {
		b.hfLayer(0)
	} else if err := b.block(0); err != nil {
		return nil, err
	}
	heads, kvHeads := cfg.Heads/b.tp, cfg.Heads/b.tp
	if b.llama {
		if kvHeads, _, err = parallel.KVSplit(cfg.Heads, cfg.KVHeadCount(), b.tp); err != nil {
			return nil, err
		}
	}
	var out []Linear
	for _, p := range b.ps {
		if len(p.Full) == 2 {
			local := p.Shard.LocalShape(p.Full)
			input := Compute(cfg)
			if normFed(p.Name) {
				input = NormOut(cfg)
			}
			grad, rounded := Compute(cfg), !normFed(p.Name) && Residual(cfg) != Compute(cfg)
			if strings.HasSuffix(p.Name, ".c_attn.weight") || strings.HasSuffix(p.Name, ".qkv_proj.weight") {
				grad = parallel.QKVGradDType(Compute(cfg), fusedAttention, heads, kvHeads)
			}
			out = append(out, Linear{In: local[1], Out: local[0], Input: input, Weight: Compute(cfg), Grad: grad, GradRounded: rounded})
		}
	}
	return out, nil
}
