package cuda

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// Gradient norm and clipping that stay on the device: the squared norm,
// the clip coefficient and the norm live in small device tensors, the
// AdamW update reads the coefficient there, and nothing waits for the
// host. A training step reads the norm back with its loss, once.

// SumSquaresTo writes the sum of the squares of every element of ts into
// out (2 elements: the float64 sum as a float32 hi and lo part, which a
// float32 all-reduce sums exactly enough), or adds it to out's when
// accumulate. It enqueues work and returns; SumSquares is the form that
// returns the sum on the host.
func (d *Device) SumSquaresTo(out *tensor.Tensor, accumulate bool, ts ...*tensor.Tensor) {
	d.own("SumSquaresTo", append([]*tensor.Tensor{out}, ts...)...)
	if out.Len() != 2 {
		panic(fmt.Sprintf("tensor.SumSquaresTo: out %v has %d elements, want 2 (hi, lo)", out, out.Len()))
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	part, nparts, err := d.sumPartials("sum_squares_f32", ts)
	if err != nil {
		d.fail(err)
		return
	}
	d.launch("sum_squares_finish_f32", dim3{1, 1, 1}, dim3{1, 1, 1}, tp(out), ptr(part), i32(nparts), i32(b2i(accumulate)))
}

// ClipScale writes into out (2 elements) the gradient scale that clips the
// norm to clip (1 when clip <= 0 or the norm is within it, as
// clip/(norm+1e-6) otherwise) and the norm, from the squared norm sumsq
// (hi, lo) that SumSquaresTo made.
func (d *Device) ClipScale(out, sumsq *tensor.Tensor, clip float32) {
	d.own("ClipScale", out, sumsq)
	if out.Len() != 2 || sumsq.Len() != 2 {
		panic(fmt.Sprintf("tensor.ClipScale: out %v and sumsq %v must have 2 elements", out, sumsq))
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.launch("clip_scale_f32", dim3{1, 1, 1}, dim3{1, 1, 1}, tp(out), tp(sumsq), f32(clip))
}

// AdamWScaled is AdamW with the gradients scaled by scale's first element
// (ClipScale's output) instead of p.GradScale.
func (d *Device) AdamWScaled(param, grad, m, v *tensor.Tensor, p tensor.AdamWParams, scale *tensor.Tensor) {
	d.own("AdamWScaled", param, grad, m, v, scale)
	if scale.Len() < 1 {
		panic(fmt.Sprintf("tensor.AdamWScaled: scale %v is empty", scale))
	}
	check.AdamW(param, grad, m, v, p.Step)
	d.adamW(param, grad, m, v, p, scale.Ptr())
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
