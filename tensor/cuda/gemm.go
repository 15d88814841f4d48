package cuda

import (
	"fmt"
	"unsafe"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// cuBLAS constants (cublas_api.h, library_types.h).
const (
	cublasOpN = 0
	cublasOpT = 1

	cudaR32F  = 0  // CUDA_R_32F
	cudaR16BF = 14 // CUDA_R_16BF

	cublasCompute32F         = 68 // CUBLAS_COMPUTE_32F
	cublasCompute32FFastTF32 = 77 // CUBLAS_COMPUTE_32F_FAST_TF32

	cublasGemmDefault = 0xffffffff // CUBLAS_GEMM_DEFAULT: -1 as a 32-bit int
)

// Row-major GEMM on column-major cuBLAS: a row-major (r,c) matrix with
// leading dimension ld is the column-major (c,r) matrix with the same ld,
// its transpose. So C = op(A) op(B) (row-major, C is (m,n)) is computed as
// C^T = op(B)^T op(A)^T in column-major terms: cuBLAS gets B first with
// the same transpose flag, then A, and the dimensions (n, m, k).

func op(trans bool) uintptr {
	if trans {
		return cublasOpT
	}
	return cublasOpN
}

// Gemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices (see
// tensor.Device), through cublasGemmEx at the device's matmul precision. A
// bfloat16 C (at bf16 precision only) gets the float32 sums rounded once.
func (d *Device) Gemm(transA, transB bool, m, n, k int, alpha float32, a *tensor.Tensor, aOff, lda int, b *tensor.Tensor, bOff, ldb int, beta float32, c *tensor.Tensor, cOff, ldc int) {
	d.ownAny("Gemm", a, b, c)
	check.Gemm(transA, transB, m, n, k, a, aOff, lda, b, bOff, ldb, c, cOff, ldc)
	d.gemm(transA, transB, m, n, k, alpha, a, aOff, lda, 0, b, bOff, ldb, 0, beta, c, cOff, ldc, 0, 1)
}

// GemmStridedBatched computes batch Gemms strideX elements apart through
// cublasGemmStridedBatchedEx (cublasGemmEx for one).
func (d *Device) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a *tensor.Tensor, aOff, lda, strideA int, b *tensor.Tensor, bOff, ldb, strideB int, beta float32, c *tensor.Tensor, cOff, ldc, strideC, batch int) {
	d.ownAny("GemmStridedBatched", a, b, c)
	check.GemmStridedBatched(transA, transB, m, n, k, a, aOff, lda, strideA, b, bOff, ldb, strideB, c, cOff, ldc, strideC, batch)
	d.gemm(transA, transB, m, n, k, alpha, a, aOff, lda, strideA, b, bOff, ldb, strideB, beta, c, cOff, ldc, strideC, batch)
}

// gemm enqueues the product; the caller has checked the arguments.
func (d *Device) gemm(transA, transB bool, m, n, k int, alpha float32, a *tensor.Tensor, aOff, lda, strideA int, b *tensor.Tensor, bOff, ldb, strideB int, beta float32, c *tensor.Tensor, cOff, ldc, strideC, batch int) {
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	pa, pb, pc := a.Ptr()+uintptr(aOff*a.DType().Size()), b.Ptr()+uintptr(bOff*b.DType().Size()), c.Ptr()+uintptr(cOff*c.DType().Size())
	typ, compute, ctyp := uintptr(cudaR32F), uintptr(cublasCompute32F), uintptr(cudaR32F)
	if d.precision != tensor.BF16 && (a.DType() == tensor.BFloat16 || b.DType() == tensor.BFloat16 || c.DType() == tensor.BFloat16) {
		d.fail(fmt.Errorf("a GEMM with a bfloat16 operand at %v precision: bfloat16 operands need bf16", d.precision))
		return
	}
	if c.DType() == tensor.BFloat16 {
		// cuBLAS takes a bfloat16 C only with bfloat16 A and B (k = 0
		// reads neither).
		typ, ctyp = cudaR16BF, cudaR16BF
	}
	switch d.precision {
	case tensor.TF32:
		compute = cublasCompute32FFastTF32
	case tensor.BF16:
		if k > 0 {
			// A bfloat16 operand is read in place; a float32 one is
			// rounded into scratch first.
			var ok bool
			if a.DType() == tensor.Float32 {
				if pa, lda, strideA, ok = d.operandBF16(&d.bfA, pa, transA, m, k, lda, strideA, batch); !ok {
					return
				}
			}
			if b.DType() == tensor.Float32 {
				if pb, ldb, strideB, ok = d.operandBF16(&d.bfB, pb, transB, k, n, ldb, strideB, batch); !ok {
					return
				}
			}
			typ = cudaR16BF
		}
	}
	d.alpha, d.beta = alpha, beta
	al, be := uintptr(unsafe.Pointer(&d.alpha)), uintptr(unsafe.Pointer(&d.beta))
	var r int32
	if batch == 1 {
		r = call(d.l.blas.gemmEx, d.blas, op(transB), op(transA), uintptr(n), uintptr(m), uintptr(k),
			al, pb, typ, uintptr(ldb), pa, typ, uintptr(lda),
			be, pc, ctyp, uintptr(ldc), compute, cublasGemmDefault)
		d.fail(d.l.blasErr("cublasGemmEx", r))
		return
	}
	r = call(d.l.blas.gemmStridedBatchedEx, d.blas, op(transB), op(transA), uintptr(n), uintptr(m), uintptr(k),
		al, pb, typ, uintptr(ldb), uintptr(strideB), pa, typ, uintptr(lda), uintptr(strideA),
		be, pc, ctyp, uintptr(ldc), uintptr(strideC), uintptr(batch), compute, cublasGemmDefault)
	d.fail(d.l.blasErr("cublasGemmStridedBatchedEx", r))
}

// operandBF16 converts a GEMM operand, batch op(X) of (rows, cols), X
// stored row-major with leading dimension ld (X^T when trans) and stride
// apart, into bfloat16 in s, packed, and returns
// its address, leading dimension and stride there (false after recording
// a failure for Sync). Packing converts only the matrices' elements: a
// batch of heads of a (B, T, 3C) tensor would otherwise convert the whole
// span they lie in, once per call of a head loop.
func (d *Device) operandBF16(s *scratch, src uintptr, trans bool, rows, cols, ld, stride, batch int) (uintptr, int, int, bool) {
	if trans {
		rows, cols = cols, rows
	}
	if stride == 0 { // one matrix shared by the batch
		batch = 1
	}
	p, ok := d.toBF16(s, src, rows, cols, ld, stride, batch)
	if stride != 0 {
		stride = rows * cols
	}
	return p, cols, stride, ok
}

// maxGridY is the most blocks a launch's grid has in y (CUDA's limit; a
// test lowers it to walk the kernels' grid-stride loops in y).
var maxGridY = 65535

// toBF16 rounds batch (rows, cols) float32 matrices at src, ld apart in
// rows and stride apart, to bfloat16 in s, packed (cols apart in rows,
// rows*cols apart), and returns their address (false after recording a
// failure for Sync).
func (d *Device) toBF16(s *scratch, src uintptr, rows, cols, ld, stride, batch int) (uintptr, bool) {
	dst, err := s.get(d, 2*int64(rows)*int64(cols)*int64(batch))
	if err != nil {
		d.fail(err)
		return 0, false
	}
	tx := min(elemThreads, (cols+31)/32*32)
	ty := elemThreads / tx
	gy := min(batch, maxGridY)
	gx := max(1, min((rows+ty-1)/ty, d.sms*32/gy))
	d.launch("f32_to_bf16", dim3{uint32(gx), uint32(gy), 1}, dim3{uint32(tx), uint32(ty), 1},
		ptr(dst), ptr(src), i64(rows), i64(cols), i64(ld), i64(stride), i64(batch))
	return dst, true
}
