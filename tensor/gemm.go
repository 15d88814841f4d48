package tensor

import (
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
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

// GemmShape is one matrix product C(M,N) = op(A) op(B) with K inner, Batch
// products of that shape at once (attention's per-head products; 0 counts
// as 1): what the engine records (CPUDevice.ObserveGemm), the plan prices
// and the benchmarks time.
type GemmShape struct {
	M      int  `json:"m"`
	N      int  `json:"n"`
	K      int  `json:"k"`
	Batch  int  `json:"batch,omitempty"`
	TransA bool `json:"ta,omitempty"`
	TransB bool `json:"tb,omitempty"`
}

// Flops is the product's FLOPs, 2 M N K per batch entry.
func (g GemmShape) Flops() float64 {
	return 2 * float64(g.M) * float64(g.N) * float64(g.K) * float64(max(g.Batch, 1))
}

// String is "MxNxK", with ":tA"/":tB" and "*batch" when they apply.
func (g GemmShape) String() string {
	s := fmt.Sprintf("%dx%dx%d", g.M, g.N, g.K)
	if g.TransA || g.TransB {
		s += ":"
		if g.TransA {
			s += "tA"
		}
		if g.TransB {
			s += "tB"
		}
	}
	if g.Batch > 1 {
		s += fmt.Sprintf("*%d", g.Batch)
	}
	return s
}

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
	check.GemmLayout("Sgemm", transA, transB, m, n, k, len(a), lda, 0, len(b), ldb, 0, len(c), ldc, 0, 1)
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
	check.GemmLayout("SgemmStridedBatched", transA, transB, m, n, k, len(a), lda, strideA, len(b), ldb, strideB, len(c), ldc, strideC, batch)
	gemmBatched(transA, transB, m, n, k, alpha, a, lda, strideA, b, ldb, strideB, beta, c, ldc, strideC, batch)
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
