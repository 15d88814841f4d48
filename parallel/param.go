package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// DefaultStd is the standard deviation of normal weight initialisation
// (GPT-2's 0.02).
const DefaultStd = 0.02

// Param is one trainable tensor of this rank: its values, its gradient
// (accumulated by Backward; zero it with ZeroGrads, or mark it stale with
// MarkGradsStale, before a step), the shape of the whole tensor and how this
// rank's piece is cut from it.
type Param struct {
	Name  string         // e.g. "h.0.attn.c_attn.weight"; the init key
	Data  *tensor.Tensor // this rank's piece, shape Shard.LocalShape(Full)
	Grad  *tensor.Tensor // same shape as Data
	Full  []int          // shape of the unsharded tensor (padded vocab included)
	Shard Shard
	Decay bool // AdamW weight decay applies (weights and embeddings, not biases or norms)
	// SeqReduce marks a replicated parameter used in a sequence-parallel
	// region: Backward leaves the gradient of this rank's positions only,
	// and SequenceParallel.ReduceGrads sums it over the group.
	SeqReduce bool
	// Copy is Data rounded to bfloat16, which the matrix products read
	// under bf16 compute (ParamSet.SyncCopies refreshes it); nil when
	// they read Data.
	Copy *tensor.Tensor

	// stale is set by MarkGradsStale: Grad holds old values that the first
	// writer of the next Backward overwrites (a weight-gradient GEMM with
	// beta 0) or zeroes before accumulating.
	stale bool
}

// Operand is the tensor matrix products read p's values from: its
// bfloat16 Copy, or Data.
func (p *Param) Operand() *tensor.Tensor {
	if p.Copy != nil {
		return p.Copy
	}
	return p.Data
}

// Layer is what every layer of this package exposes to the optimizer and to
// checkpoints.
type Layer interface {
	Params() []*Param
}

// ZeroGrads zeroes the gradients of params now, a pass over their memory.
func ZeroGrads(params []*Param) {
	for _, p := range params {
		p.stale = false
		p.Grad.Device().Zero(p.Grad)
	}
}

// MarkGradsStale has the effect of ZeroGrads without a pass over the
// gradient memory: the next Backward overwrites each gradient instead of
// adding to it (weight-gradient GEMMs run with beta 0, the other kernels
// zero their gradient first). Call ZeroStaleGrads after the Backward passes,
// before reading the gradients.
func MarkGradsStale(params []*Param) {
	for _, p := range params {
		p.stale = true
	}
}

// ZeroStaleGrads zeroes the gradients that no Backward wrote since
// MarkGradsStale, so that every Grad holds the accumulated gradient.
func ZeroStaleGrads(params []*Param) {
	for _, p := range params {
		p.grad()
	}
}

// gradBeta is the GEMM beta of a kernel that writes the whole gradient:
// 0 (overwrite) for the first write after MarkGradsStale, else 1
// (accumulate).
func (p *Param) gradBeta() float32 {
	if p.stale {
		p.stale = false
		return 0
	}
	return 1
}

// grad is the gradient for a kernel that accumulates into it, zeroed first
// when MarkGradsStale left it stale.
func (p *Param) grad() *tensor.Tensor {
	if p.stale {
		p.stale = false
		p.Grad.Device().Zero(p.Grad)
	}
	return p.Grad
}

// buffers holds a layer's activation buffers for one batch shape: they are
// allocated on the first Forward of a shape and reused until the shape
// changes, so a training step allocates nothing.
type buffers struct {
	dev  tensor.Device
	key  [2]int
	made bool
	bufs []*tensor.Tensor
}

// ensure makes sure the buffers for shape key exist: when the shape
// changed, it allocates those of list (the layer's size table, called only
// then) and hands them to take by name (Allocate).
func (b *buffers) ensure(dev tensor.Device, key [2]int, list func() Buffers, take func(get func(name string) *tensor.Tensor)) error {
	if b.made && b.key == key {
		return nil
	}
	b.release()
	ts, err := Allocate(dev, list(), take)
	if err != nil {
		return err
	}
	b.dev, b.key, b.made, b.bufs = dev, key, true, ts
	return nil
}

func (b *buffers) release() {
	for _, t := range b.bufs {
		b.dev.Free(t)
	}
	b.bufs, b.made = nil, false
}

// phasedBuffers are a layer's scratch in two parts: what its Forward
// needs, made there, and what only its Backward does, made on the first
// Backward of a shape, so that a run that never trains (an evaluation)
// holds the first alone. Together they are the layer's Sizes.Scratch.
type phasedBuffers struct{ forward, backward buffers }

// ensure makes the buffers of list named in forward (handed to
// takeForward) and, with backward set, the others (to takeBackward).
func (p *phasedBuffers) ensure(dev tensor.Device, key [2]int, list func() Buffers, forward []string, backward bool,
	takeForward, takeBackward func(get func(name string) *tensor.Tensor)) error {
	if err := p.forward.ensure(dev, key, func() Buffers { f, _ := list().split(forward); return f }, takeForward); err != nil || !backward {
		return err
	}
	return p.backward.ensure(dev, key, func() Buffers { _, b := list().split(forward); return b }, takeBackward)
}

func (p *phasedBuffers) release() {
	p.forward.release()
	p.backward.release()
}

// ShapeError reports a layer input whose shape does not fit the layer.
type ShapeError struct {
	Layer string
	Msg   string
}

// Error says which layer refused which shape.
func (e *ShapeError) Error() string { return e.Layer + ": " + e.Msg }

func shapeErr(layer, format string, args ...any) error {
	return &ShapeError{Layer: layer, Msg: fmt.Sprintf(format, args...)}
}

// batchShape reads (B, T, C) from a (B,T,C) tensor and checks C.
func batchShape(layer string, x *tensor.Tensor, c int) (b, t int, err error) {
	if x == nil {
		return 0, 0, shapeErr(layer, "nil input")
	}
	if x.Rank() != 3 {
		return 0, 0, shapeErr(layer, "input %v: want (B,T,%d)", x, c)
	}
	if x.Dim(2) != c {
		return 0, 0, shapeErr(layer, "input %v: last dimension %d, want %d", x, x.Dim(2), c)
	}
	if x.Dim(0) < 1 || x.Dim(1) < 1 {
		return 0, 0, shapeErr(layer, "input %v: empty batch", x)
	}
	return x.Dim(0), x.Dim(1), nil
}
