package tensor

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// CPUDevice is the pure-Go Device: tensors in host memory, GEMM through
// Sgemm, the other kernels split over rows across a pool of goroutines. It
// is synchronous (Sync has nothing to wait for) and safe for concurrent use:
// kernel calls on one CPUDevice run one at a time, so give each concurrent
// rank its own device for speed. Kernels do not allocate in steady state:
// their arguments and reduction scratch live in the device and are reused.
type CPUDevice struct {
	mu      sync.Mutex
	threads int // 0: runtime.GOMAXPROCS(0) at call time
	minWork int // 0: minParallelWork; tests lower it to split small inputs
	cur     int64
	peak    int64

	wg      sync.WaitGroup
	scratch []float32  // per-chunk partial sums (LayerNormBackward)
	partial []float64  // per-chunk partial sums (SumSquaresEach)
	wideMu  sync.Mutex // held by a GEMM while it uses wideC
	wideC   []float32  // a BFloat16 C's float32 sums
	k       cpuKernels

	observe func(GemmShape) // see ObserveGemm
	splitK  int             // see SplitGemmK; 0 or 1: whole
}

// ObserveGemm makes the device call f with the shape of every later Gemm and
// GemmStridedBatched (Batch 1 for Gemm); nil stops it. Layers allocate their
// tensors on this device and call it through Tensor.Device, so observing
// here sees every product of a step, which wrapping the Device would not.
func (d *CPUDevice) ObserveGemm(f func(GemmShape)) {
	d.mu.Lock()
	d.observe = f
	d.mu.Unlock()
}

// NewCPU returns a new CPU device with its own memory accounting.
func NewCPU() *CPUDevice { return &CPUDevice{} }

var defaultDevice struct {
	once sync.Once
	d    *CPUDevice
}

// Default returns the process-wide CPU device, made on first use.
func Default() Device {
	defaultDevice.once.Do(func() { defaultDevice.d = NewCPU() })
	return defaultDevice.d
}

// Name is "cpu".
func (d *CPUDevice) Name() string { return "cpu" }

// SetThreads sets how many goroutines one elementwise or row kernel may use;
// n <= 0 restores the default, runtime.GOMAXPROCS(0) at call time. GEMM
// threads are set separately with SetGemmThreads.
func (d *CPUDevice) SetThreads(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.threads = max(n, 0)
}

func (d *CPUDevice) nthreads() int {
	if d.threads > 0 {
		return d.threads
	}
	return runtime.GOMAXPROCS(0)
}

// Alloc returns a zeroed tensor in host memory.
func (d *CPUDevice) Alloc(shape ...int) (*Tensor, error) { return d.AllocAs(Float32, shape...) }

// AllocAs returns a zeroed tensor of dt in host memory: a BFloat16 one
// takes 2 bytes an element.
func (d *CPUDevice) AllocAs(dt DType, shape ...int) (*Tensor, error) {
	n, err := shapeLen(shape)
	if err != nil {
		return nil, fmt.Errorf("cpu alloc: %w", err)
	}
	var buf *Buffer
	switch dt {
	case Float32:
		buf = NewBuffer(d, n, make([]float32, n), 0)
	case BFloat16:
		buf = NewBF16Buffer(d, n, make([]uint16, n), 0)
	default:
		return nil, fmt.Errorf("cpu alloc: %v", dt)
	}
	d.mu.Lock()
	d.cur += buf.Bytes()
	d.peak = max(d.peak, d.cur)
	d.mu.Unlock()
	return NewTensor(buf, 0, shape...), nil
}

// Free releases t's buffer to the garbage collector and the accounting.
func (d *CPUDevice) Free(t *Tensor) {
	if t == nil {
		panic("tensor.Free: nil tensor")
	}
	if t.buf.dev != Device(d) {
		panic(fmt.Sprintf("tensor.Free: tensor %v is not on this cpu device", t))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if t.buf.MarkFreed() {
		d.cur -= t.buf.Bytes()
	}
}

// MemStats reports the bytes held by live tensors and the peak.
func (d *CPUDevice) MemStats() MemStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return MemStats{Current: d.cur, Peak: d.peak}
}

// ResetPeak sets the peak to the current allocation.
func (d *CPUDevice) ResetPeak() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.peak = d.cur
}

// Sync returns nil: CPU kernels finish before they return.
func (d *CPUDevice) Sync() error { return nil }

// own panics unless every t is a live Float32 tensor of this device.
func (d *CPUDevice) own(fn string, ts ...*Tensor) {
	d.ownAny(fn, ts...)
	for _, t := range ts {
		if t.buf.dtype != Float32 {
			panic(fmt.Sprintf("tensor.%s: tensor %v stores %s; the kernel takes float32 tensors", fn, t, t.buf.dtype))
		}
	}
}

// ownAny panics unless every t is a live tensor of this device, of any
// dtype.
func (d *CPUDevice) ownAny(fn string, ts ...*Tensor) {
	for _, t := range ts {
		if t == nil {
			panic(fmt.Sprintf("tensor.%s: nil tensor", fn))
		}
		if t.buf.dev != Device(d) {
			panic(fmt.Sprintf("tensor.%s: tensor %v is not on this cpu device", fn, t))
		}
		if t.buf.freed {
			panic(fmt.Sprintf("tensor.%s: tensor %v was freed", fn, t))
		}
	}
}

// rowKernel is a kernel body over the unit range [lo,hi) (rows or
// elements); chunk numbers the range among the ranges of one call, from 0,
// for per-chunk scratch.
type rowKernel interface {
	run(lo, hi, chunk int)
}

type workChunk struct {
	k             rowKernel
	lo, hi, chunk int
	wg            *sync.WaitGroup
}

// workers is the package's goroutine pool, shared by every CPU device and
// started on first use with GOMAXPROCS goroutines.
var workers struct {
	once sync.Once
	ch   chan workChunk
}

func startWorkers() {
	n := runtime.GOMAXPROCS(0)
	workers.ch = make(chan workChunk, 4*n)
	for i := 0; i < n; i++ {
		go func() {
			for c := range workers.ch {
				c.k.run(c.lo, c.hi, c.chunk)
				c.wg.Done()
			}
		}()
	}
}

// minParallelWork is the work (units*cost) under which a kernel runs on the
// calling goroutine: below it, handing chunks to workers costs more than it saves.
const minParallelWork = 1 << 15

// chunks is how many chunks parallel splits n units of the given cost into.
// Called with d.mu held.
func (d *CPUDevice) chunks(n, cost int) int {
	minWork := d.minWork
	if minWork == 0 {
		minWork = minParallelWork
	}
	if n*cost < minWork {
		return 1
	}
	return max(1, min(d.nthreads(), n))
}

// parallel runs k over [0,n) in nc = d.chunks(n, cost) contiguous chunks,
// the first on the calling goroutine. Called with d.mu held.
func (d *CPUDevice) parallel(n, nc int, k rowKernel) {
	if nc <= 1 {
		k.run(0, n, 0)
		return
	}
	workers.once.Do(startWorkers)
	for c := 1; c < nc; c++ {
		d.wg.Add(1)
		workers.ch <- workChunk{k: k, lo: c * n / nc, hi: (c + 1) * n / nc, chunk: c, wg: &d.wg}
	}
	k.run(0, n/nc, 0)
	d.wg.Wait()
}

// scratch32 returns n float32s of reusable scratch. Called with d.mu held.
func (d *CPUDevice) scratch32(n int) []float32 {
	if cap(d.scratch) < n {
		d.scratch = make([]float32, n)
	}
	return d.scratch[:n]
}

// scratch64 returns n float64s of reusable scratch. Called with d.mu held.
func (d *CPUDevice) scratch64(n int) []float64 {
	if cap(d.partial) < n {
		d.partial = make([]float64, n)
	}
	return d.partial[:n]
}

// CopyFromHost copies src into dst, rounding to a BFloat16 dst.
func (d *CPUDevice) CopyFromHost(dst *Tensor, src []float32) {
	d.ownAny("CopyFromHost", dst)
	check.CopyFromHost(dst, src)
	if dst.DType() == BFloat16 {
		d.convert(src, dst.HostBF16(), true)
		return
	}
	copy(dst.Host(), src)
}

// CopyToHost copies src into dst, widening a BFloat16 src.
func (d *CPUDevice) CopyToHost(dst []float32, src *Tensor) {
	d.ownAny("CopyToHost", src)
	check.CopyToHost(dst, src)
	if src.DType() == BFloat16 {
		d.convert(dst, src.HostBF16(), false)
		return
	}
	copy(dst, src.Host())
}

// Copy copies src into dst, converting between dtypes.
func (d *CPUDevice) Copy(dst, src *Tensor) {
	d.ownAny("Copy", dst, src)
	check.Copy(dst, src)
	switch {
	case dst.DType() == Float32 && src.DType() == Float32:
		copy(dst.Host(), src.Host())
	case dst.DType() == BFloat16 && src.DType() == BFloat16:
		copy(dst.HostBF16(), src.HostBF16())
	case dst.DType() == BFloat16:
		d.convert(src.Host(), dst.HostBF16(), true)
	default:
		d.convert(dst.Host(), src.HostBF16(), false)
	}
}

// Gemm computes C = alpha*op(A)*op(B) + beta*C with Sgemm on the tensors'
// host memory; bfloat16 A and B are widened as they are packed, a bfloat16
// C gets the float32 sums rounded once (gemmToHalf).
func (d *CPUDevice) Gemm(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda int, b *Tensor, bOff, ldb int, beta float32, c *Tensor, cOff, ldc int) {
	d.ownAny("Gemm", a, b, c)
	check.Gemm(transA, transB, m, n, k, a, aOff, lda, b, bOff, ldb, c, cOff, ldc)
	if d.observe != nil {
		d.observe(GemmShape{M: m, N: n, K: k, Batch: 1, TransA: transA, TransB: transB})
	}
	if c.DType() == BFloat16 {
		d.gemmToHalf(transA, transB, m, n, k, alpha, a, aOff, lda, b, bOff, ldb, beta, c, cOff, ldc)
		return
	}
	d.gemm(transA, transB, m, n, k, alpha, a, aOff, lda, b, bOff, ldb, beta, c.Host()[cOff:], ldc)
}

// gemmToHalf is Gemm into a bfloat16 C: the product summed in float32
// scratch (C widened into it first when beta is not 0) and rounded once
// into C, as cuBLAS stores a bfloat16 C; in row blocks (toHalfC). A
// product wider than tall past the scratch (an LM head's logits) runs in
// blocks of whole columns first, so that op(B), the larger operand, is
// packed once in all rather than once a row block.
func (d *CPUDevice) gemmToHalf(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda int, b *Tensor, bOff, ldb int, beta float32, c *Tensor, cOff, ldc int) {
	cb := n
	if m*n > wideLimit && m < n {
		cb = max(1, wideLimit/m)
	}
	for j0 := 0; j0 < n; j0 += cb {
		cols := min(cb, n-j0)
		d.toHalfC(c, cOff+j0, m, cols, ldc, 0, 1, beta, func(_, _, i0, rows int, s []float32) {
			d.gemm(transA, transB, rows, cols, k, alpha, a, aOff+rowOffset(transA, i0, lda), lda, b, bOff+colOffset(transB, j0, ldb), ldb, beta, s, cols)
		})
	}
}

// colOffset is where column j0 of op(B) starts in B (ld apart): a column
// of B, or of B^T a row.
func colOffset(trans bool, j0, ld int) int {
	if trans {
		return j0 * ld
	}
	return j0
}

// rowOffset is where row i0 of op(A) starts in A (ld apart): a row of A,
// or of A^T a column.
func rowOffset(trans bool, i0, ld int) int {
	if trans {
		return i0
	}
	return i0 * ld
}

// wideLimit is the most float32 sums a product into a bfloat16 C keeps in
// scratch at once: a larger one runs in pieces of whole rows (row blocks
// of one product, or groups of a batch's products), each summed and
// rounded on its own: the same sums, in a bounded scratch. (A test
// lowers it to cut small products.)
var wideLimit = 1 << 22

// toHalfC runs a product into the bfloat16 C at c[cOff:] (batch matrices
// strideC apart, m rows of n ldc apart) a piece at a time: run computes
// matrices q0..q0+qn, rows i0..i0+rows of each, into s, packed (rows of
// n, matrices rows*n apart), which holds C's values widened where beta
// is not 0, and is rounded into C after.
func (d *CPUDevice) toHalfC(c *Tensor, cOff, m, n, ldc, strideC, batch int, beta float32, run func(q0, qn, i0, rows int, s []float32)) {
	d.wideMu.Lock()
	defer d.wideMu.Unlock()
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	qb, rb := max(1, min(batch, wideLimit/(m*n))), m
	if m*n > wideLimit {
		qb, rb = 1, max(1, wideLimit/n)
	}
	if cap(d.wideC) < qb*rb*n {
		d.wideC = make([]float32, qb*rb*n)
	}
	hc := c.HostBF16()[cOff:]
	for q0 := 0; q0 < batch; q0 += qb {
		qn := min(qb, batch-q0)
		for i0 := 0; i0 < m; i0 += rb {
			rows := min(rb, m-i0)
			s := d.wideC[:qn*rows*n]
			// Over the device's threads: a pass on one would leave the
			// others idle for as long as a small product takes.
			convert := func(toBF16 bool) {
				d.mu.Lock()
				defer d.mu.Unlock()
				k := &d.k.halves
				*k = halfRowsK{s: s, hc: hc, n: n, rows: rows, q0: q0, i0: i0, ldc: ldc, strideC: strideC, toBF16: toBF16}
				d.parallel(qn*rows, d.chunks(qn*rows, n), k)
				*k = halfRowsK{}
			}
			if beta != 0 {
				convert(false)
			}
			run(q0, qn, i0, rows, s)
			convert(true)
		}
	}
}

// gemm is Gemm into the float32 hc (C from its first element).
func (d *CPUDevice) gemm(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda int, b *Tensor, bOff, ldb int, beta float32, hc []float32, ldc int) {
	if a.DType() == Float32 && b.DType() == Float32 {
		ha, hb := a.Host(), b.Host()
		d.eachKPart(transA, transB, k, lda, ldb, beta, func(aShift, bShift, kk int, beta float32) {
			gemm(transA, transB, m, n, kk, alpha, ha[aOff+aShift:], lda, hb[bOff+bShift:], ldb, beta, hc, ldc)
		})
		return
	}
	// An activation or a weight's bfloat16 copy: widened as the product
	// packs it.
	fa, ha := hostAny(a, aOff)
	fb, hb := hostAny(b, bOff)
	d.eachKPart(transA, transB, k, lda, ldb, beta, func(aShift, bShift, kk int, beta float32) {
		gemmHalf(transA, transB, m, n, kk, alpha, from(fa, aShift), from(ha, aShift), lda, from(fb, bShift), from(hb, bShift), ldb, beta, hc, ldc)
	})
}

// hostAny is t's host storage from element off: the float32 one or the
// bfloat16 one, the other nil.
func hostAny(t *Tensor, off int) ([]float32, []uint16) {
	if t.DType() == BFloat16 {
		return nil, t.HostBF16()[off:]
	}
	return t.Host()[off:], nil
}

// from is s[i:], nil for a nil s.
func from[E any](s []E, i int) []E {
	if s == nil {
		return nil
	}
	return s[i:]
}

// SplitGemmK makes every later GEMM of the device add its k products in
// parts (each part's sum added to C as rounded after the previous one, as a
// split-k GPU GEMM does) instead of in one pass: the same product in
// another order, for measuring how far float32 reordering moves a run
// (train's GPU-vs-CPU tolerances). parts <= 1 restores one pass.
func (d *CPUDevice) SplitGemmK(parts int) {
	d.mu.Lock()
	d.splitK = parts
	d.mu.Unlock()
}

// eachKPart calls gemm for each part of k (SplitGemmK): the element
// offsets of the part's first column of op(A) and row of op(B), its
// length, and its beta (the caller's for the first part, then 1).
func (d *CPUDevice) eachKPart(transA, transB bool, k, lda, ldb int, beta float32, gemm func(aShift, bShift, kk int, beta float32)) {
	d.mu.Lock()
	parts := d.splitK
	d.mu.Unlock()
	if parts <= 1 || k < parts {
		gemm(0, 0, k, beta)
		return
	}
	for p := range parts {
		k0, k1 := p*k/parts, (p+1)*k/parts
		aShift, bShift := k0, k0*ldb // op(A) column k0, op(B) row k0
		if transA {
			aShift = k0 * lda
		}
		if transB {
			bShift = k0
		}
		if p > 0 {
			beta = 1
		}
		gemm(aShift, bShift, k1-k0, beta)
	}
}

// GemmStridedBatched computes batch Gemms with SgemmStridedBatched.
func (d *CPUDevice) GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda, strideA int, b *Tensor, bOff, ldb, strideB int, beta float32, c *Tensor, cOff, ldc, strideC, batch int) {
	d.ownAny("GemmStridedBatched", a, b, c)
	check.GemmStridedBatched(transA, transB, m, n, k, a, aOff, lda, strideA, b, bOff, ldb, strideB, c, cOff, ldc, strideC, batch)
	if d.observe != nil {
		d.observe(GemmShape{M: m, N: n, K: k, Batch: batch, TransA: transA, TransB: transB})
	}
	// bfloat16 A and B are widened as the products pack them; a bfloat16
	// C is summed in float32 scratch a piece at a time and rounded once
	// (toHalfC): only the matrices' elements are touched.
	fa, ha := hostAny(a, aOff)
	fb, hb := hostAny(b, bOff)
	product := func(da, db, m, batch int, hc []float32, ldc, strideC int) {
		d.eachKPart(transA, transB, k, lda, ldb, beta, func(aShift, bShift, kk int, beta float32) {
			gemmBatchedHalf(transA, transB, m, n, kk, alpha, from(fa, da+aShift), from(ha, da+aShift), lda, strideA,
				from(fb, db+bShift), from(hb, db+bShift), ldb, strideB, beta, hc, ldc, strideC, batch)
		})
	}
	if c.DType() == Float32 {
		product(0, 0, m, batch, c.Host()[cOff:], ldc, strideC)
		return
	}
	d.toHalfC(c, cOff, m, n, ldc, strideC, batch, beta, func(q0, qn, i0, rows int, s []float32) {
		product(q0*strideA+rowOffset(transA, i0, lda), q0*strideB, rows, qn, s, n, rows*n)
	})
}
