//go:build !noasm

package tensor

import (
	"math"
	"os"

	"golang.org/x/sys/cpu"
)

// The AVX2+FMA loops are in vecmath_amd64.s.

//go:noescape
func geluFwdAVX2(out, inp *float32, n int)

//go:noescape
func geluBwdAVX2(dinp, inp, dout *float32, n int)

//go:noescape
func expShiftAVX2(dst, src *float32, n int, scale, shift float32) float64

//go:noescape
func expSumAVX2(src *float32, n int, shift float32) float64

//go:noescape
func expAxpyAVX2(dst, src *float32, n int, shift, alpha float32)

//go:noescape
func expScaleAVX2(x *float32, n int, shift, alpha float32)

//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func roundBF16AVX2(dst *uint16, src *float32, n int)

// widenVec widens src[:m] into dst for the m = vecLen(len(src)) elements
// it returns; the caller does the rest.
func widenVec(dst []float32, src []uint16) int {
	m := vecLen(len(src))
	if m == 0 {
		return 0
	}
	_ = dst[m-1]
	widenBF16AVX2(&dst[0], &src[0], m)
	return m
}

// roundVec rounds src[:m] into dst and returns m = vecLen(len(src)).
func roundVec(dst []uint16, src []float32) int {
	m := vecLen(len(src))
	if m == 0 {
		return 0
	}
	_ = dst[m-1]
	roundBF16AVX2(&dst[0], &src[0], m)
	return m
}

// useVecAsm says whether the row kernels use the AVX2 loops: when the CPU
// and OS support AVX2 and FMA, unless HPCRUN_NOASM=1 (tests flip it to
// check both paths).
var useVecAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA && os.Getenv("HPCRUN_NOASM") != "1"

// vecLen is the part of an n-element loop the assembly takes: a multiple of
// 8, or 0 when the assembly is off.
func vecLen(n int) int {
	if !useVecAsm {
		return 0
	}
	return n &^ 7
}

// geluFwdVec does out[:m] = gelu(inp[:m]) for the m = vecLen(len(inp))
// elements it returns; the caller does the rest.
func geluFwdVec(out, inp []float32) int {
	m := vecLen(len(inp))
	if m == 0 {
		return 0
	}
	_ = out[m-1]
	geluFwdAVX2(&out[0], &inp[0], m)
	return m
}

// geluBwdVec does dinp[:m] += gelu'(inp[:m])*dout[:m] and returns m.
func geluBwdVec(dinp, inp, dout []float32) int {
	m := vecLen(len(inp))
	if m == 0 {
		return 0
	}
	_, _ = dinp[m-1], dout[m-1]
	geluBwdAVX2(&dinp[0], &inp[0], &dout[0], m)
	return m
}

// expShiftVec does dst[:m] = exp(scale*(src[:m]-shift)) and returns m and
// the sum of those m values.
func expShiftVec(dst, src []float32, scale, shift float32) (int, float64) {
	m := vecLen(len(src))
	if m == 0 {
		return 0, 0
	}
	_ = dst[m-1]
	return m, expShiftAVX2(&dst[0], &src[0], m, scale, shift)
}

// expSumVec returns m and the sum of exp(src[:m]-shift).
func expSumVec(src []float32, shift float32) (int, float64) {
	m := vecLen(len(src))
	if m == 0 {
		return 0, 0
	}
	return m, expSumAVX2(&src[0], m, shift)
}

// expAxpyVec does dst[:m] += alpha*exp(src[:m]-shift) and returns m.
func expAxpyVec(dst, src []float32, shift, alpha float32) int {
	m := vecLen(len(src))
	if m == 0 {
		return 0
	}
	_ = dst[m-1]
	expAxpyAVX2(&dst[0], &src[0], m, shift, alpha)
	return m
}

// expScaleVec does x[:m] = alpha*exp(x[:m]-shift) in place and returns m.
func expScaleVec(x []float32, shift, alpha float32) int {
	m := vecLen(len(x))
	if m == 0 {
		return 0
	}
	expScaleAVX2(&x[0], m, shift, alpha)
	return m
}

//go:noescape
func maxAVX2(src *float32, n int) float32

// maxVec returns m and the largest of src[:m] (-Inf when m is 0).
func maxVec(src []float32) (int, float32) {
	m := vecLen(len(src))
	if m == 0 {
		return 0, float32(math.Inf(-1))
	}
	return m, maxAVX2(&src[0], m)
}

// adamHyper is the per-step constants of adamwAVX2, in the order it loads them.
type adamHyper struct {
	gradScale, b1, omb1, b2, omb2, bc1, bc2, eps, lr, wd float32
}

//go:noescape
func adamwAVX2(p, grad, m, v *float32, n int, h *adamHyper)

// adamwVec runs the AdamW step of k on every element of the slices when
// the AVX2 loop can run (it returns len(p)), else on none (0). The last
// len(p)%8 elements run through the same loop on a padded copy: a scalar
// tail would round differently (no fused multiply-adds), and which
// elements fall in a tail depends on how a tensor is cut (ZeRO-1's ranges,
// the parallel chunks), which must not change the update.
func adamwVec(k *adamK, p, g, m, v []float32) int {
	if !useVecAsm || len(p) == 0 {
		return 0
	}
	_, _, _ = g[len(p)-1], m[len(p)-1], v[len(p)-1]
	h := adamHyper{k.gradScale, k.b1, 1 - k.b1, k.b2, 1 - k.b2, k.bc1, k.bc2, k.eps, k.lr, k.wd}
	n := vecLen(len(p))
	if n > 0 {
		adamwAVX2(&p[0], &g[0], &m[0], &v[0], n, &h)
	}
	if r := len(p) - n; r > 0 {
		var tp, tg, tm, tv [8]float32
		copy(tp[:], p[n:])
		copy(tg[:], g[n:])
		copy(tm[:], m[n:])
		copy(tv[:], v[n:])
		adamwAVX2(&tp[0], &tg[0], &tm[0], &tv[0], 8, &h)
		copy(p[n:], tp[:r])
		copy(m[n:], tm[:r])
		copy(v[n:], tv[:r])
	}
	return len(p)
}
