package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// Device is a tensor.Device on one NVIDIA GPU: the device's primary
// context, one stream that every kernel, copy and GEMM is enqueued on, a
// cuBLAS handle bound to that stream, the NVRTC-compiled kernels of
// kernels.cu and a caching allocator. It is safe for concurrent use (calls
// are serialised); give each rank its own Device.
type Device struct {
	mu sync.Mutex
	l  *libs

	ordinal int
	dev     int32
	name    string
	arch    string // "sm_90"
	sms     int

	ctx    uintptr
	stream uintptr
	blas   uintptr
	module uintptr
	fn     map[string]uintptr

	alloc     *allocator
	precision tensor.Precision
	ccMajor   int   // compute capability's major: 8 for an A100, 7 for a V100
	err       error // first asynchronous failure since the last Sync
	fromCache bool
	closed    bool

	// launch arguments: argp[i] points at argv[i]; cuLaunchKernel copies
	// them, so one set serves every launch (under mu).
	argv [16]uint64
	argp [16]unsafe.Pointer
	// GEMM scalars, passed by pointer (host pointer mode).
	alpha, beta float32

	bfA, bfB, sumPart scratch
	part              scratch // partial sums of the norms' and biases' parameter gradients
	ids               idRing
	syncs             atomic.Int64 // times the host waited for the stream
	watch             WaitWatch    // nil: waits block in cuStreamSynchronize
}

// Options configure Open.
type Options struct {
	// CacheDir holds compiled kernels; "" uses HPCRUN_CUDA_CACHE, else
	// os.UserCacheDir()/hpcrun/cuda. "-" disables the cache.
	CacheDir string
}

// Device attributes (CUdevice_attribute) the device reads.
const (
	attrMultiprocessors = 16 // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	attrCCMajor         = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrCCMinor         = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
)

// Open opens CUDA device ordinal with default options.
func Open(ordinal int) (*Device, error) { return OpenWith(ordinal, Options{}) }

// OpenWith opens CUDA device ordinal: it retains the device's primary
// context, creates a stream and a cuBLAS handle, and loads the kernels
// (compiled by NVRTC for the device's architecture, or read from the
// cache). The error says what is missing when the libraries do not load.
func OpenWith(ordinal int, o Options) (*Device, error) {
	l, err := loadLibs()
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	return openOn(l, ordinal, o)
}

// openOn is OpenWith on the libraries l.
func openOn(l *libs, ordinal int, o Options) (*Device, error) {
	count, err := l.deviceCount()
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if ordinal < 0 || ordinal >= count {
		return nil, fmt.Errorf("cuda: device %d does not exist: %d device(s) visible (check CUDA_VISIBLE_DEVICES)", ordinal, count)
	}
	d := &Device{l: l, ordinal: ordinal, fn: map[string]uintptr{}}
	for i := range d.argp {
		d.argp[i] = unsafe.Pointer(&d.argv[i])
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.open(o); err != nil {
		d.teardown()
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	return d, nil
}

func (d *Device) open(o Options) error {
	l, cu := d.l, &d.l.cu
	if err := l.cuErr("cuDeviceGet", call(cu.deviceGet, uintptr(unsafe.Pointer(&d.dev)), uintptr(d.ordinal))); err != nil {
		return err
	}
	var nameBuf [256]byte
	if err := l.cuErr("cuDeviceGetName", call(cu.deviceGetName, uintptr(unsafe.Pointer(&nameBuf[0])), uintptr(len(nameBuf)), uintptr(d.dev))); err != nil {
		return err
	}
	d.name = cString(&nameBuf[0])
	attr := func(a int) (int, error) {
		var v int32
		err := l.cuErr("cuDeviceGetAttribute", call(cu.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d.dev)))
		return int(v), err
	}
	major, err := attr(attrCCMajor)
	if err != nil {
		return err
	}
	minor, err := attr(attrCCMinor)
	if err != nil {
		return err
	}
	if d.sms, err = attr(attrMultiprocessors); err != nil {
		return err
	}
	d.arch, d.ccMajor = fmt.Sprintf("sm_%d%d", major, minor), major

	if err := l.cuErr("cuDevicePrimaryCtxRetain", call(cu.primaryCtxRetain, uintptr(unsafe.Pointer(&d.ctx)), uintptr(d.dev))); err != nil {
		return err
	}
	if err := l.cuErr("cuCtxSetCurrent", call(cu.ctxSetCurrent, d.ctx)); err != nil {
		return err
	}
	// A blocking stream (flags 0) orders with the legacy default stream,
	// which NCCL calls from package parallel use (stream 0).
	if err := l.cuErr("cuStreamCreate", call(cu.streamCreate, uintptr(unsafe.Pointer(&d.stream)), 0)); err != nil {
		return err
	}
	if err := l.blasErr("cublasCreate_v2", call(l.blas.create, uintptr(unsafe.Pointer(&d.blas)))); err != nil {
		return err
	}
	if err := l.blasErr("cublasSetStream_v2", call(l.blas.setStream, d.blas, d.stream)); err != nil {
		return err
	}
	d.alloc = newAllocator(d.memAlloc, d.memFree, d.streamSync)
	return d.loadKernels(o)
}

// loadKernels compiles kernels.cu (or reads the cached image) and looks up
// every kernel.
func (d *Device) loadKernels(o Options) error {
	l := d.l
	dir := o.CacheDir
	if dir == "" {
		dir = defaultCacheDir()
	} else if dir == "-" {
		dir = ""
	}
	key := cacheKey(kernelSource, d.arch, l.nvrtc.major, l.nvrtc.minor)
	compile := func() ([]byte, error) { return l.compileNVRTC(kernelSource, "hpcrun_kernels.cu", d.arch) }
	image, fromCache, err := cachedImage(dir, key, compile)
	if err != nil {
		return err
	}
	r := call(l.cu.moduleLoadData, uintptr(unsafe.Pointer(&d.module)), uintptr(unsafe.Pointer(&image[0])))
	if r != 0 && fromCache { // a stale or damaged cache entry: compile afresh
		if image, err = compile(); err != nil {
			return err
		}
		fromCache = false
		if dir != "" {
			_ = writeAtomic(cachePath(dir, key), image)
		}
		r = call(l.cu.moduleLoadData, uintptr(unsafe.Pointer(&d.module)), uintptr(unsafe.Pointer(&image[0])))
	}
	runtime.KeepAlive(image)
	if err := l.cuErr("cuModuleLoadData", r); err != nil {
		return fmt.Errorf("loading the kernels compiled for %s by NVRTC %d.%d (is the driver older than NVRTC?): %w", d.arch, l.nvrtc.major, l.nvrtc.minor, err)
	}
	d.fromCache = fromCache
	dynShared := flashKernels()
	for _, k := range kernels {
		name := k.name
		var f uintptr
		nameC := cstr(name)
		if err := l.cuErr("cuModuleGetFunction("+name+")", call(l.cu.moduleGetFunction, uintptr(unsafe.Pointer(&f)), d.module, uintptr(unsafe.Pointer(&nameC[0])))); err != nil {
			return err
		}
		if err := d.checkFunc(name, f, k.maxThreads); err != nil {
			return err
		}
		if bytes := dynShared[name]; bytes > defaultDynShared {
			const maxDynShared = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
			if err := l.cuErr("cuFuncSetAttribute("+name+")", call(l.cu.funcSetAttribute, f, maxDynShared, uintptr(bytes))); err != nil {
				return fmt.Errorf("kernel %s needs %d bytes of shared memory on %s: %w", name, bytes, d.arch, err)
			}
		}
		d.fn[name] = f
	}
	return nil
}

// checkFunc fails when the driver says kernel name (function f) cannot
// run the most threads a block the Go side launches it with: its
// registers, as compiled for this device, do not allow them. This is the
// check the NVRTC test makes on a CUBIN's ELF attributes, asked of the
// driver, so it holds whatever the CUBIN's layout.
func (d *Device) checkFunc(name string, f uintptr, maxThreads int) error {
	const (
		funcMaxThreads = 0 // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
		funcNumRegs    = 4 // CU_FUNC_ATTRIBUTE_NUM_REGS
	)
	var most, regs int32
	if err := d.l.cuErr("cuFuncGetAttribute("+name+")", call(d.l.cu.funcGetAttribute, uintptr(unsafe.Pointer(&most)), funcMaxThreads, f)); err != nil {
		return err
	}
	if int(most) >= maxThreads {
		return nil
	}
	call(d.l.cu.funcGetAttribute, uintptr(unsafe.Pointer(&regs)), funcNumRegs, f)
	return fmt.Errorf("kernel %s compiled for %s by NVRTC %d.%d runs at most %d threads a block (%d registers a thread), but it is launched with up to %d",
		name, d.arch, d.l.nvrtc.major, d.l.nvrtc.minor, most, regs, maxThreads)
}

// teardown releases whatever open got (Close, or a failed Open).
func (d *Device) teardown() error {
	l := d.l
	var errs []error
	if d.ctx != 0 {
		if err := l.cuErr("cuCtxSetCurrent", call(l.cu.ctxSetCurrent, d.ctx)); err != nil {
			// Nothing of this device can be freed from another context;
			// releasing the primary context frees it all when this was
			// its last user.
			errs = append(errs, err, l.cuErr("cuDevicePrimaryCtxRelease_v2", call(l.cu.primaryCtxRelease, uintptr(d.dev))))
			d.ctx, d.stream, d.blas, d.module = 0, 0, 0, 0
			return errors.Join(errs...)
		}
	}
	if d.stream != 0 {
		errs = append(errs, d.streamSync())
	}
	if d.alloc != nil {
		errs = append(errs, d.alloc.releaseAll())
	}
	for _, s := range []*scratch{&d.bfA, &d.bfB, &d.part, &d.sumPart} {
		errs = append(errs, s.release(d))
	}
	errs = append(errs, d.ids.release(d))
	if d.blas != 0 {
		errs = append(errs, l.blasErr("cublasDestroy_v2", call(l.blas.destroy, d.blas)))
		d.blas = 0
	}
	if d.module != 0 {
		errs = append(errs, l.cuErr("cuModuleUnload", call(l.cu.moduleUnload, d.module)))
		d.module = 0
	}
	if d.stream != 0 {
		errs = append(errs, l.cuErr("cuStreamDestroy_v2", call(l.cu.streamDestroy, d.stream)))
		d.stream = 0
	}
	if d.ctx != 0 {
		errs = append(errs, l.cuErr("cuDevicePrimaryCtxRelease_v2", call(l.cu.primaryCtxRelease, uintptr(d.dev))))
		d.ctx = 0
	}
	return errors.Join(errs...)
}

// Close waits for the stream, frees every allocation (tensors of this
// device must not be used again) and releases the context.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return d.teardown()
}

// enter locks the device and makes its context current on this OS thread
// for the duration of a call; leave undoes it. When the context cannot be
// made current, nothing may be enqueued (it would go to whatever context
// the thread has): enter records the error for Sync, unlocks and returns
// it, and the caller returns without calling leave.
func (d *Device) enter() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		panic("cuda: use of a closed device")
	}
	runtime.LockOSThread()
	if r := call(d.l.cu.ctxSetCurrent, d.ctx); r != 0 {
		err := d.l.cuErr("cuCtxSetCurrent", r)
		d.fail(err)
		d.leave()
		return err
	}
	return nil
}

func (d *Device) leave() {
	runtime.UnlockOSThread()
	d.mu.Unlock()
}

// fail records the first asynchronous error for Sync.
func (d *Device) fail(err error) {
	if err != nil && d.err == nil {
		d.err = err
	}
}

// Name is "cuda:N".
func (d *Device) Name() string { return fmt.Sprintf("cuda:%d", d.ordinal) }

// Describe is the device's name, GPU model and architecture, e.g.
// "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)".
func (d *Device) Describe() string { return fmt.Sprintf("%s %s (%s)", d.Name(), d.name, d.arch) }

// Arch is the architecture the kernels were compiled for, e.g. "sm_90".
func (d *Device) Arch() string { return d.arch }

// KernelsFromCache reports whether Open found the compiled kernels in the
// disk cache rather than running NVRTC.
func (d *Device) KernelsFromCache() bool { return d.fromCache }

// Stream is the CUstream every operation of the device is enqueued on
// (for NCCL calls that must follow them).
func (d *Device) Stream() uintptr { return d.stream }

// SetMatmulPrecision sets how later Gemm calls compute.
func (d *Device) SetMatmulPrecision(p tensor.Precision) {
	if p < tensor.FP32 || p > tensor.BF16 {
		panic(fmt.Sprintf("cuda.SetMatmulPrecision: unknown %v", p))
	}
	d.mu.Lock()
	d.precision = p
	d.mu.Unlock()
}

// CheckPrecision says whether the device computes p on tensor cores: tf32
// and bf16 need sm_80 (an A100) or newer.
func (d *Device) CheckPrecision(p tensor.Precision) error {
	if p == tensor.FP32 || d.ccMajor >= 8 {
		return nil
	}
	return fmt.Errorf("precision %s: %s has no %s tensor cores (sm_80 or newer has): use --precision fp32", p, d.Describe(), p)
}

// MatmulPrecision is how Gemm computes.
func (d *Device) MatmulPrecision() tensor.Precision {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.precision
}

// --- memory ---

func (d *Device) memAlloc(bytes int64) (uintptr, error) {
	var p uintptr
	err := d.l.cuErr("cuMemAlloc_v2", call(d.l.cu.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes)))
	return p, err
}

func (d *Device) memFree(p uintptr) error {
	return d.l.cuErr("cuMemFree_v2", call(d.l.cu.memFree, p))
}

func (d *Device) streamSync() error {
	d.syncs.Add(1)
	if d.watch == nil {
		return d.l.cuErr("cuStreamSynchronize", call(d.l.cu.streamSynchronize, d.stream))
	}
	return pollStream(func() int32 { return call(d.l.cu.streamQuery, d.stream) }, d.l.cuErr, d.stream, d.watch, time.Sleep)
}

// WaitWatch is what a device's waits need of the communicators that post
// work on its stream (nccl's NCCL communicator): how long a wait may last,
// that a stream drained, and what to do when one did not in time.
type WaitWatch interface {
	// WaitLimit is how long a wait on the stream may last.
	WaitLimit() time.Duration
	// StreamDrained says the host saw stream finish all its work.
	StreamDrained(stream uintptr)
	// StreamStalled is called once a wait on stream has lasted past
	// WaitLimit: it aborts what the stream waits on and returns the error
	// that names it.
	StreamStalled(stream uintptr, waited time.Duration) error
}

// WatchWaits makes every wait of the device on its stream poll it
// (cuStreamQuery) instead of blocking in cuStreamSynchronize, and give up
// after w's limit: an NCCL operation whose peer never posts its call then
// ends the job with an error naming it, instead of hanging. nil restores
// the blocking wait.
func (d *Device) WatchWaits(w WaitWatch) {
	d.mu.Lock()
	d.watch = w
	d.mu.Unlock()
}

// errNotReady is CUDA_ERROR_NOT_READY, cuStreamQuery's "still running".
const errNotReady = 600

// pollStream waits for a stream by polling query (cuStreamQuery), sleeping
// a little longer each time up to a millisecond. Past w.WaitLimit it asks
// w to abort (StreamStalled), then gives the stream as long again to end
// (an aborted NCCL kernel returns) and returns w's error either way.
func pollStream(query func() int32, cuErr func(string, int32) error, stream uintptr, w WaitWatch, sleep func(time.Duration)) error {
	limit := w.WaitLimit()
	start := time.Now()
	var stalled error
	for pause := time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
		switch r := query(); r {
		case 0:
			if stalled != nil {
				return stalled
			}
			w.StreamDrained(stream)
			return nil
		case errNotReady:
		default:
			if stalled != nil {
				return stalled
			}
			return cuErr("cuStreamQuery", r)
		}
		waited := time.Since(start)
		if stalled == nil && waited > limit {
			stalled = w.StreamStalled(stream, waited)
			if stalled == nil {
				stalled = fmt.Errorf("cuda: a wait on the stream passed %v", limit)
			}
		} else if stalled != nil && waited > 2*limit {
			return stalled
		}
		sleep(pause)
	}
}

// Alloc returns a zeroed tensor in device memory, from the allocator's
// cache when a block of its size class is free.
func (d *Device) Alloc(shape ...int) (*tensor.Tensor, error) {
	return d.AllocAs(tensor.Float32, shape...)
}

// AllocAs is Alloc for elements stored as dt (a BFloat16 tensor takes 2
// bytes an element).
func (d *Device) AllocAs(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := 1
	for _, s := range shape {
		if s < 0 {
			return nil, fmt.Errorf("cuda alloc: negative dimension in shape %v", shape)
		}
		n *= s
	}
	if dt != tensor.Float32 && dt != tensor.BFloat16 {
		return nil, fmt.Errorf("cuda alloc: %v", dt)
	}
	buffer := func(p uintptr) *tensor.Buffer {
		if dt == tensor.BFloat16 {
			return tensor.NewBF16Buffer(d, n, nil, p)
		}
		return tensor.NewBuffer(d, n, nil, p)
	}
	if n == 0 {
		return tensor.NewTensor(buffer(0), 0, shape...), nil
	}
	if err := d.enter(); err != nil {
		return nil, fmt.Errorf("cuda alloc %v on %s: %w", shape, d.Name(), err)
	}
	defer d.leave()
	bytes := int64(n) * int64(dt.Size())
	p, err := d.alloc.alloc(bytes)
	if err != nil {
		return nil, fmt.Errorf("cuda alloc %v (%d bytes) on %s: %w", shape, bytes, d.Name(), err)
	}
	words := (bytes + 3) / 4 // within the block: its size class is a multiple of 512 bytes
	if err := d.l.cuErr("cuMemsetD32Async", call(d.l.cu.memsetD32Async, p, 0, uintptr(words), d.stream)); err != nil {
		d.alloc.freeBlock(p)
		return nil, fmt.Errorf("cuda alloc %v: %w", shape, err)
	}
	return tensor.NewTensor(buffer(p), 0, shape...), nil
}

// Free returns t's buffer to the allocator's cache.
func (d *Device) Free(t *tensor.Tensor) {
	if t == nil {
		panic("tensor.Free: nil tensor")
	}
	if t.Device() != tensor.Device(d) {
		panic(fmt.Sprintf("tensor.Free: tensor %v is not on this cuda device", t))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := t.Buffer()
	if b.MarkFreed() && b.Ptr() != 0 && !d.closed {
		d.alloc.freeBlock(b.Ptr())
	}
}

// MemStats reports the bytes of live tensors and the peak, which also
// counts the kernels' scratch (bf16 GEMM operands, reduction partials,
// staged ids) held at the time.
func (d *Device) MemStats() tensor.MemStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return tensor.MemStats{Current: d.alloc.cur, Peak: d.alloc.peak}
}

// AllocStats reports the caching allocator's accounting.
func (d *Device) AllocStats() AllocStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.alloc.snapshot()
	for _, sc := range []*scratch{&d.bfA, &d.bfB, &d.part, &d.sumPart} {
		s.Workspace += sc.bytes
	}
	s.Workspace += d.ids.bytes()
	return s
}

// ResetPeak sets the peak to the current allocation.
func (d *Device) ResetPeak() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.alloc.peak = d.alloc.cur + d.alloc.work
}

// EmptyCache returns the allocator's cached free blocks to the driver.
func (d *Device) EmptyCache() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return d.alloc.emptyCache()
}

// MemInfo is the device memory free and in total, as the driver sees it
// (every process included).
func (d *Device) MemInfo() (free, total int64, err error) {
	if err = d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.leave()
	var f, t uintptr
	err = d.l.cuErr("cuMemGetInfo_v2", call(d.l.cu.memGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))))
	return int64(f), int64(t), err
}

// Sync waits for the stream and returns the first error since the last
// Sync: a failed launch, copy or GEMM, or the stream's own.
func (d *Device) Sync() error {
	if err := d.enter(); err != nil {
		d.mu.Lock() // enter recorded err: Sync reports it once
		d.err = nil
		d.mu.Unlock()
		return err
	}
	defer d.leave()
	d.fail(d.streamSync())
	err := d.err
	d.err = nil
	return err
}

// scratch is a device buffer that only grows, for kernels' temporaries.
// Growing waits for the stream, since enqueued work may still use the old one.
type scratch struct {
	ptr   uintptr
	bytes int64
}

func (s *scratch) get(d *Device, bytes int64) (uintptr, error) { return s.grow(d.alloc, bytes) }

// grow makes s hold at least bytes, through a's driver calls; a counts
// the scratch in its peak (a device that needs it needs the memory).
func (s *scratch) grow(a *allocator, bytes int64) (uintptr, error) {
	if bytes <= s.bytes {
		return s.ptr, nil
	}
	bytes = max(bytes, 2*s.bytes, 1<<16)
	if s.ptr != 0 {
		if err := a.sync(); err != nil {
			return 0, err
		}
		if err := s.free(a); err != nil {
			return 0, err
		}
	}
	p, err := a.raw(bytes)
	if err != nil && errors.Is(err, ErrOutOfMemory) {
		if a.emptyCache() == nil {
			p, err = a.raw(bytes)
		}
	}
	if err != nil {
		return 0, err
	}
	s.ptr, s.bytes = p, bytes
	a.workspace(bytes)
	return p, nil
}

func (s *scratch) release(d *Device) error { return s.free(d.alloc) }

// free returns the buffer to the driver; it is forgotten even when the
// driver refuses (the error says so), since it cannot be used again.
func (s *scratch) free(a *allocator) error {
	if s.ptr == 0 {
		return nil
	}
	err := a.release(s.ptr)
	a.workspace(-s.bytes)
	s.ptr, s.bytes = 0, 0
	return err
}

// idRing stages int32 host slices (token ids, targets, masks) for kernels:
// a pinned host ring and a device buffer of the same size, so that the
// upload is asynchronous and the caller may reuse its slice at once. When
// the ring wraps, the stream is synchronised first, so no copy still reads
// the part that is overwritten.
type idRing struct {
	host unsafe.Pointer // pinned, n int32s
	dev  uintptr
	n    int
	pos  int
}

// bytes is the ring's device buffer: the pinned host ring beside it is not
// device memory (the peak and Workspace count device bytes only).
func (r *idRing) bytes() int64 { return int64(r.n) * 4 }

func (r *idRing) release(d *Device) error {
	var errs []error
	if r.host != nil {
		errs = append(errs, d.l.cuErr("cuMemFreeHost", call(d.l.cu.memFreeHost, uintptr(r.host))))
		r.host = nil
	}
	if r.dev != 0 {
		errs = append(errs, d.memFree(r.dev))
		d.alloc.workspace(-r.bytes())
		r.dev = 0
	}
	r.n, r.pos = 0, 0
	return errors.Join(errs...)
}

// upload enqueues a copy of ids to the device and returns its address (0
// for an empty slice).
func (d *Device) upload(ids []int32) (uintptr, error) {
	n := len(ids)
	if n == 0 {
		return 0, nil
	}
	r := &d.ids
	if r.pos+n > r.n {
		if err := d.streamSync(); err != nil {
			return 0, err
		}
		r.pos = 0
		if n > r.n {
			if err := r.release(d); err != nil {
				return 0, err
			}
			size := max(n, 1<<18)
			var host unsafe.Pointer
			if err := d.l.cuErr("cuMemAllocHost_v2", call(d.l.cu.memAllocHost, uintptr(unsafe.Pointer(&host)), uintptr(size*4))); err != nil {
				return 0, err
			}
			dev, err := d.memAlloc(int64(size) * 4)
			if err != nil {
				return 0, errors.Join(err, d.l.cuErr("cuMemFreeHost", call(d.l.cu.memFreeHost, uintptr(host))))
			}
			r.host, r.dev, r.n = host, dev, size
			d.alloc.workspace(r.bytes())
		}
	}
	copy(unsafe.Slice((*int32)(r.host), r.n)[r.pos:r.pos+n], ids)
	src := unsafe.Add(r.host, r.pos*4)
	dst := r.dev + uintptr(r.pos)*4
	if err := d.l.cuErr("cuMemcpyHtoDAsync_v2", call(d.l.cu.memcpyHtoDAsync, dst, uintptr(src), uintptr(n*4), d.stream)); err != nil {
		return 0, err
	}
	r.pos += (n + 31) &^ 31 // keep 128-byte alignment
	return dst, nil
}

// --- copies ---

// CopyFromHost copies src into dst. The copy is staged by the driver
// before it returns, so src may be reused at once.
func (d *Device) CopyFromHost(dst *tensor.Tensor, src []float32) {
	d.ownAny("CopyFromHost", dst)
	check.CopyFromHost(dst, src)
	if len(src) == 0 {
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	from, bytes := unsafe.Pointer(&src[0]), len(src)*4
	if dst.DType() == tensor.BFloat16 { // rounded here, on the host
		half := make([]uint16, len(src))
		tensor.RoundBF16(half, src)
		from, bytes = unsafe.Pointer(&half[0]), len(half)*2
		defer runtime.KeepAlive(half)
	}
	d.fail(d.l.cuErr("cuMemcpyHtoDAsync_v2", call(d.l.cu.memcpyHtoDAsync, dst.Ptr(), uintptr(from), uintptr(bytes), d.stream)))
	// Pageable memory: the driver may still read src after an async call
	// returns on some paths; waiting makes reuse safe everywhere.
	d.fail(d.streamSync())
}

// CopyToHost copies src into dst after the work that writes src. On a
// device failure dst is filled with NaN and Sync reports the error.
func (d *Device) CopyToHost(dst []float32, src *tensor.Tensor) {
	d.ownAny("CopyToHost", src)
	check.CopyToHost(dst, src)
	if len(dst) == 0 {
		return
	}
	if d.enter() != nil { // recorded for Sync
		fillNaN(dst)
		return
	}
	defer d.leave()
	to, bytes := unsafe.Pointer(&dst[0]), len(dst)*4
	var half []uint16
	if src.DType() == tensor.BFloat16 { // widened here, on the host
		half = make([]uint16, len(dst))
		to, bytes = unsafe.Pointer(&half[0]), len(half)*2
	}
	err := d.l.cuErr("cuMemcpyDtoHAsync_v2", call(d.l.cu.memcpyDtoHAsync, uintptr(to), src.Ptr(), uintptr(bytes), d.stream))
	if err == nil {
		err = d.streamSync()
	}
	if err != nil {
		d.fail(err)
		fillNaN(dst)
		return
	}
	if half != nil {
		tensor.WidenBF16(dst, half)
	}
}

// fillNaN marks a copy that did not happen.
func fillNaN(dst []float32) {
	nan := float32(math.NaN())
	for i := range dst {
		dst[i] = nan
	}
}

// Copy copies src into dst (device to device, on the stream).
func (d *Device) Copy(dst, src *tensor.Tensor) {
	d.ownAny("Copy", dst, src)
	check.Copy(dst, src)
	if dst.Len() == 0 {
		return
	}
	switch {
	case dst.DType() == tensor.BFloat16 && src.DType() == tensor.Float32:
		d.elementwise("round_bf16", dst.Len(), tp(dst), tp(src), i64(dst.Len()))
		return
	case dst.DType() == tensor.Float32 && src.DType() == tensor.BFloat16:
		d.elementwise("widen_bf16", dst.Len(), tp(dst), tp(src), i64(dst.Len()))
		return
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	d.fail(d.l.cuErr("cuMemcpyDtoDAsync_v2", call(d.l.cu.memcpyDtoDAsync, dst.Ptr(), src.Ptr(), uintptr(dst.Bytes()), d.stream)))
}

var _ tensor.Device = (*Device)(nil)
