//go:build noasm || !amd64

package tensor

// asmKernels is empty: this build has no assembly kernels.
func asmKernels() []*gemmKernel { return nil }
