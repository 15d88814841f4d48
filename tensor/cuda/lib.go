package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/internal/cudalib"
)

// The three libraries are opened with dlopen at run time, so nothing of
// CUDA is needed to build. Every entry point is called through
// purego.SyscallN with integer and pointer arguments only (scalars such as
// GEMM's alpha and beta go by pointer), and returns a 32-bit status.

// Library names, tried in order by cudalib's rule.
var (
	cudaNames   = cudalib.Names("CUDA driver")
	cublasNames = cudalib.Names("cuBLAS")
	nvrtcNames  = cudalib.Names("NVRTC")
)

// LibPathEnv names extra directories (colon-separated) searched for the
// CUDA libraries first, e.g. the lib directories of pip's nvidia-cublas
// and nvidia-cuda-nvrtc wheels; package cudalib gives the whole rule.
const LibPathEnv = cudalib.PathEnv

// driverAPI holds the CUDA driver entry points (libcuda).
type driverAPI struct {
	init, driverGetVersion, deviceGetCount, deviceGet, deviceGetName, deviceGetAttribute uintptr
	primaryCtxRetain, primaryCtxRelease, ctxSetCurrent                                   uintptr
	streamCreate, streamDestroy, streamSynchronize, streamQuery                          uintptr
	memAlloc, memFree, memAllocHost, memFreeHost, memGetInfo                             uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync, memsetD32Async                    uintptr
	moduleLoadData, moduleUnload, moduleGetFunction, launchKernel                        uintptr
	funcGetAttribute, funcSetAttribute                                                   uintptr
	getErrorName, getErrorString                                                         uintptr
}

// blasAPI holds the cuBLAS entry points.
type blasAPI struct {
	create, destroy, setStream, setMathMode, getVersion uintptr
	gemmEx, gemmStridedBatchedEx                        uintptr
	getStatusName, getStatusString                      uintptr // 0 before cuBLAS 11.4
	name                                                string
}

// nvrtcAPI holds the NVRTC entry points.
type nvrtcAPI struct {
	version, createProgram, destroyProgram, compileProgram uintptr
	getProgramLogSize, getProgramLog                       uintptr
	getCUBINSize, getCUBIN, getPTXSize, getPTX             uintptr
	getErrorString                                         uintptr
	numSupportedArchs, supportedArchs                      uintptr // 0 before NVRTC 11.2
	name                                                   string
	major, minor                                           int
}

type libs struct {
	cu    driverAPI
	blas  blasAPI
	nvrtc nvrtcAPI
}

var (
	libsOnce sync.Once
	libsVal  *libs
	libsErr  error
)

// loadLibs opens the three libraries once per process and calls cuInit.
func loadLibs() (*libs, error) {
	libsOnce.Do(func() { libsVal, libsErr = openLibs() })
	return libsVal, libsErr
}

// dlopenFirst opens the first of names that loads, by cudalib's rule;
// accept, when not nil, may refuse a library that loaded (with the reason).
func dlopenFirst(what, hint string, names []string, accept func(h uintptr, path string) error) (uintptr, string, error) {
	h, f, err := cudalib.Open(what, hint, names, accept)
	return h, f.Path, err
}

// bind resolves each symbol of h into its slot; optional ones may be absent.
func bind(h uintptr, lib string, syms map[string]*uintptr, optional ...string) error {
	for name, slot := range syms {
		p, err := purego.Dlsym(h, name)
		if err != nil {
			isOpt := false
			for _, o := range optional {
				isOpt = isOpt || o == name
			}
			if isOpt {
				continue
			}
			return fmt.Errorf("%s lacks %s (too old?): %w", lib, name, err)
		}
		*slot = p
	}
	return nil
}

func openLibs() (*libs, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("the CUDA backend needs Linux, not %s", runtime.GOOS)
	}
	l := &libs{}
	h, name, err := dlopenFirst("the CUDA driver", "install the NVIDIA driver (is there a GPU on this machine?)", cudaNames, nil)
	if err != nil {
		return nil, err
	}
	if err := l.bindDriver(h, name); err != nil {
		return nil, err
	}
	h, name, err = dlopenFirst("cuBLAS", "install the CUDA toolkit's cuBLAS, or pip's nvidia-cublas and add its lib directory to "+LibPathEnv+" or LD_LIBRARY_PATH", cublasNames, nil)
	if err != nil {
		return nil, err
	}
	if err := l.blas.bind(h, name); err != nil {
		return nil, err
	}
	var driver int32
	if err := l.cuErr("cuDriverGetVersion", call(l.cu.driverGetVersion, uintptr(unsafe.Pointer(&driver)))); err != nil {
		return nil, err
	}
	if err := l.nvrtc.open(int(driver), l.deviceArchs()); err != nil {
		return nil, err
	}
	return l, nil
}

// bindDriver resolves the driver's entry points in h (library name) and
// calls cuInit.
func (l *libs) bindDriver(h uintptr, name string) error {
	cu := &l.cu
	if err := bind(h, name, map[string]*uintptr{
		"cuInit": &cu.init, "cuDriverGetVersion": &cu.driverGetVersion,
		"cuDeviceGetCount": &cu.deviceGetCount, "cuDeviceGet": &cu.deviceGet,
		"cuDeviceGetName": &cu.deviceGetName, "cuDeviceGetAttribute": &cu.deviceGetAttribute,
		"cuDevicePrimaryCtxRetain": &cu.primaryCtxRetain, "cuDevicePrimaryCtxRelease_v2": &cu.primaryCtxRelease,
		"cuCtxSetCurrent": &cu.ctxSetCurrent,
		"cuStreamCreate":  &cu.streamCreate, "cuStreamDestroy_v2": &cu.streamDestroy,
		"cuStreamSynchronize": &cu.streamSynchronize, "cuStreamQuery": &cu.streamQuery,
		"cuMemAlloc_v2": &cu.memAlloc, "cuMemFree_v2": &cu.memFree,
		"cuMemAllocHost_v2": &cu.memAllocHost, "cuMemFreeHost": &cu.memFreeHost,
		"cuMemGetInfo_v2":      &cu.memGetInfo,
		"cuMemcpyHtoDAsync_v2": &cu.memcpyHtoDAsync, "cuMemcpyDtoHAsync_v2": &cu.memcpyDtoHAsync,
		"cuMemcpyDtoDAsync_v2": &cu.memcpyDtoDAsync, "cuMemsetD32Async": &cu.memsetD32Async,
		"cuModuleLoadData": &cu.moduleLoadData, "cuModuleUnload": &cu.moduleUnload,
		"cuModuleGetFunction": &cu.moduleGetFunction, "cuLaunchKernel": &cu.launchKernel,
		"cuFuncGetAttribute": &cu.funcGetAttribute, "cuFuncSetAttribute": &cu.funcSetAttribute,
		"cuGetErrorName": &cu.getErrorName, "cuGetErrorString": &cu.getErrorString,
	}); err != nil {
		return err
	}
	return l.cuErr("cuInit", call(cu.init, 0))
}

// bind resolves cuBLAS's entry points in h (library name).
func (b *blasAPI) bind(h uintptr, name string) error {
	b.name = name
	return bind(h, name, map[string]*uintptr{
		"cublasCreate_v2": &b.create, "cublasDestroy_v2": &b.destroy,
		"cublasSetStream_v2": &b.setStream, "cublasSetMathMode": &b.setMathMode,
		"cublasGetVersion_v2": &b.getVersion,
		"cublasGemmEx":        &b.gemmEx, "cublasGemmStridedBatchedEx": &b.gemmStridedBatchedEx,
		"cublasGetStatusName": &b.getStatusName, "cublasGetStatusString": &b.getStatusString,
	}, "cublasGetStatusName", "cublasGetStatusString")
}

// deviceArchs are the architectures ("sm_70") of the visible devices, in
// no order, each once; nil when the driver cannot say.
func (l *libs) deviceArchs() []string {
	var n int32
	if call(l.cu.deviceGetCount, uintptr(unsafe.Pointer(&n))) != 0 {
		return nil
	}
	seen := map[string]bool{}
	var archs []string
	for i := range int(n) {
		var dev, major, minor int32
		if call(l.cu.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(i)) != 0 ||
			call(l.cu.deviceGetAttribute, uintptr(unsafe.Pointer(&major)), attrCCMajor, uintptr(dev)) != 0 ||
			call(l.cu.deviceGetAttribute, uintptr(unsafe.Pointer(&minor)), attrCCMinor, uintptr(dev)) != 0 {
			continue
		}
		if a := fmt.Sprintf("sm_%d%d", major, minor); !seen[a] {
			seen[a] = true
			archs = append(archs, a)
		}
	}
	return archs
}

// nvrtcHint says where NVRTC comes from.
const nvrtcHint = "install the CUDA toolkit's NVRTC, or pip's nvidia-cuda-nvrtc and add its lib directory to " + LibPathEnv + " or LD_LIBRARY_PATH"

// open loads the newest NVRTC that compiles for every arch of need and
// whose kernels a driver of version driver (cuDriverGetVersion's
// 1000*major+10*minor; 0: any) can load; nvrtcFits says why one is passed
// over, and the error lists those reasons when none is left.
func (n *nvrtcAPI) open(driver int, need []string) error {
	accept := func(h uintptr, path string) error {
		if err := n.bind(h, path); err != nil {
			return err
		}
		return nvrtcFits(path, n.major, n.minor, n.archs(), driver, need)
	}
	_, _, err := dlopenFirst("NVRTC", nvrtcHint, nvrtcNames, accept)
	return err
}

// nvrtcFits says why the NVRTC at path (version major.minor, compiling for
// the archs known; nil: it cannot say) does not serve a driver of version
// driver and devices of the archs need, or nil when it does. A CUBIN from
// a newer major release than the driver's does not load, so libnvrtc.so.13
// beside a 12.x driver is passed over for an older one; CUDA 13's NVRTC
// has no sm_70, so on a V100 it is passed over for CUDA 12's.
func nvrtcFits(path string, major, minor int, known []string, driver int, need []string) error {
	if driver > 0 && major > driver/1000 {
		return fmt.Errorf("%s is NVRTC %d.%d but the driver supports CUDA %d.%d, and kernels compiled by a newer major release do not load: install NVRTC %d (pip's nvidia-cuda-nvrtc-cu%d) or a newer driver",
			path, major, minor, driver/1000, driver%1000/10, driver/1000, driver/1000)
	}
	for _, a := range need {
		if err := archError(fmt.Sprintf("%s (NVRTC %d.%d)", path, major, minor), a, known); err != nil {
			return err
		}
	}
	return nil
}

// bind resolves NVRTC's entry points in h and reads its version.
func (n *nvrtcAPI) bind(h uintptr, name string) error {
	n.name = name
	if err := bind(h, name, map[string]*uintptr{
		"nvrtcVersion": &n.version, "nvrtcCreateProgram": &n.createProgram,
		"nvrtcDestroyProgram": &n.destroyProgram, "nvrtcCompileProgram": &n.compileProgram,
		"nvrtcGetProgramLogSize": &n.getProgramLogSize, "nvrtcGetProgramLog": &n.getProgramLog,
		"nvrtcGetCUBINSize": &n.getCUBINSize, "nvrtcGetCUBIN": &n.getCUBIN,
		"nvrtcGetPTXSize": &n.getPTXSize, "nvrtcGetPTX": &n.getPTX,
		"nvrtcGetErrorString":       &n.getErrorString,
		"nvrtcGetNumSupportedArchs": &n.numSupportedArchs, "nvrtcGetSupportedArchs": &n.supportedArchs,
	}, "nvrtcGetNumSupportedArchs", "nvrtcGetSupportedArchs"); err != nil {
		return err
	}
	var major, minor int32
	if r := call(n.version, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor))); r != 0 {
		return fmt.Errorf("%s: nvrtcVersion failed (nvrtcResult %d)", name, r)
	}
	n.major, n.minor = int(major), int(minor)
	return nil
}

// call invokes a C function that returns a 32-bit status.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// cString copies the NUL-terminated C string at p.
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := p; *q != 0; q = (*byte)(unsafe.Add(unsafe.Pointer(q), 1)) {
		b = append(b, *q)
	}
	return string(b)
}

// Error is a failed CUDA, cuBLAS or NVRTC call.
type Error struct {
	Call string // the function that failed, e.g. "cuMemAlloc_v2"
	Code int    // its status
	Name string // the status's name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Msg  string // the library's description
}

// Error names the call, the library's message and the status.
func (e *Error) Error() string {
	if e.Msg != "" && e.Msg != e.Name {
		return fmt.Sprintf("%s: %s (%s, %d)", e.Call, e.Msg, e.Name, e.Code)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
}

// ErrOutOfMemory matches (errors.Is) an allocation the device could not make.
var ErrOutOfMemory = errors.New("out of device memory")

// Is makes errors.Is(err, ErrOutOfMemory) true for CUDA_ERROR_OUT_OF_MEMORY
// and CUBLAS_STATUS_ALLOC_FAILED.
func (e *Error) Is(target error) bool {
	return target == ErrOutOfMemory && (e.Name == "CUDA_ERROR_OUT_OF_MEMORY" || e.Name == "CUBLAS_STATUS_ALLOC_FAILED")
}

// cuErr turns a CUresult into an error (nil for CUDA_SUCCESS).
func (l *libs) cuErr(fn string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: fn, Code: int(r), Name: fmt.Sprintf("CUresult %d", r)}
	var p *byte
	if call(l.cu.getErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Name = cString(p)
	}
	p = nil
	if call(l.cu.getErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))) == 0 {
		e.Msg = cString(p)
	}
	return e
}

// cublasStatusNames are cublasStatus_t's names (cublas_api.h), for
// libraries older than cublasGetStatusName.
var cublasStatusNames = map[int32]string{
	1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
	7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH",
	11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
	14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

// blasErr turns a cublasStatus_t into an error (nil for success).
func (l *libs) blasErr(fn string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: fn, Code: int(r), Name: cublasStatusNames[r]}
	if e.Name == "" {
		e.Name = fmt.Sprintf("cublasStatus %d", r)
	}
	if l.blas.getStatusName != 0 {
		if r1, _, _ := purego.SyscallN(l.blas.getStatusName, uintptr(r)); r1 != 0 {
			e.Name = cString(*(**byte)(unsafe.Pointer(&r1)))
		}
	}
	if l.blas.getStatusString != 0 {
		if r1, _, _ := purego.SyscallN(l.blas.getStatusString, uintptr(r)); r1 != 0 {
			e.Msg = cString(*(**byte)(unsafe.Pointer(&r1)))
		}
	}
	return e
}

// nvrtcErr turns an nvrtcResult into an error (nil for NVRTC_SUCCESS).
func (l *libs) nvrtcErr(fn string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: fn, Code: int(r), Name: fmt.Sprintf("nvrtcResult %d", r)}
	if r1, _, _ := purego.SyscallN(l.nvrtc.getErrorString, uintptr(r)); r1 != 0 {
		e.Name = cString(*(**byte)(unsafe.Pointer(&r1)))
	}
	return e
}

// Available reports whether the CUDA backend can run here: the driver,
// cuBLAS and NVRTC load and at least one device is visible. When it cannot,
// why says what is missing and what to do.
func Available() (ok bool, why string) {
	n, err := DeviceCount()
	if err != nil {
		return false, err.Error()
	}
	if n == 0 {
		return false, "the CUDA driver sees no device (CUDA_VISIBLE_DEVICES empty, or no GPU)"
	}
	return true, ""
}

// DeviceCount is the number of CUDA devices visible to the process, or the
// reason the libraries do not load.
func DeviceCount() (int, error) {
	l, err := loadLibs()
	if err != nil {
		return 0, err
	}
	return l.deviceCount()
}

// deviceCount is cuDeviceGetCount's answer.
func (l *libs) deviceCount() (int, error) {
	var n int32
	if err := l.cuErr("cuDeviceGetCount", call(l.cu.deviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}
