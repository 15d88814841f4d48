package tensor

import (
	"fmt"
	"strings"
)

// Precision is how a device's matrix products compute: a CUDA device
// chooses among them (cuBLAS compute types), the CPU computes fp32
// whatever it is asked.
type Precision int

const (
	// FP32 multiplies float32 operands in float32 (CUBLAS_COMPUTE_32F): the
	// CPU device's results within rounding.
	FP32 Precision = iota
	// TF32 lets cuBLAS round the float32 operands to TF32 on tensor cores
	// (CUBLAS_COMPUTE_32F_FAST_TF32), float32 accumulation.
	TF32
	// BF16 converts both operands to bfloat16 (round to nearest even) and
	// multiplies them on tensor cores with float32 accumulation and a
	// float32 result; tensors stay float32.
	BF16
)

// String is the name ParsePrecision reads back: fp32, tf32 or bf16.
func (p Precision) String() string {
	switch p {
	case FP32:
		return "fp32"
	case TF32:
		return "tf32"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("Precision(%d)", int(p))
}

// ParsePrecision reads "fp32", "tf32" or "bf16".
func ParsePrecision(s string) (Precision, error) {
	for _, p := range []Precision{FP32, TF32, BF16} {
		if strings.EqualFold(s, p.String()) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("matmul precision %q: use fp32, tf32 or bf16", s)
}
