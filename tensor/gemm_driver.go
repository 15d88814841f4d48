package tensor

// gemm is Sgemm after argument checks. This first version is a plain loop
// nest; the packed, threaded driver replaces it.
func gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	scaleC(m, n, beta, c, ldc)
	if k == 0 || alpha == 0 {
		return
	}
	for i := 0; i < m; i++ {
		crow := c[i*ldc : i*ldc+n]
		for p := 0; p < k; p++ {
			var av float32
			if transA {
				av = a[p*lda+i]
			} else {
				av = a[i*lda+p]
			}
			av *= alpha
			if transB {
				for j := range crow {
					crow[j] += av * b[j*ldb+p]
				}
			} else {
				brow := b[p*ldb : p*ldb+n]
				for j := range crow {
					crow[j] += av * brow[j]
				}
			}
		}
	}
}

// gemmBatched runs gemm over a strided batch.
func gemmBatched(transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		for i := 0; i < batch; i++ {
			scaleC(m, n, beta, c[i*strideC:], ldc)
		}
		return
	}
	for i := 0; i < batch; i++ {
		gemm(transA, transB, m, n, k, alpha, a[i*strideA:], lda, b[i*strideB:], ldb, beta, c[i*strideC:], ldc)
	}
}
