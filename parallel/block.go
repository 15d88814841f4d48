package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// BlockConfig sizes a transformer block.
type BlockConfig struct {
	Dim     int     // C
	Heads   int     // attention heads over all ranks
	Hidden  int     // MLP width; 0 means 4*Dim
	Causal  bool    // GPT (true) or BERT (false) attention
	Seed    uint64  // initialisation seed
	Std     float32 // init std of the weights; 0 means DefaultStd
	ProjStd float32 // init std of the two output projections; 0 means Std
	// SP, when not nil, is the sequence-parallel region of tp: the block's
	// input, output, residuals and layer norms hold this rank's (B,T/tp,C)
	// positions, and its 2 all-reduces forward become 2 all-gathers and 2
	// reduce-scatters (backward: 4 all-gathers, one per column-parallel
	// layer to gather its input again and one per row-parallel layer for
	// its output gradient, and 2 reduce-scatters).
	SP *SequenceParallel
	// Recompute is what Backward computes again instead of keeping it
	// (under full recomputation the blocks also share their saved
	// activations: ShareBuffers).
	Recompute Recompute
	// FusedAttention runs the attention fused (AttentionConfig.Fused).
	FusedAttention bool
	// Activations is what the activations only matrix products, the
	// activation kernels and the attention read are stored as (the MLP's
	// fc and GELU outputs, c_attn's, the layer norms'), and so the
	// gradients only they read (the MLP's hidden gradient, the
	// attention's gradients of its output, of Q, K and V and, unfused, of
	// the scores), the residual stream (r and out, which the norms read
	// widened and the adds round into), its gradient (turned in place
	// into the input's by BackwardInPlace) and the norms' outputs'
	// gradient dh: BFloat16 under bf16 compute. The block's input and
	// output gradient may be float32 or bfloat16 (the model hands it
	// bfloat16 at bf16: the embeddings' output and a pipeline stage's).
	Activations tensor.DType
	From        *ParamSet // the model's parameters, where the block takes its own; nil: new ones
}

// Block is a pre-LayerNorm transformer block, as GPT-2:
//
//	r = x + Attn(LN1(x));  out = r + MLP(LN2(r))
//
// Activations and residuals are replicated on every tensor-parallel rank
// (with BlockConfig.SP: split along the sequence);
// inside, attention and MLP are split Megatron-style, so a block costs
// exactly 2 all-reduces of (B,T,C) forward and 2 backward.
type Block struct {
	Name     string
	LN1, LN2 *LayerNorm
	Attn     *ParallelSelfAttention
	MLP      *ParallelMLP

	prenorm
}

// prenorm is the residual skeleton of a pre-norm block, GPT-2's and
// Llama's alike, over its four sublayers:
//
//	r = x + attn(norm1(x));  out = r + mlp(norm2(r))
//
// with the buffers of the residual stream and the recomputation modes. A
// block sets the sublayers from its typed fields (bind) when it is made
// and when it is shadowed.
type prenorm struct {
	name      string
	dim       int
	stream    tensor.DType // what the residual stream (r, out) is stored as: the activations' dtype
	recompute Recompute
	norm1     sublayer
	attn      attentionSublayer
	norm2     residualNorm
	mlp       sublayer
	dev       func() tensor.Device // where the block's weights live

	blockSaved
	*blockScratch
}

// sublayer is a norm or an MLP inside a block.
type sublayer interface {
	Forward(inp *tensor.Tensor) (*tensor.Tensor, error)
	Backward(dout, dinp *tensor.Tensor) error
}

// residualNorm is the norm after a block's attention, which takes the
// residual add before it into its kernel.
type residualNorm interface {
	sublayer
	AddForward(sum, a, b *tensor.Tensor) (*tensor.Tensor, error)
}

// attentionSublayer is the attention inside a block.
type attentionSublayer interface {
	Forward(inp *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
	Backward(dout, dinp *tensor.Tensor) error
}

// blockSaved is what a block's Forward keeps for its Backward: a Shadow
// has its own.
type blockSaved struct {
	bufs buffers
	r    *tensor.Tensor // (B,T,C) residual after attention (nil under full recomputation)
	out  *tensor.Tensor // (B,T,C)
	// Under full recomputation, the input and key mask the forward runs
	// again on.
	in       *tensor.Tensor
	keyValid []int32
}

// blockScratch is what a block's Backward uses and leaves nothing in: the
// block and its shadows share it.
type blockScratch struct {
	grads buffers
	dh    *tensor.Tensor // gradient of a layernorm output
	rFull *tensor.Tensor // r under full recomputation
}

// NewBlock makes this rank's shard of a transformer block named name (e.g.
// "h.0") over the group tp (nil: unsharded).
func NewBlock(dev tensor.Device, tp nccl.Comm, name string, cfg BlockConfig) (*Block, error) {
	if cfg.Hidden == 0 {
		cfg.Hidden = 4 * cfg.Dim
	}
	if tp != nil && cfg.Hidden%tp.Size() != 0 {
		return nil, fmt.Errorf("%s: MLP width %d is not a multiple of tp %d", name, cfg.Hidden, tp.Size())
	}
	std := cfg.Std
	if std == 0 {
		std = DefaultStd
	}
	ln1, err := NewLayerNorm(dev, name+".ln_1", cfg.Dim, cfg.From)
	if err != nil {
		return nil, err
	}
	attn, err := NewParallelSelfAttention(dev, tp, name+".attn", AttentionConfig{Dim: cfg.Dim, Heads: cfg.Heads, Causal: cfg.Causal, Seed: cfg.Seed, Std: std, ProjStd: cfg.ProjStd, SP: cfg.SP,
		Selective: cfg.Recompute == RecomputeSelective, Fused: cfg.FusedAttention, Activations: cfg.Activations, OutGrad: cfg.Activations, From: cfg.From})
	if err != nil {
		return nil, err
	}
	ln2, err := NewLayerNorm(dev, name+".ln_2", cfg.Dim, cfg.From)
	if err != nil {
		return nil, err
	}
	mlp, err := newParallelMLP(dev, tp, cfg.SP, name+".mlp", cfg.Dim, cfg.Hidden, cfg.Seed, std, cfg.ProjStd, cfg.From, cfg.Activations, cfg.Activations)
	if err != nil {
		return nil, err
	}
	ln1.Out = cfg.Activations
	ln2.Out = ln1.Out
	ln1.SetSequenceParallel(cfg.SP)
	ln2.SetSequenceParallel(cfg.SP)
	b := &Block{Name: name, LN1: ln1, Attn: attn, LN2: ln2, MLP: mlp, prenorm: prenorm{name: name, dim: cfg.Dim, stream: cfg.Activations, recompute: cfg.Recompute, blockScratch: new(blockScratch)}}
	b.bind()
	return b, nil
}

// bind points the skeleton at the block's layers.
func (b *Block) bind() {
	b.norm1, b.attn, b.norm2, b.mlp = b.LN1, b.Attn, b.LN2, b.MLP
	b.dev = b.LN1.Weight.Data.Device
}

// Params lists the block's parameters: ln_1, attention, ln_2, MLP.
func (b *Block) Params() []*Param {
	ps := append(b.LN1.Params(), b.Attn.Params()...)
	ps = append(ps, b.LN2.Params()...)
	return append(ps, b.MLP.Params()...)
}

// Forward maps x (B,T,C) to the block's (B,T,C) output (with sequence
// parallelism: this rank's (B,T/tp,C) positions to the same). keyValid is
// the attention's key padding mask over the full (B*T) tokens (nil:
// none). x must stay unchanged until Backward.
func (b *prenorm) Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error) {
	dev, full, err := b.prepare(x)
	if err != nil {
		return nil, err
	}
	if full {
		b.in, b.keyValid = x, keyValid
	}
	return b.forward(dev, x, keyValid)
}

// ensureScratch makes the backward's scratch for bs x t tokens.
func (b *prenorm) ensureScratch(dev tensor.Device, bs, t int) error {
	if err := b.grads.ensure(dev, [2]int{bs, t}, func() Buffers {
		return blockOwnSizes(bs, t, b.dim, b.recompute == RecomputeFull, b.stream, false).Scratch
	}, func(get func(string) *tensor.Tensor) {
		b.rFull, b.dh = get("r"), get("dh")
	}); err != nil {
		return fmt.Errorf("%s: %w", b.name, err)
	}
	return nil
}

// resid is the residual after attention: kept, or under full
// recomputation in the scratch.
func (b *prenorm) resid() *tensor.Tensor {
	if b.r != nil {
		return b.r
	}
	return b.rFull
}

// forward is Forward's pass once the buffers exist.
func (b *prenorm) forward(dev tensor.Device, x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error) {
	return b.forwardWith(dev, x, func(h *tensor.Tensor) (*tensor.Tensor, error) { return b.attn.Forward(h, keyValid) })
}

// forwardWith is the block's pass with attn as its attention.
func (b *prenorm) forwardWith(dev tensor.Device, x *tensor.Tensor, attn func(h *tensor.Tensor) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	r := b.resid()
	h, err := b.norm1.Forward(x)
	if err != nil {
		return nil, err
	}
	a, err := attn(h)
	if err != nil {
		return nil, err
	}
	h, err = b.norm2.AddForward(r, x, a) // r = x + a, normalised
	if err != nil {
		return nil, err
	}
	m, err := b.mlp.Forward(h)
	if err != nil {
		return nil, err
	}
	dev.Add(b.out, r, m)
	return b.out, nil
}

// Backward accumulates the parameter gradients and the input gradient dx
// (B,T,C) from dout (B,T,C), either float32 or bfloat16: BackwardInPlace
// on a copy of dout stored as the stream, added to dx. (The model runs
// BackwardInPlace, which needs no copy.)
func (b *prenorm) Backward(dout, dx *tensor.Tensor) error {
	if b.out == nil {
		return fmt.Errorf("%s: Backward before Forward", b.name)
	}
	if dout.Len() != b.out.Len() || dx.Len() != b.out.Len() {
		return shapeErr(b.name, "Backward with dout %v, dx %v after a Forward to %v", dout, dx, b.out)
	}
	dev := dout.Device()
	d, err := dev.AllocAs(b.stream, b.out.Shape()...)
	if err != nil {
		return fmt.Errorf("%s: %w", b.name, err)
	}
	defer dev.Free(d)
	dev.Copy(d, dout.Reshape(b.out.Shape()...))
	if err := b.BackwardInPlace(d); err != nil {
		return err
	}
	dev.Axpy(dx, 1, d.Reshape(dx.Shape()...))
	return nil
}

// BackwardInPlace accumulates the parameter gradients and turns d, the
// gradient of the block's output (B,T,C), into the gradient of its input:
// the residual path runs in d itself, each norm's backward adding its
// input gradient into it (rounding once where d is bfloat16, as llm.c's
// dresidual), so the residual path costs no copy and no buffer.
func (b *prenorm) BackwardInPlace(d *tensor.Tensor) error {
	if b.out == nil {
		return fmt.Errorf("%s: Backward before Forward", b.name)
	}
	if d.Len() != b.out.Len() {
		return shapeErr(b.name, "Backward with dout %v after a Forward to %v", d, b.out)
	}
	dev := d.Device()
	if err := b.ensureScratch(dev, b.out.Dim(0), b.out.Dim(1)); err != nil {
		return err
	}
	if b.recompute == RecomputeFull {
		// The forward again from the block's input, into the shared
		// buffers: the same kernels on the same input, the same bits (out
		// is written again unchanged).
		if _, err := b.forward(dev, b.in, b.keyValid); err != nil {
			return err
		}
	}
	dev.Zero(b.dh)
	if err := b.mlp.Backward(d, b.dh); err != nil {
		return err
	}
	if err := b.norm2.Backward(b.dh, d); err != nil { // d: the gradient of r
		return err
	}
	dev.Zero(b.dh)
	if err := b.attn.Backward(d, b.dh); err != nil {
		return err
	}
	return b.norm1.Backward(b.dh, d)
}

// ShareBuffers makes b use the scratch of with, a block of the same shape
// that never runs at the same time (the blocks of one model run one after
// the other): the backward's scratch and the projections' outputs, which
// the residual adds read at once (LinearOptions.TransientOut), count once
// for all the blocks, not once per block. Under full recomputation b also
// uses with's layers' saved activations, which its Backward makes again.
// Call it before b's first Forward.
func (b *Block) ShareBuffers(with *Block) {
	b.Release()
	b.blockScratch = with.blockScratch
	b.Attn.ShareScratch(with.Attn)
	b.MLP.ShareScratch(with.MLP)
	if b.recompute == RecomputeFull {
		b.LN1.lnSaved, b.LN2.lnSaved = with.LN1.lnSaved, with.LN2.lnSaved
		b.Attn.attnSaved, b.MLP.mlpSaved = with.Attn.attnSaved, with.MLP.mlpSaved
		b.Attn.QKV.colSaved, b.Attn.Proj.rowSaved = with.Attn.QKV.colSaved, with.Attn.Proj.rowSaved
		b.MLP.FC.colSaved, b.MLP.Proj.rowSaved = with.MLP.FC.colSaved, with.MLP.Proj.rowSaved
	}
}

// prepare checks x's shape and allocates the block's own buffers for it
// (and, under full recomputation, its scratch up front); full says the
// block recomputes in full.
func (b *prenorm) prepare(x *tensor.Tensor) (dev tensor.Device, full bool, err error) {
	bs, t, err := batchShape(b.name, x, b.dim)
	if err != nil {
		return nil, false, err
	}
	dev = b.dev()
	full = b.recompute == RecomputeFull
	if err := b.bufs.ensure(dev, [2]int{bs, t}, func() Buffers { return blockOwnSizes(bs, t, b.dim, full, b.stream, false).Saved }, func(get func(string) *tensor.Tensor) {
		b.r, b.out = get("r"), get("out")
	}); err != nil {
		return nil, false, fmt.Errorf("%s: %w", b.name, err)
	}
	if full {
		if err := b.ensureScratch(dev, bs, t); err != nil {
			return nil, false, err
		}
	}
	return dev, full, nil
}
