package tensor

import (
	"fmt"
	"runtime"
	"sync/atomic"
)

// Shape conventions for the GEMM routines.
//
// All matrices are row-major float32 slices with an explicit leading
// dimension (the distance, in elements, between the starts of two rows), as in
// CBLAS with CblasRowMajor:
//
//	op(A) is (m,k): A is stored (m,k) with lda >= k, or (k,m) with lda >= m when transA
//	op(B) is (k,n): B is stored (k,n) with ldb >= n, or (n,k) with ldb >= k when transB
//	C     is (m,n), stored with ldc >= n
//
// A slice must hold at least (rows-1)*ld + cols elements of the matrix it
// stores. C must not overlap A or B.

// gemmThreads is the number of goroutines a GEMM call may use; 0 means
// runtime.GOMAXPROCS(0) at call time.
var gemmThreads atomic.Int32

// SetGemmThreads sets how many goroutines one GEMM call may use. n <= 0
// restores the default, runtime.GOMAXPROCS(0) at call time.
func SetGemmThreads(n int) {
	if n < 0 {
		n = 0
	}
	gemmThreads.Store(int32(n))
}

// GemmThreads reports how many goroutines one GEMM call may use.
func GemmThreads() int {
	if n := int(gemmThreads.Load()); n > 0 {
		return n
	}
	return runtime.GOMAXPROCS(0)
}

// Sgemm computes C = alpha*op(A)*op(B) + beta*C in float32, where op(X) is X
// or its transpose. Matrices are row-major; see the shape conventions above.
// When beta is 0, C is overwritten and its old contents (NaNs included) are
// ignored. Sgemm panics with a one-line message on inconsistent dimensions or
// short slices, as a slice index out of range would.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkGemm("Sgemm", transA, transB, m, n, k, a, lda, 0, b, ldb, 0, c, ldc, 0, 1)
	gemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmStridedBatched computes batch independent products
//
//	C[i] = alpha*op(A[i])*op(B[i]) + beta*C[i],  i in [0, batch)
//
// where matrix i of X starts at element i*strideX of x and has the layout
// Sgemm describes. A stride of 0 reuses one matrix for every product (for
// example a weight shared across the batch). The C matrices must not
// overlap: either they are separate blocks (strideC >= (m-1)*ldc+n), or they
// sit side by side within the rows of C (n <= strideC and
// (batch-1)*strideC+n <= ldc), as per-head attention outputs written into a
// (B,T,C) activation (strideC = hs, ldc = C).
func SgemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	checkGemm("SgemmStridedBatched", transA, transB, m, n, k, a, lda, strideA, b, ldb, strideB, c, ldc, strideC, batch)
	gemmBatched(transA, transB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
}

// checkGemm panics with a one-line message that names the bad argument.
func checkGemm(fn string, transA, transB bool, m, n, k int, a []float32, lda, strideA int, b []float32, ldb, strideB int, c []float32, ldc, strideC, batch int) {
	bad := func(format string, args ...any) {
		panic(fmt.Sprintf("tensor.%s: %s", fn, fmt.Sprintf(format, args...)))
	}
	if m < 0 || n < 0 || k < 0 || batch < 0 {
		bad("negative dimension m=%d n=%d k=%d batch=%d", m, n, k, batch)
	}
	if strideA < 0 || strideB < 0 || strideC < 0 {
		bad("negative stride strideA=%d strideB=%d strideC=%d", strideA, strideB, strideC)
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if lda < max(1, ac) {
		bad("lda=%d is less than the %d columns of A (transA=%v)", lda, ac, transA)
	}
	if ldb < max(1, bc) {
		bad("ldb=%d is less than the %d columns of B (transB=%v)", ldb, bc, transB)
	}
	if ldc < max(1, n) {
		bad("ldc=%d is less than the %d columns of C", ldc, n)
	}
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	if batch > 1 && strideC > 0 && strideC < (m-1)*ldc+n && !cInterleaves(n, ldc, strideC, batch) {
		bad("strideC=%d makes the (%d,%d) C matrices overlap (ldc=%d): use strideC >= %d for separate blocks, or n <= strideC and (batch-1)*strideC+n <= ldc for side-by-side columns", strideC, m, n, ldc, (m-1)*ldc+n)
	}
	if batch > 1 && strideC == 0 {
		bad("strideC=0 with batch=%d would write every product to the same C", batch)
	}
	need := func(rows, cols, ld, stride int) int {
		if rows == 0 || cols == 0 {
			return 0
		}
		return (batch-1)*stride + (rows-1)*ld + cols
	}
	if k > 0 {
		if n := need(ar, ac, lda, strideA); len(a) < n {
			bad("len(a)=%d, need %d for A (%dx%d, lda=%d, strideA=%d, batch=%d)", len(a), n, ar, ac, lda, strideA, batch)
		}
		if n := need(br, bc, ldb, strideB); len(b) < n {
			bad("len(b)=%d, need %d for B (%dx%d, ldb=%d, strideB=%d, batch=%d)", len(b), n, br, bc, ldb, strideB, batch)
		}
	}
	if n := need(m, n, ldc, strideC); len(c) < n {
		bad("len(c)=%d, need %d for C (%dx%d, ldc=%d, strideC=%d, batch=%d)", len(c), n, m, n, ldc, strideC, batch)
	}
}

// cInterleaves reports whether batch (m,n) C matrices strideC apart sit
// side by side within rows of width ldc without touching: matrix i holds
// columns [i*strideC, i*strideC+n) of every row, as the heads of a (B,T,C)
// attention output do (strideC = hs, ldc = C).
func cInterleaves(n, ldc, strideC, batch int) bool {
	return strideC >= n && (batch-1)*strideC+n <= ldc
}

// scaleC sets C = beta*C over the (m,n) matrix, writing zeros when beta is 0
// so that NaNs already in C do not survive.
func scaleC(m, n int, beta float32, c []float32, ldc int) {
	if beta == 1 {
		return
	}
	for i := 0; i < m; i++ {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}
