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

	dim int
	blockSaved
	*blockScratch
}

// blockSaved is what a block's Forward keeps for its Backward: a Shadow
// has its own.
type blockSaved struct {
	bufs buffers
	r    *tensor.Tensor // (B,T,C) residual after attention
	out  *tensor.Tensor // (B,T,C)
}

// blockScratch is what a block's Backward uses and leaves nothing in: the
// block and its shadows share it.
type blockScratch struct {
	grads buffers
	dr    *tensor.Tensor // gradient of r
	dh    *tensor.Tensor // gradient of a layernorm output
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
	ln1, err := NewLayerNorm(dev, name+".ln_1", cfg.Dim)
	if err != nil {
		return nil, err
	}
	attn, err := NewParallelSelfAttention(dev, tp, name+".attn", AttentionConfig{Dim: cfg.Dim, Heads: cfg.Heads, Causal: cfg.Causal, Seed: cfg.Seed, Std: std, ProjStd: cfg.ProjStd, SP: cfg.SP})
	if err != nil {
		return nil, err
	}
	ln2, err := NewLayerNorm(dev, name+".ln_2", cfg.Dim)
	if err != nil {
		return nil, err
	}
	mlp, err := newParallelMLP(dev, tp, cfg.SP, name+".mlp", cfg.Dim, cfg.Hidden, cfg.Seed, std, cfg.ProjStd)
	if err != nil {
		return nil, err
	}
	ln1.SetSequenceParallel(cfg.SP)
	ln2.SetSequenceParallel(cfg.SP)
	return &Block{Name: name, LN1: ln1, Attn: attn, LN2: ln2, MLP: mlp, dim: cfg.Dim, blockScratch: new(blockScratch)}, nil
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
func (b *Block) Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error) {
	bs, t, err := batchShape(b.Name, x, b.dim)
	if err != nil {
		return nil, err
	}
	dev := b.LN1.Weight.Data.Device()
	if err := b.bufs.ensure(dev, [2]int{bs, t}, func() Buffers { return blockOwnSizes(bs, t, b.dim).Saved }, func(get func(string) *tensor.Tensor) {
		b.r, b.out = get("r"), get("out")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name, err)
	}
	h, err := b.LN1.Forward(x)
	if err != nil {
		return nil, err
	}
	a, err := b.Attn.Forward(h, keyValid)
	if err != nil {
		return nil, err
	}
	dev.Add(b.r, x, a)
	h, err = b.LN2.Forward(b.r)
	if err != nil {
		return nil, err
	}
	m, err := b.MLP.Forward(h)
	if err != nil {
		return nil, err
	}
	dev.Add(b.out, b.r, m)
	return b.out, nil
}

// Backward accumulates the parameter gradients and the input gradient dx
// (B,T,C) from dout (B,T,C).
func (b *Block) Backward(dout, dx *tensor.Tensor) error {
	if b.out == nil {
		return fmt.Errorf("%s: Backward before Forward", b.Name)
	}
	if dout.Len() != b.out.Len() || dx.Len() != b.out.Len() {
		return shapeErr(b.Name, "Backward with dout %v, dx %v after a Forward to %v", dout, dx, b.out)
	}
	dev := dout.Device()
	bs, t := b.out.Dim(0), b.out.Dim(1)
	if err := b.grads.ensure(dev, [2]int{bs, t}, func() Buffers { return blockOwnSizes(bs, t, b.dim).Scratch }, func(get func(string) *tensor.Tensor) {
		b.dr, b.dh = get("dr"), get("dh")
	}); err != nil {
		return fmt.Errorf("%s: %w", b.Name, err)
	}
	dev.Copy(b.dr, dout) // the residual path
	dev.Zero(b.dh)
	if err := b.MLP.Backward(dout, b.dh); err != nil {
		return err
	}
	if err := b.LN2.Backward(b.dh, b.dr); err != nil {
		return err
	}
	dev.Axpy(dx, 1, b.dr) // the residual path
	dev.Zero(b.dh)
	if err := b.Attn.Backward(b.dr, b.dh); err != nil {
		return err
	}
	return b.LN1.Backward(b.dh, dx)
}
