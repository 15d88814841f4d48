package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// gradNorm is the global gradient norm and its clip coefficient, made in
// device memory by one rule on every device and layout, so that a model
// split over any tp, dp (ZeRO-1), pp adds the same numbers in the same
// order as one rank does, and its clip coefficient is the same to the bit:
//
//   - each counted parameter's float64 sum of squares (SumSquaresEach:
//     sharded parameters on every TP rank, replicated ones on TP rank 0,
//     ZeRO-1's own range of each; normViews says which);
//   - summed over each group of sum (ZeRO-1's DP group, then TP) in rank
//     order: all-gathered (a copy keeps every bit) then added block by
//     block (SumBlocks);
//   - a pipeline's stages' lists joined in stage order (all-gathered over
//     pp, each padded with zeros to the longest, which add nothing);
//   - the whole list added in order, its square root and the clip scale
//     (ClipNorm), which AdamW reads on the device.
//
// A float32 all-reduce would round the sum differently for every split.
type gradNorm struct {
	dev  tensor.Device
	sum  []*parallel.Group // summed over in rank order, in turn
	pp   *parallel.Group   // a pipeline's stages (nil: one stage)
	n    int               // float64 entries a rank gives: the stages' longest list
	clip float64
	sq   *tensor.Tensor // 2n floats: this rank's squares, then their sums
	all  *tensor.Tensor // 2n floats per rank of the largest group (nil: every group has one rank)
	// out is [0:2] the norm (a float64), [2] the clip scale and [3] a
	// slot for the step's loss, so that one read takes both.
	out *tensor.Tensor
}

// newGradNorm makes the buffers of the norm of count parameters (this
// rank's list), summed over the groups of sum, joined over pp (nil: no
// pipeline; every stage calls it, and agrees on the longest list once).
func newGradNorm(dev tensor.Device, count int, clip float64, pp *parallel.Group, sum ...*parallel.Group) (*gradNorm, error) {
	g := &gradNorm{dev: dev, sum: sum, pp: pp, n: count, clip: clip}
	widest := pp.Size()
	for _, c := range sum {
		widest = max(widest, c.Size())
	}
	if pp.Size() > 1 {
		most := []float32{float32(count)}
		if err := pp.Comm().AllReduce(most, nccl.Max); err != nil {
			return nil, fmt.Errorf("grad norm: %w", err)
		}
		g.n = int(most[0])
	}
	var err error
	if g.sq, err = dev.Alloc(2 * max(g.n, 1)); err == nil {
		if g.out, err = dev.Alloc(4); err == nil && widest > 1 {
			g.all, err = dev.Alloc(2 * max(g.n, 1) * widest)
		}
	}
	if err != nil {
		g.close()
		return nil, fmt.Errorf("grad norm: %w", err)
	}
	return g, nil
}

// compute enqueues the norm and the clip scale of the gradients views
// (this rank's list, in model order; nil for one it does not count).
func (g *gradNorm) compute(views []*tensor.Tensor) error {
	if len(views) > g.n {
		return fmt.Errorf("grad norm: %d gradients for a list of %d", len(views), g.n)
	}
	g.dev.SumSquaresEach(g.sq, views...)
	for _, c := range g.sum {
		if c.Size() == 1 {
			continue
		}
		w := g.all.View(0, g.sq.Len()*c.Size())
		if err := c.AllGather(w, g.sq); err != nil {
			return fmt.Errorf("grad norm: %w", err)
		}
		g.dev.SumBlocks(g.sq, w)
	}
	list := g.sq
	if g.pp.Size() > 1 {
		list = g.all.View(0, g.sq.Len()*g.pp.Size())
		if err := g.pp.AllGather(list, g.sq); err != nil {
			return fmt.Errorf("grad norm: %w", err)
		}
	}
	g.dev.ClipNorm(g.out.View(0, 3), list, g.clip)
	return nil
}

// scale is the clip coefficient compute leaves on the device.
func (g *gradNorm) scale() *tensor.Tensor { return g.out.View(2, 1) }

// loss is the slot beside the norm for the step's loss.
func (g *gradNorm) loss() *tensor.Tensor { return g.out.View(3, 1) }

// read waits for the device and returns the norm compute made.
func (g *gradNorm) read() (float64, error) {
	var buf [2]float32
	if err := g.dev.Fetch(buf[:], g.out.View(0, 2)); err != nil {
		return 0, err
	}
	return tensor.Float64At(buf[:], 0), nil
}

// close frees the buffers.
func (g *gradNorm) close() {
	for _, t := range []**tensor.Tensor{&g.sq, &g.all, &g.out} {
		if *t != nil {
			g.dev.Free(*t)
			*t = nil
		}
	}
}

// normViews is the norm's list of this rank's gradients: each parameter of
// params but skip (a copy another pipeline stage counts), as view gives it
// (nil: none on this rank; first: where it starts in the gradient), nil for
// a replicated one off TP rank 0 (the rank that counts it), and without
// the rows a lower rank also holds (Shard.CountedLen: key/value heads
// replicated over tp).
func normViews(params []*parallel.Param, skip *parallel.Param, tpRank int, view func(i int) (g *tensor.Tensor, first int)) []*tensor.Tensor {
	var out []*tensor.Tensor
	for i, p := range params {
		if p == skip {
			continue
		}
		if p.Shard.Replicated() && tpRank != 0 {
			out = append(out, nil)
			continue
		}
		v, first := view(i)
		if counted := p.Shard.CountedLen(p.Full); v != nil && first+v.Len() > counted {
			if first >= counted {
				v = nil
			} else {
				v = v.View(0, counted-first)
			}
		}
		out = append(out, v)
	}
	return out
}
