package tensor

import (
	"os"
	"sync/atomic"
)

// gemmKernel is a micro-kernel and the cache blocking tuned for it.
type gemmKernel struct {
	name string
	// mr and nr are the rows and columns of the C tile fn computes.
	mr, nr int
	// kc, mc, nc block k, m and n: a (kc,nc) packed block of B is reused
	// across every mr-row panel of A, an (mr,kc) panel of A stays in L1
	// while fn streams the B block past it.
	kc, mc, nc int
	// asmPack says packing may use the assembly transpose-packer.
	asmPack bool
	// fn computes C = alpha*Ap*Bp (+ beta*C when loadC) for one (mr,nr)
	// tile, from k steps of a packed A panel (mr values per step) and a
	// packed B panel (nr values per step).
	fn func(k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool)
	// short, when set, is fn for a tile of only rows < mr rows that exist
	// (the last A panel of a ragged m): it computes and stores just those,
	// and reports false when it cannot (then fn goes through a scratch tile).
	short func(rows, k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool) bool
}

var portableKernel = &gemmKernel{name: "go-4x4", mr: 4, nr: 4, kc: 256, mc: 256, nc: 1024, fn: sgemmKernelGo}

// gemmKernels lists the kernels this machine can run, fastest first; the
// portable one is always last.
var gemmKernels = append(asmKernels(), portableKernel)

// activeKernel is the kernel Sgemm uses: the fastest available, or the
// portable one when HPCRUN_NOASM=1 (or the noasm build tag) says so.
var activeKernel atomic.Pointer[gemmKernel]

func init() {
	k := gemmKernels[0]
	if os.Getenv("HPCRUN_NOASM") == "1" {
		k = portableKernel
	}
	activeKernel.Store(k)
}

// GemmKernel names the micro-kernel Sgemm uses on this machine, for
// example "avx512-12x32", "avx2-6x16" or "go-4x4" (the portable path, forced
// by HPCRUN_NOASM=1 or the noasm build tag).
func GemmKernel() string { return activeKernel.Load().name }

// sgemmKernelGo is the portable 4x4 micro-kernel.
func sgemmKernelGo(k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool) {
	a, b = a[:4*k], b[:4*k]
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	for p := 0; p < 4*k; p += 4 {
		a0, a1, a2, a3 := a[p], a[p+1], a[p+2], a[p+3]
		b0, b1, b2, b3 := b[p], b[p+1], b[p+2], b[p+3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	rows := [4][4]float32{
		{c00, c01, c02, c03},
		{c10, c11, c12, c13},
		{c20, c21, c22, c23},
		{c30, c31, c32, c33},
	}
	for i := range rows {
		crow := c[i*ldc : i*ldc+4 : i*ldc+4]
		for j, v := range rows[i] {
			if loadC {
				crow[j] = alpha*v + beta*crow[j]
			} else {
				crow[j] = alpha * v
			}
		}
	}
}
