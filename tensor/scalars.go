package tensor

import (
	"fmt"
	"math"
)

// A training step keeps its scalars (the squares of the gradient norm,
// the clip coefficient, the loss) in device memory, so that a GPU step
// waits for the device once: these are the CPU's forms of the operations
// that make them, by the rules the CUDA kernels follow. A float64 lives in
// two float32 slots, its low 32 bits first (the order of its bytes in
// memory on both), so that collectives that copy (all-gather) carry it bit
// for bit.

// Float64At reads the float64 in slots [2i, 2i+2) of s.
func Float64At(s []float32, i int) float64 {
	return math.Float64frombits(uint64(math.Float32bits(s[2*i])) | uint64(math.Float32bits(s[2*i+1]))<<32)
}

// SetFloat64At writes v into slots [2i, 2i+2) of s.
func SetFloat64At(s []float32, i int, v float64) {
	b := math.Float64bits(v)
	s[2*i], s[2*i+1] = math.Float32frombits(uint32(b)), math.Float32frombits(uint32(b>>32))
}

// SumSquaresEach writes into out, as float64s, the sum of the squares of
// each of ts (0 for a nil tensor) and 0 into the rest: out holds at least
// 2*len(ts) floats.
func (d *CPUDevice) SumSquaresEach(out *Tensor, ts ...*Tensor) {
	d.own("SumSquaresEach", out)
	checkFloat64s("SumSquaresEach", out, len(ts))
	for _, t := range ts {
		if t != nil && t.Len() > 0 {
			d.own("SumSquaresEach", t)
		}
	}
	o := out.Host()
	clear(o)
	for i, t := range ts {
		if t != nil && t.Len() > 0 {
			SetFloat64At(o, i, d.sumSquares(t))
		}
	}
}

// SumBlocks adds the float64 blocks of in (each out.Len() floats) element
// by element, in block order from 0, into out: the squares that the ranks
// of a group all-gathered, summed as one rank would.
func (d *CPUDevice) SumBlocks(out, in *Tensor) {
	d.own("SumBlocks", out, in)
	n := out.Len() / 2
	blocks := checkBlocks(out, in)
	o, x := out.Host(), in.Host()
	for i := range n {
		s := 0.0
		for r := range blocks {
			s += Float64At(x, r*n+i)
		}
		SetFloat64At(o, i, s)
	}
}

// ClipNorm sums the float64s of sq in order into the squared gradient
// norm and writes into out (3 floats) the norm as a float64 and, at
// out[2], the gradient scale that clips it to clip: clip/(norm+1e-6) when
// clip > 0 and the norm exceeds it, else 1.
func (d *CPUDevice) ClipNorm(out, sq *Tensor, clip float64) {
	d.own("ClipNorm", out, sq)
	if out.Len() != 3 || sq.Len()%2 != 0 {
		panic(fmt.Sprintf("tensor.ClipNorm: out %v must have 3 elements and sq %v pairs", out, sq))
	}
	s := sq.Host()
	total := 0.0
	for i := range len(s) / 2 {
		total += Float64At(s, i)
	}
	o := out.Host()
	SetFloat64At(o, 0, math.Sqrt(total))
	o[2] = clipScale(math.Sqrt(total), clip)
}

// clipScale is the gradient scale that clips norm to clip: clip/(norm+1e-6)
// when clip > 0 and norm exceeds it, else 1 (ClipNorm's rule).
func clipScale(norm, clip float64) float32 {
	if clip > 0 && norm > clip {
		return float32(clip / (norm + 1e-6))
	}
	return 1
}

// SumTo sets out[0] (adds to it when accumulate) alpha times the sum of
// x's elements, summed in float64 in order: a mean loss kept across
// micro-batches.
func (d *CPUDevice) SumTo(out *Tensor, alpha float32, accumulate bool, x *Tensor) {
	d.own("SumTo", out, x)
	var s float64
	for _, v := range x.Host() {
		s += float64(v)
	}
	v := float64(alpha) * s
	o := out.Host()
	if accumulate {
		v += float64(o[0])
	}
	o[0] = float32(v)
}

// Fetch copies src into dst: the step's one read of its scalars.
func (d *CPUDevice) Fetch(dst []float32, src *Tensor) error {
	d.CopyToHost(dst, src)
	return nil
}

// HostSyncs is 0: the CPU never waits for itself.
func (d *CPUDevice) HostSyncs() int64 { return 0 }

// checkFloat64s panics unless out holds n float64s or more.
func checkFloat64s(fn string, out *Tensor, n int) {
	if out.Len() < 2*n {
		panic(fmt.Sprintf("tensor.%s: out %v holds fewer than %d float64s", fn, out, n))
	}
}

// checkBlocks panics unless in is whole blocks of out's float64s, and
// returns how many.
func checkBlocks(out, in *Tensor) int {
	if out.Len()%2 != 0 || out.Len() == 0 || in.Len()%out.Len() != 0 {
		panic(fmt.Sprintf("tensor.SumBlocks: in %v is not whole blocks of out %v", in, out))
	}
	return in.Len() / out.Len()
}
