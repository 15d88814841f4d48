//go:build noasm || !amd64

package tensor

import "math"

// Without the AVX2 loops (other architectures, or the noasm tag) the row
// kernels run their portable Go loops over the whole range.

var useVecAsm = false

func geluFwdVec(out, inp []float32) int                                   { return 0 }
func geluBwdVec(dinp, inp, dout []float32) int                            { return 0 }
func expShiftVec(dst, src []float32, scale, shift float32) (int, float64) { return 0, 0 }
func expSumVec(src []float32, shift float32) (int, float64)               { return 0, 0 }
func expAxpyVec(dst, src []float32, shift, alpha float32) int             { return 0 }
func expScaleVec(x []float32, shift, alpha float32) int                   { return 0 }
func maxVec(src []float32) (int, float32)                                 { return 0, float32(math.Inf(-1)) }

func adamwVec(k *adamK, p, g, m, v []float32) int { return 0 }

func widenVec(dst []float32, src []uint16) int { return 0 }
func roundVec(dst []uint16, src []float32) int { return 0 }
