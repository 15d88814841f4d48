//go:build noasm || !amd64

package tensor

// asmKernels is empty: this build has no assembly kernels.
func asmKernels() []*gemmKernel { return nil }

// packTransFast always leaves packing to Go in this build.
func packTransFast[E packElem](dst []float32, src []E, rows, srcStride, kc, dstStep int) (ok bool) {
	return false
}

// packCopyFast always leaves packing to Go in this build.
func packCopyFast[E packElem](dst []float32, src []E, kc, srcStride, panels, width, cols int) (ok bool) {
	return false
}
