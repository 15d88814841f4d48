//go:build noasm || !amd64

package tensor

// asmKernels is empty: this build has no assembly kernels.
func asmKernels() []*gemmKernel { return nil }

// packTransFast always leaves packing to Go in this build.
func packTransFast(dst, src []float32, rows, srcStride, kc, dstStep int) (ok bool) { return false }

// packCopyFast always leaves packing to Go in this build.
func packCopyFast(dst, src []float32, kc, srcStride, panels, width, cols int) (ok bool) {
	return false
}
