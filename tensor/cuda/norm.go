package cuda

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// Gradient norm and clipping that stay on the device: each gradient's
// squares, the norm and the clip coefficient live in small device tensors
// (a float64 in two float32 slots), the AdamW update reads the coefficient
// there, and nothing waits for the host. A training step reads the norm
// back with its loss, once. The rules are the CPU's (tensor/scalars.go).

// SumSquaresEach writes the float64 sum of the squares of each of ts (0
// for a nil or empty one) into out's float64 slots, and 0 into the rest.
// It enqueues work and returns.
func (d *Device) SumSquaresEach(out *tensor.Tensor, ts ...*tensor.Tensor) {
	d.own("SumSquaresEach", out)
	if out.Len() < 2*len(ts) || out.Len()%2 != 0 {
		panic(fmt.Sprintf("tensor.SumSquaresEach: out %v does not hold %d float64s", out, len(ts)))
	}
	var live []*tensor.Tensor
	for _, t := range ts {
		if t != nil && t.Len() > 0 {
			d.own("SumSquaresEach", t)
			live = append(live, t)
		}
	}
	if out.Offset()%2 != 0 {
		panic(fmt.Sprintf("tensor.SumSquaresEach: out %v starts at an odd element: its float64s would be misaligned", out))
	}
	d.enter()
	defer d.leave()
	d.fail(d.l.cuErr("cuMemsetD32Async", call(d.l.cu.memsetD32Async, out.Ptr(), 0, uintptr(out.Len()), d.stream)))
	if len(ts) == 0 {
		return
	}
	part, counts, err := d.sumPartials(live, true)
	if err != nil {
		d.fail(err)
		return
	}
	// Tensor i's partials are part[offsets[i]..offsets[i+1]): none for a
	// nil or empty one.
	offsets := make([]int32, len(ts)+1)
	k := 0
	for i, t := range ts {
		offsets[i+1] = offsets[i]
		if t != nil && t.Len() > 0 {
			offsets[i+1] += int32(counts[k])
			k++
		}
	}
	op, ok := d.upIDs(offsets)
	if !ok {
		return
	}
	d.launch("sum_squares_each_f64", d.grid1(len(ts), elemThreads), dim3{elemThreads, 1, 1}, tp(out), ptr(part), ptr(op), i64(len(ts)))
}

// SumBlocks adds in's blocks of out.Len() floats, as float64s, element by
// element in block order into out.
func (d *Device) SumBlocks(out, in *tensor.Tensor) {
	d.own("SumBlocks", out, in)
	if out.Len()%2 != 0 || out.Len() == 0 || in.Len()%out.Len() != 0 || out.Offset()%2 != 0 || in.Offset()%2 != 0 {
		panic(fmt.Sprintf("tensor.SumBlocks: in %v is not whole blocks of out %v", in, out))
	}
	n := out.Len() / 2
	d.elementwise("sum_blocks_f64", n, tp(out), tp(in), i64(n), i32(in.Len()/out.Len()))
}

// ClipNorm sums sq's float64s in order and writes the norm (a float64,
// out[0:2]) and the clip scale (out[2]: clip/(norm+1e-6) when clip > 0
// and the norm exceeds it, else 1).
func (d *Device) ClipNorm(out, sq *tensor.Tensor, clip float64) {
	d.own("ClipNorm", out, sq)
	if out.Len() != 3 || sq.Len()%2 != 0 {
		panic(fmt.Sprintf("tensor.ClipNorm: out %v must have 3 elements and sq %v pairs", out, sq))
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.launch("clip_norm_f64", dim3{1, 1, 1}, dim3{1, 1, 1}, tp(out), tp(sq), i64(sq.Len()/2), f64(clip))
}
