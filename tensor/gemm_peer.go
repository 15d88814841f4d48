package tensor

// GemmPeer is a reference BLAS that benchmarks measure Sgemm against in the
// same run. It takes the arguments of Sgemm with the same conventions.
type GemmPeer struct {
	// Name says which library and, where it reports one, which kernel set.
	Name string
	// Core is the kernel set the peer picked for this CPU, if it says.
	Core string
	// Sgemm computes C = alpha*op(A)*op(B) + beta*C like Sgemm.
	Sgemm func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)
	// SetThreads sets how many threads the peer uses.
	SetThreads func(n int)
}
