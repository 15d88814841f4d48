package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// LayerNorm normalises the last dimension; its weight and bias are
// replicated on every tensor-parallel rank (their gradients come out equal
// on every rank because input and output gradient are replicated).
type LayerNorm struct {
	Name         string
	Dim          int
	Weight, Bias *Param
	Eps          float32
	// Out is what the output is stored as: Float32, or BFloat16 where only
	// matrix products (and under sequence parallelism the all-gather into
	// them) read it (a pre-norm block's or a language model's ln_f).
	Out tensor.DType

	*lnSaved
}

// lnSaved is what a layer norm's Forward keeps for its Backward: a Shadow
// has its own.
type lnSaved struct {
	inp       *tensor.Tensor
	bufs      buffers
	out       *tensor.Tensor
	mean, rst *tensor.Tensor
}

// NewLayerNorm makes a layernorm over dim channels (weight 1, bias 0),
// its parameters taken from from (nil: new ones).
func NewLayerNorm(dev tensor.Device, name string, dim int, from *ParamSet) (*LayerNorm, error) {
	if dim < 1 {
		return nil, fmt.Errorf("%s: dim %d: must be at least 1", name, dim)
	}
	w, err := from.param(dev, ParamSpec{Name: name + ".weight", Full: []int{dim}, Shard: Shard{Parts: 1}, Init: InitOnes}, 0)
	if err != nil {
		return nil, err
	}
	b, err := from.param(dev, ParamSpec{Name: name + ".bias", Full: []int{dim}, Shard: Shard{Parts: 1}, Init: InitZeros}, 0)
	if err != nil {
		return nil, err
	}
	return &LayerNorm{Name: name, Dim: dim, Weight: w, Bias: b, Eps: 1e-5, lnSaved: new(lnSaved)}, nil
}

// SetSequenceParallel marks the weight and bias as used in a
// sequence-parallel region over sp (their gradients then come from this
// rank's positions only and are summed by SequenceParallel.ReduceGrads).
// The normalisation itself is per position and does not change.
func (l *LayerNorm) SetSequenceParallel(sp *SequenceParallel) {
	on := sp != nil && sp.Size() > 1
	l.Weight.SeqReduce, l.Bias.SeqReduce = on, on
}

// Params lists the weight and bias.
func (l *LayerNorm) Params() []*Param { return []*Param{l.Weight, l.Bias} }

// Forward normalises inp (B,T,C) into the layer's (B,T,C) output.
func (l *LayerNorm) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	return l.AddForward(nil, inp, nil)
}

// AddForward is Forward(sum) after sum = a + b (a residual add), in one
// kernel; with a nil b it is Forward(a). sum is the input Backward
// differentiates at.
func (l *LayerNorm) AddForward(sum, a, b *tensor.Tensor) (*tensor.Tensor, error) {
	bs, t, err := batchShape(l.Name, a, l.Dim)
	if err != nil {
		return nil, err
	}
	dev := l.Weight.Data.Device()
	if err := l.bufs.ensure(dev, [2]int{bs, t}, func() Buffers { return LayerNormSizes(bs, t, l.Dim, l.Out).Saved }, func(get func(string) *tensor.Tensor) {
		l.out, l.mean, l.rst = get("out"), get("mean"), get("rstd")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	if b == nil {
		l.inp = a
		dev.LayerNormForward(l.out, l.mean, l.rst, a, l.Weight.Data, l.Bias.Data, l.Eps)
		return l.out, nil
	}
	l.inp = sum
	dev.AddLayerNormForward(sum, l.out, l.mean, l.rst, a, b, l.Weight.Data, l.Bias.Data, l.Eps)
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
