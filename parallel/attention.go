package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// AttentionConfig sizes a self-attention layer.
type AttentionConfig struct {
	Dim    int    // C, the model width
	Heads  int    // NH, over all ranks; Heads/tp per rank
	Causal bool   // mask future keys (GPT); else only key padding masks (BERT)
	Seed   uint64 // initialisation seed
	Std    float32
	// ProjStd is the init std of the output projection (GPT-2 scales it by
	// 1/sqrt(2*layers)); 0 means Std.
	ProjStd float32
	// SP, when not nil, is the sequence-parallel region of tp: the input
	// and output are this rank's (B,T/tp,C) positions (the QKV projection
	// all-gathers, the output projection reduce-scatters).
	SP *SequenceParallel
	// Selective keeps no softmax probabilities: Backward computes them
	// again from the saved Q, K and V (RecomputeSelective).
	Selective bool
	// Fused runs the attention in the device's fused kernels
	// (tensor.FusedAttention): no (B,nh,T,T) probabilities are kept, and
	// Backward recomputes them in the kernels whatever Selective says.
	// The layer refuses a device without them.
	Fused bool
	// Activations is what the fused Q,K,V projection's output and the
	// heads' output y, which only the attention's products or fused
	// kernels and the output projection's products read, are stored as
	// (BFloat16 under bf16 compute), and their gradients; and, unfused,
	// the probabilities and the scores' gradient.
	Activations tensor.DType
	// OutGrad is what the gradient of the layer's output arrives as (the
	// residual stream's): a float32 one the output projection rounds once
	// into Activations for both its products (ProjGradDType); a pre-norm
	// block hands it over as Activations already.
	OutGrad tensor.DType
	From    *ParamSet // the model's parameters, where the layer takes its own; nil: new ones
}

// ParallelSelfAttention is multi-head self-attention split by heads
// (Megatron-LM fig. 3b): the fused Q,K,V projection is column-parallel, so
// each rank computes Heads/tp whole heads, and the output projection is
// row-parallel, ending in one all-reduce. Forward: one all-reduce; Backward:
// one (the f before the QKV projection).
type ParallelSelfAttention struct {
	Name string
	QKV  *ColumnParallelLinear // (3C, C) as [Q;K;V], 3 blocks split over ranks
	Proj *RowParallelLinear    // (C, C), input parallel

	dim, heads, nh, hd int // full width, full heads, heads on this rank, head size
	causal             bool
	selective          bool // recompute the probabilities in Backward (RecomputeSelective)
	sp                 *SequenceParallel
	fused              tensor.FusedAttention // nil: the unfused attention

	*attnSaved
	*attnScratch
}

// attnSaved is what attention's Forward keeps for its Backward: a Shadow
// has its own.
type attnSaved struct {
	keyValid []int32
	bufs     buffers
	att      *tensor.Tensor // (B, nh, T, T) softmax probabilities
	lse      *tensor.Tensor // (B, nh, T) the rows' log-sum-exp, fused
	y        *tensor.Tensor // (B, T, nh*hd) attention output before the projection
}

// attnScratch is what attention's calls use and leave nothing in past
// their return (Backward's gradients; the forward's float32 scores, in
// datt, when the probabilities are bfloat16): the layer and its shadows
// share it.
type attnScratch struct {
	grads      phasedBuffers  // attnForwardScratch's, made by Forward; the rest by Backward
	attScratch *tensor.Tensor // (B, nh, T, T) the probabilities under selective recomputation
	dqkv       *tensor.Tensor // (B, T, 3*nh*hd)
	datt       *tensor.Tensor // (B, nh, T, T)
	dpre       *tensor.Tensor // (B, nh, T, T), stored as the probabilities
	dy         *tensor.Tensor // (B, T, nh*hd)
	delta      *tensor.Tensor // (B, nh, T) the fused backward's rowsum(dy*y)
}

// NewParallelSelfAttention makes this rank's heads of a self-attention layer
// over the group tp (nil: unsharded). Heads must divide Dim and tp must
// divide Heads.
func NewParallelSelfAttention(dev tensor.Device, tp nccl.Comm, name string, cfg AttentionConfig) (*ParallelSelfAttention, error) {
	g := NewGroup(tp)
	if cfg.Dim < 1 || cfg.Heads < 1 {
		return nil, fmt.Errorf("%s: dim %d, heads %d: must be at least 1", name, cfg.Dim, cfg.Heads)
	}
	if cfg.Dim%cfg.Heads != 0 {
		return nil, fmt.Errorf("%s: dim %d is not a multiple of heads %d", name, cfg.Dim, cfg.Heads)
	}
	if cfg.Heads%g.Size() != 0 {
		return nil, fmt.Errorf("%s: heads %d is not a multiple of tp %d: each tensor-parallel rank needs whole heads", name, cfg.Heads, g.Size())
	}
	projStd := cfg.ProjStd
	if projStd == 0 {
		projStd = cfg.Std
	}
	qkv, err := NewColumnParallelLinear(dev, tp, name+".c_attn", cfg.Dim, 3*cfg.Dim, LinearOptions{Bias: true, Blocks: 3, Seed: cfg.Seed, Std: cfg.Std, SequenceParallel: cfg.SP, From: cfg.From, OutDType: cfg.Activations})
	if err != nil {
		return nil, err
	}
	proj, err := NewRowParallelLinear(dev, tp, name+".c_proj", cfg.Dim, cfg.Dim, LinearOptions{Bias: true, InputIsParallel: true, TransientOut: true, Seed: cfg.Seed, Std: projStd, SequenceParallel: cfg.SP, From: cfg.From, GradDType: ProjGradDType(cfg.Activations, cfg.OutGrad)})
	if err != nil {
		return nil, err
	}
	fused, err := fusedAttention(dev, name, cfg.Fused, cfg.Dim/cfg.Heads)
	if err != nil {
		return nil, err
	}
	return &ParallelSelfAttention{Name: name, QKV: qkv, Proj: proj, dim: cfg.Dim, heads: cfg.Heads,
		nh: cfg.Heads / g.Size(), hd: cfg.Dim / cfg.Heads, causal: cfg.Causal, selective: cfg.Selective, sp: cfg.SP, fused: fused,
		attnSaved: new(attnSaved), attnScratch: new(attnScratch)}, nil
}

// fusedAttention is dev's fused attention for heads of hd where want asks
// for it (nil where it does not), or an error naming the layer where dev
// has none.
func fusedAttention(dev tensor.Device, name string, want bool, hd int) (tensor.FusedAttention, error) {
	if !want {
		return nil, nil
	}
	f, why := tensor.FusedAttentionOn(dev, hd)
	if f == nil {
		return nil, fmt.Errorf("%s: fused attention: %s", name, why)
	}
	return f, nil
}

// Params lists the layer's parameters.
func (a *ParallelSelfAttention) Params() []*Param {
	return append(a.QKV.Params(), a.Proj.Params()...)
}

// ShareScratch makes a use the scratch of with, an attention of the same
// shape that never runs at the same time (the layers of one model): its
// own and its projections', which hold nothing past a call (Backward's
// working buffers, the output the caller reads at once). Call it before
// a's first Forward.
func (a *ParallelSelfAttention) ShareScratch(with *ParallelSelfAttention) {
	a.grads.release()
	a.attnScratch = with.attnScratch
	shareProjections(a.QKV, with.QKV, a.Proj, with.Proj)
}

// Forward computes self-attention over inp (B,T,C), the same on every rank,
// and returns (B,T,C), the same on every rank, in c_proj's output buffer,
// which the next Forward of an attention sharing its scratch (a Shadow,
// Block.ShareBuffers) writes over: read it before. keyValid, when not
// nil, is (B*T) with 0 at padding tokens, which no query attends to; it
// must stay unchanged until Backward.
func (a *ParallelSelfAttention) Forward(inp *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error) {
	b, t, err := batchShape(a.Name, inp, a.dim)
	if err != nil {
		return nil, err
	}
	if a.sp != nil {
		t *= a.sp.Size() // the QKV projection gathers the sequence
	}
	if keyValid != nil && len(keyValid) != b*t {
		return nil, shapeErr(a.Name, "key mask of %d entries for a batch of %dx%d tokens", len(keyValid), b, t)
	}
	dev := a.QKV.Weight.Data.Device()
	cl := a.nh * a.hd
	if err := a.bufs.ensure(dev, [2]int{b, t}, func() Buffers {
		return attentionCoreSizes(b, t, a.nh, cl, a.selective, a.fused != nil, a.QKV.opt.OutDType).Saved
	}, func(get func(string) *tensor.Tensor) {
		a.att, a.lse, a.y = get("att"), get("lse"), get("y")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", a.Name, err)
	}
	if (a.selective || a.QKV.opt.OutDType == tensor.BFloat16) && a.fused == nil {
		// The probabilities in the scratch, or their float32 scores
		// (attnForwardScratch).
		if err := a.ensureScratch(dev, b, t, false); err != nil {
			return nil, err
		}
	}
	a.keyValid = keyValid
	qkv, err := a.QKV.Forward(inp) // (B,T,3*cl): [q | k | v], heads contiguous in each
	if err != nil {
		return nil, err
	}
	if a.fused != nil {
		a.fused.FusedAttentionForward(a.y, a.lse, qkv, tensor.PackedHeads(a.nh, a.hd), a.causal, keyValid)
		return a.Proj.Forward(a.y)
	}
	// min(B, nh) batched GEMMs per product (tensor.AttentionForward).
	tensor.AttentionForward(a.y, a.probs(), a.scores(), qkv, a.nh, a.causal, keyValid)
	return a.Proj.Forward(a.y)
}

// attnForwardScratch are the scratch buffers an attention's Forward
// uses: the probabilities under selective recomputation and, where the
// probabilities are stored as act, bfloat16, their float32 scores (in
// datt).
func attnForwardScratch(act tensor.DType) []string {
	if act == tensor.BFloat16 {
		return []string{"att", "datt"}
	}
	return []string{"att"}
}

// ensureScratch makes the scratch for b x t tokens: Forward's, and with
// backward the backward's too.
func (a *ParallelSelfAttention) ensureScratch(dev tensor.Device, b, t int, backward bool) error {
	cl := a.nh * a.hd
	if err := a.grads.ensure(dev, [2]int{b, t}, func() Buffers {
		return attentionCoreSizes(b, t, a.nh, cl, a.selective, a.fused != nil, a.QKV.opt.OutDType).Scratch
	}, attnForwardScratch(a.QKV.opt.OutDType), backward, func(get func(string) *tensor.Tensor) {
		a.attScratch = get("att")
		takeDatt(&a.datt, get)
	}, func(get func(string) *tensor.Tensor) {
		a.dpre, a.dy, a.dqkv, a.delta = get("dpre"), get("dy"), get("dqkv"), get("delta")
		takeDatt(&a.datt, get)
	}); err != nil {
		return fmt.Errorf("%s: %w", a.Name, err)
	}
	return nil
}

// takeDatt takes datt where get has it: in Forward's part of the scratch
// or in Backward's (attnForwardScratch).
func takeDatt(datt **tensor.Tensor, get func(string) *tensor.Tensor) {
	if t := get("datt"); t != nil {
		*datt = t
	}
}

// scores is where the forward's scores go before the softmax: with
// bfloat16 probabilities the float32 datt scratch (the backward's, free
// until then), else nil (the probabilities' own buffer).
func (a *ParallelSelfAttention) scores() *tensor.Tensor { return scoresScratch(a.probs(), a.datt) }

// scoresScratch is datt where probs is bfloat16, else nil.
func scoresScratch(probs, datt *tensor.Tensor) *tensor.Tensor {
	if probs.DType() == tensor.BFloat16 {
		return datt
	}
	return nil
}

// probs is where the softmax probabilities are: kept, or with selective
// recomputation in the scratch.
func (a *ParallelSelfAttention) probs() *tensor.Tensor {
	if a.selective {
		return a.attScratch
	}
	return a.att
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient (B,T,C) from dout (B,T,C).
func (a *ParallelSelfAttention) Backward(dout, dinp *tensor.Tensor) error {
	if a.y == nil || a.QKV.inp == nil {
		return fmt.Errorf("%s: Backward before Forward", a.Name)
	}
	dev := dout.Device()
	if err := a.ensureScratch(dev, a.y.Dim(0), a.y.Dim(1), true); err != nil {
		return err
	}
	dev.Zero(a.dy)
	if err := a.Proj.Backward(dout, a.dy); err != nil {
		return err
	}
	if a.fused != nil {
		dev.Zero(a.dqkv)
		a.fused.FusedAttentionBackward(a.dqkv, a.delta, a.dy, a.y, a.lse, a.QKV.outLocal, tensor.PackedHeads(a.nh, a.hd), a.causal, a.keyValid)
		return a.QKV.Backward(a.dqkv, dinp)
	}
	if a.selective {
		// The probabilities again, from the same Q, K, V: the same bits.
		// y is written again too, unchanged, and c_proj has read it.
		tensor.AttentionForward(a.y, a.attScratch, a.scores(), a.QKV.outLocal, a.nh, a.causal, a.keyValid)
	}
	// AttentionBackward accumulates, and dqkv still holds the last step's.
	dev.Zero(a.dqkv)
	tensor.AttentionBackward(a.dqkv, a.datt, a.dpre, a.dy, a.QKV.outLocal, a.probs(), a.nh)
	return a.QKV.Backward(a.dqkv, dinp)
}
