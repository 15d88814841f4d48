//go:build openblas && cgo

// Package openblas calls OpenBLAS cblas_sgemm through cgo, as the peer that
// tensor's GEMM benchmarks measure against. It builds only with the openblas
// tag (and cgo), and links -lopenblas (Debian: libopenblas-dev).
package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import "unsafe"

// Name reports the OpenBLAS build and the kernel set it chose for this CPU.
func Name() string {
	return C.GoString(C.openblas_get_config()) + ", core " + C.GoString(C.openblas_get_corename())
}

// CoreName reports the kernel set OpenBLAS chose for this CPU, for example
// "Haswell" or "SkylakeX" ("Prescott" is its generic fallback).
func CoreName() string { return C.GoString(C.openblas_get_corename()) }

// SetThreads sets how many threads OpenBLAS uses.
func SetThreads(n int) { C.openblas_set_num_threads(C.int(n)) }

// Sgemm computes C = alpha*op(A)*op(B) + beta*C with row-major matrices,
// like tensor.Sgemm. The caller checks the arguments.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	ta, tb := uint32(C.CblasNoTrans), uint32(C.CblasNoTrans)
	if transA {
		ta = C.CblasTrans
	}
	if transB {
		tb = C.CblasTrans
	}
	var pa, pb *C.float
	if len(a) > 0 {
		pa = (*C.float)(unsafe.Pointer(&a[0]))
	}
	if len(b) > 0 {
		pb = (*C.float)(unsafe.Pointer(&b[0]))
	}
	C.cblas_sgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), pa, C.blasint(lda), pb, C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}
