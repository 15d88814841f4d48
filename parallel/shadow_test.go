package parallel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// shadowStage is what a pipeline stage runs: the embeddings (on token ids)
// or the position embedding alone (on an input x, whose gradient it then
// passes on), two blocks, and without sequence parallelism a gathering
// column-parallel layer into a scattering row-parallel one (the linear
// layers' other scratch).
type shadowStage struct {
	wte    *VocabParallelEmbedding
	wpe    *PositionEmbedding
	blocks []*Block
	col    *ColumnParallelLinear
	row    *RowParallelLinear
}

func newShadowStage(dev tensor.Device, tp nccl.Comm, sp *SequenceParallel) (*shadowStage, error) {
	s := &shadowStage{}
	var err error
	if s.wte, err = NewVocabParallelEmbedding(dev, tp, "wte", ckVocab, ckDim, ckSeed, 0.2, nil); err != nil {
		return nil, err
	}
	if s.wpe, err = NewPositionEmbedding(dev, "wpe", ckT, ckDim, ckSeed, 0.2, nil); err != nil {
		return nil, err
	}
	if sp != nil {
		if err := s.wte.SetSequenceParallel(sp); err != nil {
			return nil, err
		}
		s.wpe.SetSequenceParallel(sp)
	}
	for l := range 2 {
		b, err := NewBlock(dev, tp, fmt.Sprintf("h.%d", l), BlockConfig{Dim: ckDim, Heads: ckHeads, Seed: ckSeed, Std: 0.2, SP: sp})
		if err != nil {
			return nil, err
		}
		s.blocks = append(s.blocks, b)
	}
	if sp == nil {
		if s.col, err = NewColumnParallelLinear(dev, tp, "col", ckDim, 2*ckDim, LinearOptions{Bias: true, GatherOutput: true, Seed: ckSeed, Std: 0.2}); err != nil {
			return nil, err
		}
		if s.row, err = NewRowParallelLinear(dev, tp, "row", 2*ckDim, ckDim, LinearOptions{Bias: true, Seed: ckSeed, Std: 0.2}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *shadowStage) shadow() *shadowStage {
	c := &shadowStage{wte: s.wte.Shadow(), wpe: s.wpe.Shadow()}
	for _, b := range s.blocks {
		c.blocks = append(c.blocks, b.Shadow())
	}
	if s.col != nil {
		c.col, c.row = s.col.Shadow(), s.row.Shadow()
	}
	return c
}

func (s *shadowStage) params() []*Param {
	ps := append(s.wte.Params(), s.wpe.Params()...)
	for _, b := range s.blocks {
		ps = append(ps, b.Params()...)
	}
	if s.col != nil {
		ps = append(ps, s.col.Params()...)
		ps = append(ps, s.row.Params()...)
	}
	return ps
}

func (s *shadowStage) release() {
	s.wte.Release()
	s.wpe.Release()
	for _, b := range s.blocks {
		b.Release()
	}
	if s.col != nil {
		s.col.Release()
		s.row.Release()
	}
}

// forward runs the stage on ids (x nil) or on x.
func (s *shadowStage) forward(ids []int32, x *tensor.Tensor, mask []int32) (*tensor.Tensor, error) {
	var err error
	if x == nil {
		if x, err = s.wte.Forward(ids, ckB, ckT); err != nil {
			return nil, err
		}
	}
	if x, err = s.wpe.Forward(x); err != nil {
		return nil, err
	}
	for _, b := range s.blocks {
		if x, err = b.Forward(x, mask); err != nil {
			return nil, err
		}
	}
	if s.col != nil {
		if x, err = s.col.Forward(x); err != nil {
			return nil, err
		}
		if x, err = s.row.Forward(x); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// backward runs the stage backward from dout, adding the input gradient
// into dx when the forward took an x (else into the embedding table).
func (s *shadowStage) backward(dev tensor.Device, dout, dx *tensor.Tensor, fromIDs bool) error {
	g, err := dev.Alloc(dout.Shape()...)
	if err != nil {
		return err
	}
	defer func() { dev.Free(g) }()
	dev.Copy(g, dout)
	next := func(run func(in, out *tensor.Tensor) error, shape ...int) error {
		out, err := dev.Alloc(shape...)
		if err != nil {
			return err
		}
		dev.Zero(out)
		if err := run(g, out); err != nil {
			return err
		}
		dev.Free(g)
		g = out
		return nil
	}
	if s.col != nil {
		if err := next(s.row.Backward, ckB, ckT, 2*ckDim); err != nil {
			return err
		}
		if err := next(s.col.Backward, dout.Shape()...); err != nil {
			return err
		}
	}
	for l := len(s.blocks) - 1; l >= 0; l-- {
		if err := next(s.blocks[l].Backward, dout.Shape()...); err != nil {
			return err
		}
	}
	if fromIDs {
		if err := s.wpe.Backward(g, nil); err != nil {
			return err
		}
		return s.wte.Backward(g)
	}
	return s.wpe.Backward(g, dx)
}

// TestShadowInterleaved runs two micro-batches A and B through a stage of
// layers and a shadow of it as a pipeline stage does (forward A, forward
// B on the shadow, backward A, backward B on the shadow) and through the
// layers alone one after the other (forward A, backward A, forward B,
// backward B): the outputs, the input gradients and every parameter
// gradient are bit for bit the same, at tp 1, tp 2 and tp 2 with
// sequence parallelism, from token ids and from an input tensor, with a
// different key padding mask per micro-batch.
func TestShadowInterleaved(t *testing.T) {
	for _, tc := range []struct {
		tp int
		sp bool
	}{{1, false}, {2, false}, {2, true}} {
		for _, fromIDs := range []bool{true, false} {
			name := fmt.Sprintf("tp%d sp %v ids %v", tc.tp, tc.sp, fromIDs)
			err := nccl.RunInProcess(tc.tp, func(c nccl.Comm) error {
				return shadowInterleaved(c, tc.sp, fromIDs)
			})
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

func shadowInterleaved(c nccl.Comm, withSP, fromIDs bool) error {
	dev := tensor.NewCPU()
	var tp nccl.Comm
	var sp *SequenceParallel
	tl := ckT
	if c.Size() > 1 {
		tp = c
	}
	if withSP {
		sp, tl = NewSequenceParallel(tp), ckT/c.Size()
	}
	s, err := newShadowStage(dev, tp, sp)
	if err != nil {
		return err
	}
	params := s.params()
	r := rand.New(rand.NewPCG(5, uint64(c.Rank())))
	rnd := func() *tensor.Tensor {
		x, err := dev.Alloc(ckB, tl, ckDim)
		if err != nil {
			panic(err)
		}
		v := make([]float32, x.Len())
		for i := range v {
			v[i] = r.Float32()*2 - 1
		}
		dev.CopyFromHost(x, v)
		return x
	}
	// Micro-batches A and B: ids, mask, input x (nil from ids), the
	// gradient of the output, and what the input gradient starts from
	// (Backward adds into it).
	type micro struct {
		ids, mask   []int32
		x, dout, dx *tensor.Tensor
	}
	var mb [2]micro
	for i := range mb {
		m := micro{mask: keyMask(ckB, ckT), x: rnd(), dout: rnd(), dx: rnd()}
		m.mask[ckT-1-i] = 0 // another padded key per micro-batch
		for range ckB * ckT {
			m.ids = append(m.ids, int32(r.IntN(ckVocab)))
		}
		if fromIDs {
			m.x = nil
		}
		mb[i] = m
	}
	type outcome struct {
		out, dx [2][]float32
		grads   [][]float32
	}
	// run runs the ops in order ("fA": forward A on layers[0], "bB":
	// backward B on layers[1]) and returns the outputs, the input gradients
	// and the parameter gradients.
	run := func(order []string, layers [2]*shadowStage) (outcome, error) {
		var o outcome
		MarkGradsStale(params)
		var outs, dxs [2]*tensor.Tensor
		for i, m := range mb {
			if dxs[i], err = dev.Alloc(m.dx.Shape()...); err != nil {
				return o, err
			}
			defer dev.Free(dxs[i])
			dev.Copy(dxs[i], m.dx)
		}
		for _, op := range order {
			i := int(op[1] - 'A')
			m := mb[i]
			if op[0] == 'b' {
				if err := layers[i].backward(dev, m.dout, dxs[i], fromIDs); err != nil {
					return o, err
				}
				continue
			}
			if outs[i], err = layers[i].forward(m.ids, m.x, m.mask); err != nil {
				return o, err
			}
			o.out[i] = download(outs[i])
		}
		ZeroStaleGrads(params)
		for i := range mb {
			o.dx[i] = download(dxs[i])
			if layers[0] != layers[1] && !slices.Equal(download(outs[i]), o.out[i]) {
				return o, fmt.Errorf("micro-batch %c: the output changed after the other's forward", 'A'+i)
			}
		}
		for _, p := range params {
			o.grads = append(o.grads, download(p.Grad))
		}
		return o, nil
	}
	base := dev.MemStats().Current
	// The shadow is made after the layers ran, their buffers made.
	seq, err := run([]string{"fA", "bA", "fB", "bB"}, [2]*shadowStage{s, s})
	if err != nil {
		return err
	}
	shadow := s.shadow()
	inter, err := run([]string{"fA", "fB", "bA", "bB"}, [2]*shadowStage{s, shadow})
	if err != nil {
		return err
	}
	for i := range mb {
		if !slices.Equal(inter.out[i], seq.out[i]) {
			return fmt.Errorf("rank %d: micro-batch %c: the interleaved output differs", c.Rank(), 'A'+i)
		}
		if !slices.Equal(inter.dx[i], seq.dx[i]) {
			return fmt.Errorf("rank %d: micro-batch %c: the interleaved input gradient differs", c.Rank(), 'A'+i)
		}
	}
	for k, p := range params {
		if !slices.Equal(inter.grads[k], seq.grads[k]) {
			return fmt.Errorf("rank %d: %s: the interleaved gradient differs", c.Rank(), p.Name)
		}
	}
	// Releasing the layers and their shadow frees every buffer they made
	// and no parameter.
	shadow.release()
	s.release()
	if sp != nil {
		sp.Release()
	}
	if got := dev.MemStats().Current; got != base {
		return fmt.Errorf("rank %d: %d B allocated after releasing the layers and their shadow, %d B before their first forward", c.Rank(), got, base)
	}
	return nil
}
