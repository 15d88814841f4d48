package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// ParallelMLP is GPT-2's feed-forward block split as in Megatron-LM fig. 3a:
// fc (C -> Hidden) column-parallel, GELU on each rank's slice, proj
// (Hidden -> C) row-parallel. One all-reduce forward (g after proj), one
// backward (f before fc).
type ParallelMLP struct {
	Name string
	FC   *ColumnParallelLinear
	Proj *RowParallelLinear

	bufs  buffers
	h     *tensor.Tensor // (B,T,Hidden/tp) after GELU
	dh    *tensor.Tensor
	dpre  *tensor.Tensor
	hiddn int
}

// NewParallelMLP makes this rank's shard of a (dim -> hidden -> dim) MLP
// over the group tp (nil: unsharded); tp must divide hidden. projStd is the
// init std of the output projection (0: std).
func NewParallelMLP(dev tensor.Device, tp nccl.Comm, name string, dim, hidden int, seed uint64, std, projStd float32) (*ParallelMLP, error) {
	if projStd == 0 {
		projStd = std
	}
	fc, err := NewColumnParallelLinear(dev, tp, name+".c_fc", dim, hidden, LinearOptions{Bias: true, Seed: seed, Std: std})
	if err != nil {
		return nil, err
	}
	proj, err := NewRowParallelLinear(dev, tp, name+".c_proj", hidden, dim, LinearOptions{Bias: true, InputIsParallel: true, Seed: seed, Std: projStd})
	if err != nil {
		return nil, err
	}
	return &ParallelMLP{Name: name, FC: fc, Proj: proj, hiddn: hidden}, nil
}

// Params lists the layer's parameters.
func (m *ParallelMLP) Params() []*Param { return append(m.FC.Params(), m.Proj.Params()...) }

// Forward maps inp (B,T,C) to (B,T,C), both the same on every rank.
func (m *ParallelMLP) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	pre, err := m.FC.Forward(inp)
	if err != nil {
		return nil, err
	}
	dev := pre.Device()
	if err := m.bufs.ensure(dev, [2]int{pre.Dim(0), pre.Dim(1)}, func(get func(...int) *tensor.Tensor) {
		m.h = get(pre.Shape()...)
		m.dh = get(pre.Shape()...)
		m.dpre = get(pre.Shape()...)
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name, err)
	}
	dev.GELUForward(m.h, pre)
	return m.Proj.Forward(m.h)
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient (B,T,C) from dout (B,T,C).
func (m *ParallelMLP) Backward(dout, dinp *tensor.Tensor) error {
	if m.h == nil {
		return fmt.Errorf("%s: Backward before Forward", m.Name)
	}
	dev := dout.Device()
	dev.Zero(m.dh)
	if err := m.Proj.Backward(dout, m.dh); err != nil {
		return err
	}
	dev.Zero(m.dpre)
	dev.GELUBackward(m.dpre, m.FC.outLocal, m.dh)
	return m.FC.Backward(m.dpre, dinp)
}

// LayerNorm normalises the last dimension; its weight and bias are
// replicated on every tensor-parallel rank (their gradients come out equal
// on every rank because input and output gradient are replicated).
type LayerNorm struct {
	Name         string
	Dim          int
	Weight, Bias *Param
	Eps          float32

	inp       *tensor.Tensor
	bufs      buffers
	out       *tensor.Tensor
	mean, rst *tensor.Tensor
}

// NewLayerNorm makes a layernorm over dim channels (weight 1, bias 0).
func NewLayerNorm(dev tensor.Device, name string, dim int) (*LayerNorm, error) {
	if dim < 1 {
		return nil, fmt.Errorf("%s: dim %d: must be at least 1", name, dim)
	}
	w, err := newParam(dev, name+".weight", []int{dim}, Shard{Parts: 1}, paramInit{kind: InitOnes})
	if err != nil {
		return nil, err
	}
	b, err := newParam(dev, name+".bias", []int{dim}, Shard{Parts: 1}, paramInit{kind: InitZeros})
	if err != nil {
		return nil, err
	}
	return &LayerNorm{Name: name, Dim: dim, Weight: w, Bias: b, Eps: 1e-5}, nil
}

// Params lists the weight and bias.
func (l *LayerNorm) Params() []*Param { return []*Param{l.Weight, l.Bias} }

// Forward normalises inp (B,T,C) into the layer's (B,T,C) output.
func (l *LayerNorm) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	b, t, err := batchShape(l.Name, inp, l.Dim)
	if err != nil {
		return nil, err
	}
	dev := l.Weight.Data.Device()
	if err := l.bufs.ensure(dev, [2]int{b, t}, func(get func(...int) *tensor.Tensor) {
		l.out, l.mean, l.rst = get(b, t, l.Dim), get(b*t), get(b*t)
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	l.inp = inp
	dev.LayerNormForward(l.out, l.mean, l.rst, inp, l.Weight.Data, l.Bias.Data, l.Eps)
	return l.out, nil
}

// Backward accumulates into dinp (B,T,C) and the parameter gradients.
func (l *LayerNorm) Backward(dout, dinp *tensor.Tensor) error {
	if l.inp == nil {
		return fmt.Errorf("%s: Backward before Forward", l.Name)
	}
	if dout.Len() != l.out.Len() || dinp.Len() != l.inp.Len() {
		return shapeErr(l.Name, "Backward with dout %v, dinp %v after a Forward of %v", dout, dinp, l.inp)
	}
	l.Weight.Data.Device().LayerNormBackward(dinp, l.Weight.grad(), l.Bias.grad(), dout, l.inp, l.Weight.Data, l.mean, l.rst)
	return nil
}
