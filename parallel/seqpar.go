package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// SequenceParallel is the sequence-parallel region of one tensor-parallel
// group (Megatron-LM, arXiv 2205.05198 §4.2.2). Outside the attention and
// MLP (the layer norms, the residual additions, the position embedding:
// the region where the activations would otherwise be replicated), each
// rank holds only its part of the sequence, and the all-reduces of the
// tensor-parallel layers split in two:
//
//   - Gather (the paper's g): an all-gather of the sequence entering a
//     column-parallel layer forward; its backward is a ReduceScatter.
//   - ReduceScatter (the paper's ḡ): the partial sums leaving a
//     row-parallel layer (or the vocab-parallel embedding) reduced and cut
//     along the sequence forward; its backward is a Gather.
//
// Layout: activations are (B,T,C) row-major (sample-major, as the engine's
// (B*T, C) rows); rank r of tp holds positions [r*T/tp, (r+1)*T/tp) of every
// sample, a (B,T/tp,C) tensor. T must be a multiple of tp. The collectives
// run on a rank-major packed buffer (tp, B, T/tp, C); one strided copy
// (Copy2D) moves between it and (B,T,C).
//
// A replicated parameter used in the region (layer norms, the position
// table) gets from Backward only the gradient of this rank's positions:
// its Param.SeqReduce is set, and ReduceGrads sums those gradients over
// the group once per step, after the last backward pass (with gradient
// accumulation, after every micro-batch's Backward has added its part).
//
// The full-sequence buffers are shared by every layer built with the same
// SequenceParallel (one per model): a layer gathers its input again in
// Backward rather than keeping a (B,T,C) copy, as Megatron-LM does, so the
// region's memory per rank falls by tp. The result of Gather and the
// buffer of Full are valid until the next call of the same method.
type SequenceParallel struct {
	g                              *Group
	packed, gathered, full, local  *tensor.Tensor
	grads                          *tensor.Tensor // ReduceGrads' bucket
	packedN, gatheredN, fullN, lcN int
	gradsN                         int
	// Gather's buffers for a bfloat16 input (the norms' outputs at bf16).
	packedHalf, gatheredHalf   *tensor.Tensor
	packedHalfN, gatheredHalfN int
}

// NewSequenceParallel returns the sequence-parallel region over the
// tensor-parallel group tp (nil: one rank, every operator a copy).
func NewSequenceParallel(tp nccl.Comm) *SequenceParallel {
	return &SequenceParallel{g: NewGroup(tp)}
}

// Size is the number of ranks the sequence is split over.
func (s *SequenceParallel) Size() int { return s.g.Size() }

// Rank is this rank's place in the group: it holds positions
// [Rank()*T/Size(), (Rank()+1)*T/Size()).
func (s *SequenceParallel) Rank() int { return s.g.Rank() }

// LocalSeq is the number of positions per rank of a sequence of t, or an
// error when tp does not divide t.
func (s *SequenceParallel) LocalSeq(layer string, t int) (int, error) {
	if t%s.Size() != 0 {
		return 0, shapeErr(layer, "sequence of %d positions does not split over tp %d (sequence parallelism needs seq %% tp == 0)", t, s.Size())
	}
	return t / s.Size(), nil
}

// SequenceParallelSizes are the region's shared buffers for b sequences
// of t tokens (the full sequence) of width c over tp ranks, with grads
// floats of partial gradients to sum (the Param.SeqReduce parameters'):
// packed (b*t*c), the collectives' rank-major staging; gathered (b,t,c),
// Gather's result; full (b,t,c), Full's; local (b,t/tp,c), where an
// accumulating ReduceScatter, or one into a bfloat16 out, lands before
// it is added or rounded; grads, ReduceGrads'
// bucket; where the gathered activations (the norms' outputs) are
// stored as bfloat16 (gathered), packed_bf16 and gathered_bf16, Gather's
// for them. All are scratch, one set per model. With one rank only full:
// the other operators are copies.
func SequenceParallelSizes(b, t, c, tp, grads int, gathered tensor.DType) Sizes {
	if tp <= 1 {
		return Sizes{Scratch: Buffers{buf("full", b, t, c)}}
	}
	z := Sizes{Scratch: Buffers{buf("packed", b*t*c), buf("gathered", b, t, c), buf("full", b, t, c), buf("local", b, t/tp, c)}}
	if grads > 0 {
		z.Scratch = append(z.Scratch, buf("grads", grads))
	}
	if gathered == tensor.BFloat16 {
		z.Scratch = append(z.Scratch, buf("packed_bf16", b*t*c).as(gathered), buf("gathered_bf16", b, t, c).as(gathered))
	}
	return z
}

// Reserve allocates the region's buffers for b sequences of t tokens of
// width c and grads partial gradients, with the gathered activations
// stored as gathered (SequenceParallelSizes), the model's largest, so
// that training makes none: an operator grows a buffer only for a larger
// shape.
func (s *SequenceParallel) Reserve(dev tensor.Device, b, t, c, grads int, gathered tensor.DType) error {
	s.Release()
	list := SequenceParallelSizes(b, t, c, s.Size(), grads, gathered).Scratch
	_, err := Allocate(dev, list, func(get func(string) *tensor.Tensor) {
		s.packed, s.gathered, s.full, s.local, s.grads = get("packed"), get("gathered"), get("full"), get("local"), get("grads")
		s.packedHalf, s.gatheredHalf = get("packed_bf16"), get("gathered_bf16")
	})
	if err != nil {
		s.packed, s.gathered, s.full, s.local, s.grads = nil, nil, nil, nil, nil
		s.packedHalf, s.gatheredHalf = nil, nil
		return fmt.Errorf("sequence parallel: %w", err)
	}
	size := func(t *tensor.Tensor) int {
		if t == nil {
			return 0
		}
		return t.Len()
	}
	s.packedN, s.gatheredN, s.fullN, s.lcN, s.gradsN = size(s.packed), size(s.gathered), size(s.full), size(s.local), size(s.grads)
	s.packedHalfN, s.gatheredHalfN = size(s.packedHalf), size(s.gatheredHalf)
	return nil
}

// scratch returns a view of shape shape of the shared buffer *buf, grown
// (freed and allocated again) when too small.
func (s *SequenceParallel) scratch(dev tensor.Device, buf **tensor.Tensor, have *int, shape ...int) (*tensor.Tensor, error) {
	return s.scratchAs(dev, tensor.Float32, buf, have, shape...)
}

// scratchAs is scratch for a buffer of elements stored as dt.
func (s *SequenceParallel) scratchAs(dev tensor.Device, dt tensor.DType, buf **tensor.Tensor, have *int, shape ...int) (*tensor.Tensor, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if *buf == nil || *have < n || (*buf).Device() != dev {
		if *buf != nil {
			(*buf).Device().Free(*buf)
		}
		t, err := dev.AllocAs(dt, n)
		if err != nil {
			*buf, *have = nil, 0
			return nil, fmt.Errorf("sequence parallel: %w", err)
		}
		*buf, *have = t, n
	}
	return (*buf).View(0, shape...), nil
}

// Gather all-gathers the sequence: in is this rank's (B,T/tp,C), the
// result the shared (B,T,C) buffer of in's dtype (a bfloat16 in, the
// norms' outputs at bf16, is gathered as bfloat16). With one rank it
// returns in.
func (s *SequenceParallel) Gather(in *tensor.Tensor) (*tensor.Tensor, error) {
	if s.Size() == 1 {
		return in, nil
	}
	b, tl, c := in.Dim(0), in.Dim(1), in.Dim(2)
	tp, dev := s.Size(), in.Device()
	pb, pn, gb, gn := &s.packed, &s.packedN, &s.gathered, &s.gatheredN
	if in.DType() == tensor.BFloat16 {
		pb, pn, gb, gn = &s.packedHalf, &s.packedHalfN, &s.gatheredHalf, &s.gatheredHalfN
	}
	packed, err := s.scratchAs(dev, in.DType(), pb, pn, tp*in.Len())
	if err != nil {
		return nil, err
	}
	out, err := s.scratchAs(dev, in.DType(), gb, gn, b, tl*tp, c)
	if err != nil {
		return nil, err
	}
	if err := s.g.AllGather(packed, in); err != nil {
		return nil, err
	}
	blk := tl * c // one sample's positions on one rank
	for r := 0; r < tp; r++ {
		dev.Copy2D(out, r*blk, tp*blk, packed, r*in.Len(), blk, b, blk)
	}
	return out, nil
}

// Full returns the shared (b,t,c) buffer a layer writes its full-sequence
// partial result into before ReduceScatter.
func (s *SequenceParallel) Full(dev tensor.Device, b, t, c int) (*tensor.Tensor, error) {
	return s.scratch(dev, &s.full, &s.fullN, b, t, c)
}

// ReduceScatter sums in (B,T,C) over the group and writes (accumulate:
// adds) this rank's positions, (B,T/tp,C), into out; a bfloat16 out gets
// the float32 sums rounded once.
func (s *SequenceParallel) ReduceScatter(out, in *tensor.Tensor, accumulate bool) error {
	dev := in.Device()
	if s.Size() == 1 {
		if accumulate {
			dev.Axpy(out, 1, in.Reshape(out.Shape()...))
		} else {
			dev.Copy(out, in.Reshape(out.Shape()...))
		}
		return nil
	}
	tp := s.Size()
	b, t, c := in.Dim(0), in.Dim(1), in.Dim(2)
	if t%tp != 0 || out.Len()*tp != in.Len() {
		return fmt.Errorf("sequence parallel: reduce-scatter of %v into %v over tp %d", in, out, tp)
	}
	tl := t / tp
	packed, err := s.scratch(dev, &s.packed, &s.packedN, in.Len())
	if err != nil {
		return err
	}
	blk := tl * c
	for r := 0; r < tp; r++ {
		dev.Copy2D(packed, r*out.Len(), blk, in, r*blk, t*c, b, blk)
	}
	dst := out
	through := accumulate || out.DType() != in.DType()
	if through {
		if dst, err = s.scratch(dev, &s.local, &s.lcN, out.Shape()...); err != nil {
			return err
		}
	}
	if err := s.g.ReduceScatter(dst, packed, nccl.Sum); err != nil {
		return err
	}
	switch {
	case accumulate:
		dev.Axpy(out, 1, dst)
	case through:
		dev.Copy(out, dst)
	}
	return nil
}

// ReduceGrads sums over the group the gradients that Backward left partial
// (Param.SeqReduce): one all-reduce of them all, packed.
func (s *SequenceParallel) ReduceGrads(params []*Param) error {
	if s.Size() == 1 {
		return nil
	}
	var ps []*Param
	n := 0
	for _, p := range params {
		if p.SeqReduce {
			ps, n = append(ps, p), n+p.Grad.Len()
		}
	}
	if n == 0 {
		return nil
	}
	dev := ps[0].Grad.Device()
	buf, err := s.scratch(dev, &s.grads, &s.gradsN, n)
	if err != nil {
		return err
	}
	off := 0
	for _, p := range ps {
		dev.Copy(buf.View(off, p.Grad.Len()), p.Grad)
		off += p.Grad.Len()
	}
	if err := s.g.AllReduce(buf, nccl.Sum); err != nil {
		return fmt.Errorf("sequence-parallel gradients: %w", err)
	}
	off = 0
	for _, p := range ps {
		dev.Copy(p.Grad, buf.View(off, p.Grad.Len()))
		off += p.Grad.Len()
	}
	return nil
}

// Release frees the shared buffers.
func (s *SequenceParallel) Release() {
	for _, b := range []**tensor.Tensor{&s.packed, &s.gathered, &s.full, &s.local, &s.grads, &s.packedHalf, &s.gatheredHalf} {
		if *b != nil {
			(*b).Device().Free(*b)
			*b = nil
		}
	}
	s.packedN, s.gatheredN, s.fullN, s.lcN, s.gradsN = 0, 0, 0, 0, 0
	s.packedHalfN, s.gatheredHalfN = 0, 0
}
