//go:build !noasm

package tensor

// The assembly micro-kernels live in gemm_kernel_amd64.s.

//go:noescape
func sgemmKernel12x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC int)

//go:noescape
func sgemmKernel8x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC, rows int)

//go:noescape
func sgemmKernel4x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC, rows int)

//go:noescape
func sgemmKernel6x16AVX2(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC int)

//go:noescape
func packTrans16AVX512(dst, src *float32, rows, srcStride, kc, dstStep int)

//go:noescape
func packTrans16HalfAVX512(dst *float32, src *uint16, rows, srcStride, kc, dstStep int)

//go:noescape
func packCopyAVX512(dst, src *float32, kc, srcStride, panels, width int, ldMask, stMask uint32)

//go:noescape
func packCopyHalfAVX512(dst *float32, src *uint16, kc, srcStride, panels, width int, ldMask, stMask uint32)

// packTransFast does dst[p*dstStep+r] = src[r*srcStride+p] for r < rows,
// p < kc (a bfloat16 src widened), transposing 16x16 blocks in AVX-512
// registers when the CPU has them; ok is false when it did nothing and the
// caller must pack in Go.
func packTransFast[E packElem](dst []float32, src []E, rows, srcStride, kc, dstStep int) (ok bool) {
	if !hasAVX512 || rows == 0 || kc == 0 {
		return rows == 0 || kc == 0
	}
	_ = dst[(kc-1)*dstStep+rows-1]
	_ = src[(rows-1)*srcStride+kc-1]
	half, _ := any(src).([]uint16)
	// Panels wider than 16 rows go through 16-row blocks; alternating them
	// every few k steps fills each destination line whole while it is still
	// in L1.
	const chunk = 64
	for p := 0; p < kc; p += chunk {
		for r := 0; r < rows; r += 16 {
			d, s, n, k := &dst[p*dstStep+r], r*srcStride+p, min(16, rows-r), min(chunk, kc-p)
			if half != nil {
				packTrans16HalfAVX512(d, &half[s], n, srcStride, k, dstStep)
			} else {
				packTrans16AVX512(d, &any(src).([]float32)[s], n, srcStride, k, dstStep)
			}
		}
	}
	return true
}

// packCopyFast does, for p < kc, j < panels and l < width,
//
//	dst[j*kc*width+p*width+l] = src[p*srcStride+j*width+l] when l < cols, else 0
//
// (a bfloat16 src widened) with AVX-512 masked moves when the CPU has them
// (width <= 32); ok is false when it did nothing and the caller must pack
// in Go.
func packCopyFast[E packElem](dst []float32, src []E, kc, srcStride, panels, width, cols int) (ok bool) {
	if !hasAVX512 || width > 32 || cols > width || kc == 0 || panels == 0 {
		return hasAVX512 && (kc == 0 || panels == 0)
	}
	_ = dst[panels*kc*width-1]
	_ = src[(kc-1)*srcStride+(panels-1)*width+cols-1]
	ld, st := uint32(1)<<cols-1, uint32(1)<<width-1
	if half, ok := any(src).([]uint16); ok {
		packCopyHalfAVX512(&dst[0], &half[0], kc, srcStride, panels, width, ld, st)
	} else {
		packCopyAVX512(&dst[0], &any(src).([]float32)[0], kc, srcStride, panels, width, ld, st)
	}
	return true
}

var _, hasAVX512 = cpuFeatures()

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)

func xgetbv() (eax, edx uint32)

// cpuFeatures reports whether the CPU and the OS (which must save the wider
// registers on context switches) support AVX2 with FMA, and AVX-512F.
func cpuFeatures() (avx2FMA, avx512 bool) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	fma := ecx1&(1<<12) != 0
	osxsave := ecx1&(1<<27) != 0
	avx := ecx1&(1<<28) != 0
	if !osxsave || !avx {
		return false, false
	}
	xcr0, _ := xgetbv()
	const ymmState = 1<<1 | 1<<2        // SSE and AVX state
	const zmmState = 1<<5 | 1<<6 | 1<<7 // opmask, ZMM_Hi256, Hi16_ZMM
	if xcr0&ymmState != ymmState {
		return false, false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	avx2FMA = fma && ebx7&(1<<5) != 0
	avx512 = avx2FMA && ebx7&(1<<16) != 0 && xcr0&zmmState == zmmState
	return avx2FMA, avx512
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// asmKernels lists the assembly kernels this CPU can run, fastest first.
func asmKernels() []*gemmKernel {
	avx2FMA, avx512 := cpuFeatures()
	var ks []*gemmKernel
	if avx512 {
		ks = append(ks, &gemmKernel{
			name: "avx512-12x32", mr: 12, nr: 32, kc: 384, mc: 1536, nc: 1024, asmPack: true,
			fn: func(k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool) {
				_, _, _ = a[k*12-1], b[k*32-1], c[11*ldc+31]
				sgemmKernel12x32AVX512(k, &a[0], &b[0], &c[0], ldc, alpha, beta, b2i(loadC))
			},
			short: func(rows, k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool) bool {
				if rows > 8 {
					return false
				}
				_, _, _ = a[k*12-1], b[k*32-1], c[(rows-1)*ldc+31]
				if rows > 4 {
					sgemmKernel8x32AVX512(k, &a[0], &b[0], &c[0], ldc, alpha, beta, b2i(loadC), rows)
				} else {
					sgemmKernel4x32AVX512(k, &a[0], &b[0], &c[0], ldc, alpha, beta, b2i(loadC), rows)
				}
				return true
			},
		})
	}
	if avx2FMA {
		ks = append(ks, &gemmKernel{
			name: "avx2-6x16", mr: 6, nr: 16, kc: 256, mc: 1536, nc: 768,
			fn: func(k int, a, b, c []float32, ldc int, alpha, beta float32, loadC bool) {
				_, _, _ = a[k*6-1], b[k*16-1], c[5*ldc+15]
				sgemmKernel6x16AVX2(k, &a[0], &b[0], &c[0], ldc, alpha, beta, b2i(loadC))
			},
		})
	}
	return ks
}
