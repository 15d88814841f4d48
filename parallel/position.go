package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// PositionEmbedding adds a learned position embedding (MaxSeq, C) to the
// token embeddings, as GPT-2's wpe. Its table is replicated on every
// tensor-parallel rank: the input and its gradient are replicated, so the
// table's gradient comes out equal on every rank with no communication.
type PositionEmbedding struct {
	Name   string
	MaxSeq int
	Dim    int
	Weight *Param // (MaxSeq, C)
	// Out is what the output, the residual stream's first value, is
	// stored as: a bfloat16 one gets the float32 sum rounded once. Set it
	// before the first Forward.
	Out tensor.DType

	sp *SequenceParallel
	posSaved
}

// posSaved is what the position embedding's Forward keeps for its
// Backward: a Shadow has its own.
type posSaved struct {
	bufs  buffers
	out   *tensor.Tensor
	first int // position of the first row of each sample in the last Forward
}

// SetSequenceParallel makes the layer take this rank's (B,T/tp,C)
// positions (rank r adds table rows [r*T/tp, (r+1)*T/tp)); the table's
// gradient then covers those rows only and is summed over the group by
// SequenceParallel.ReduceGrads (Weight.SeqReduce). nil turns it off.
func (p *PositionEmbedding) SetSequenceParallel(sp *SequenceParallel) {
	p.sp = sp
	p.Weight.SeqReduce = sp != nil && sp.Size() > 1
}

// NewPositionEmbedding makes a (maxSeq, dim) position table drawn from
// N(0, std^2) keyed by (seed, name+".weight"); std 0 means DefaultStd. The
// table is taken from from (nil: a new one).
func NewPositionEmbedding(dev tensor.Device, name string, maxSeq, dim int, seed uint64, std float32, from *ParamSet) (*PositionEmbedding, error) {
	if maxSeq < 1 || dim < 1 {
		return nil, fmt.Errorf("%s: %d positions of dim %d: both must be at least 1", name, maxSeq, dim)
	}
	if std == 0 {
		std = DefaultStd
	}
	w, err := from.param(dev, ParamSpec{Name: name + ".weight", Full: []int{maxSeq, dim}, Shard: Shard{Parts: 1}, Decay: true, Std: std}, seed)
	if err != nil {
		return nil, err
	}
	return &PositionEmbedding{Name: name, MaxSeq: maxSeq, Dim: dim, Weight: w}, nil
}

// Params lists the position table.
func (p *PositionEmbedding) Params() []*Param { return []*Param{p.Weight} }

// Forward returns x (B,T,C) plus the first T rows of the table, added to
// every sequence, in the layer's (B,T,C) output. With sequence
// parallelism x is this rank's (B,T/tp,C) positions.
func (p *PositionEmbedding) Forward(x *tensor.Tensor) (*tensor.Tensor, error) {
	b, t, err := batchShape(p.Name, x, p.Dim)
	if err != nil {
		return nil, err
	}
	first := 0
	if p.sp != nil {
		first = p.sp.Rank() * t
	}
	return p.forwardAt(x, b, t, first)
}

// ForwardAt is Forward for positions first..first+T-1 of a sequence (an
// incremental decoder's new tokens), without sequence parallelism.
func (p *PositionEmbedding) ForwardAt(x *tensor.Tensor, first int) (*tensor.Tensor, error) {
	b, t, err := batchShape(p.Name, x, p.Dim)
	if err != nil {
		return nil, err
	}
	if p.sp != nil || first < 0 {
		return nil, shapeErr(p.Name, "positions from %d under sequence parallelism %v", first, p.sp != nil)
	}
	return p.forwardAt(x, b, t, first)
}

func (p *PositionEmbedding) forwardAt(x *tensor.Tensor, b, t, first int) (*tensor.Tensor, error) {
	p.first = first
	if p.first+t > p.MaxSeq {
		return nil, shapeErr(p.Name, "sequence of %d tokens is longer than the %d positions", t, p.MaxSeq)
	}
	dev := p.Weight.Data.Device()
	if err := p.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return EmbeddingSizes(b, t, p.Dim, p.Out).Saved }, func(get func(string) *tensor.Tensor) {
		p.out = get("out")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	tc := t * p.Dim
	pos := p.Weight.Data.View(p.first*p.Dim, t, p.Dim)
	for i := 0; i < b; i++ {
		dev.Add(p.out.View(i*tc, t, p.Dim), x.View(i*tc, t, p.Dim), pos)
	}
	return p.out, nil
}

// Backward accumulates the table's gradient from dout (B,T,C) and, when dx
// is not nil, adds dout to dx (the addition's input gradient is dout
// itself, so a caller may pass nil and use dout).
func (p *PositionEmbedding) Backward(dout, dx *tensor.Tensor) error {
	if p.out == nil {
		return fmt.Errorf("%s: Backward before Forward", p.Name)
	}
	if dout.Len() != p.out.Len() || (dx != nil && dx.Len() != p.out.Len()) {
		return shapeErr(p.Name, "Backward with dout %v, dx %v after a Forward to %v", dout, dx, p.out)
	}
	dev := dout.Device()
	t := p.out.Dim(1)
	tc := t * p.Dim
	g := p.Weight.grad().View(p.first*p.Dim, t, p.Dim)
	for i := 0; i < p.out.Dim(0); i++ {
		dev.Axpy(g, 1, dout.View(i*tc, t, p.Dim))
	}
	if dx != nil {
		dev.Axpy(dx, 1, dout)
	}
	return nil
}
