//go:build openblas && cgo

package tensor

import (
	"github.com/hpcrun/hpcrun/tensor/internal/check"
	"github.com/hpcrun/hpcrun/tensor/internal/openblas"
)

// OpenBLASPeer returns OpenBLAS cblas_sgemm as a GemmPeer. It exists because
// this binary was built with -tags openblas and cgo; ok is false otherwise.
func OpenBLASPeer() (peer *GemmPeer, ok bool) {
	return &GemmPeer{
		Name: openblas.Name(),
		Core: openblas.CoreName(),
		Sgemm: func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
			check.GemmLayout("OpenBLASPeer.Sgemm", transA, transB, m, n, k, len(a), lda, 0, len(b), ldb, 0, len(c), ldc, 0, 1)
			openblas.Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		},
		SetThreads: openblas.SetThreads,
	}, true
}
