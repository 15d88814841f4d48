package tensor

import (
	"fmt"
	"math"
)

// DType is how a buffer stores its elements. Kernels compute in float32
// whatever the storage: a bfloat16 element is widened on load and
// rounded to nearest even on store (mixed precision as Megatron and
// llm.c run it).
type DType int

const (
	// Float32 is IEEE 754 single precision, 4 bytes: the zero value.
	Float32 DType = iota
	// BFloat16 is bfloat16, 2 bytes: a float32's sign, exponent and top 7
	// bits of mantissa.
	BFloat16
)

// Size is the bytes of one element.
func (t DType) Size() int {
	if t == BFloat16 {
		return 2
	}
	return 4
}

// String is "float32" or "bfloat16".
func (t DType) String() string {
	switch t {
	case Float32:
		return "float32"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("DType(%d)", int(t))
}

// BF16FromFloat32 rounds v to bfloat16, to nearest even; a NaN stays a
// (quiet) NaN and values past bfloat16's range become infinities.
func BF16FromFloat32(v float32) uint16 {
	b := math.Float32bits(v)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32FromBF16 widens a bfloat16 value, exactly.
func Float32FromBF16(u uint16) float32 { return math.Float32frombits(uint32(u) << 16) }

// RoundBF16 rounds every element of src to bfloat16 into dst (len(dst) >=
// len(src)).
func RoundBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	done := roundVec(dst, src)
	for i, v := range src[done:] {
		dst[done+i] = BF16FromFloat32(v)
	}
}

// WidenBF16 widens every element of src into dst (len(dst) >= len(src)).
func WidenBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	done := widenVec(dst, src)
	for i, u := range src[done:] {
		dst[done+i] = Float32FromBF16(u)
	}
}
