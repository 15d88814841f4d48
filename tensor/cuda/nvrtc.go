package cuda

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// kernelSource is every kernel of the device but GEMM, compiled by NVRTC
// for the device's architecture at Open and cached on disk.
//
//go:embed kernels.cu
var kernelSource string

// KernelSource is the CUDA C source of the device's kernels, as NVRTC
// compiles it at Open (the CPU simulation of package internal/cpusim
// compiles it for the host).
func KernelSource() string { return kernelSource }

// CacheDirEnv overrides where compiled kernels are cached
// (os.UserCacheDir()/hpcrun/cuda by default).
const CacheDirEnv = "HPCRUN_CUDA_CACHE"

// defaultCacheDir is the kernel cache directory, "" when there is none.
func defaultCacheDir() string {
	if d := os.Getenv(CacheDirEnv); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "hpcrun", "cuda")
}

// compileOptions are NVRTC's options for arch (e.g. "sm_90"); they are part
// of the cache key.
func compileOptions(arch string) []string {
	return []string{"--gpu-architecture=" + arch}
}

// cacheKey names a compiled image: the source, the architecture, NVRTC's
// version and the options all change it.
func cacheKey(src, arch string, nvrtcMajor, nvrtcMinor int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00nvrtc %d.%d\x00%s", src, arch, nvrtcMajor, nvrtcMinor, strings.Join(compileOptions(arch), " "))
	return hex.EncodeToString(h.Sum(nil))
}

// cachedImage returns the image cached under key in dir, else compiles it
// and stores it there (written to a temporary name and renamed, so a
// reader never sees half a file). A cache that cannot be written is not an
// error: the image is still returned.
func cachedImage(dir, key string, compile func() ([]byte, error)) (image []byte, fromCache bool, err error) {
	path := ""
	if dir != "" {
		path = cachePath(dir, key)
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return b, true, nil
		}
	}
	image, err = compile()
	if err != nil {
		return nil, false, err
	}
	if path != "" {
		_ = writeAtomic(path, image)
	}
	return image, false, nil
}

// cachePath is where the image of key is cached in dir.
func cachePath(dir, key string) string { return filepath.Join(dir, key+".cubin") }

// writeAtomic writes b to path, making its directory first.
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o644)
}

// cstr is s as a NUL-terminated byte slice.
func cstr(s string) []byte { return append([]byte(s), 0) }

// archs lists the architectures NVRTC can compile for, as "sm_XY"
// (nil from an NVRTC older than 11.2, which cannot say).
func (n *nvrtcAPI) archs() []string {
	if n.numSupportedArchs == 0 || n.supportedArchs == 0 {
		return nil
	}
	var num int32
	if call(n.numSupportedArchs, uintptr(unsafe.Pointer(&num))) != 0 || num <= 0 {
		return nil
	}
	v := make([]int32, num)
	if call(n.supportedArchs, uintptr(unsafe.Pointer(&v[0]))) != 0 {
		return nil
	}
	out := make([]string, len(v))
	for i, a := range v {
		out[i] = fmt.Sprintf("sm_%d", a)
	}
	return out
}

// checkArch says exactly why NVRTC cannot compile for arch, or nil when
// it can (or cannot say).
func (n *nvrtcAPI) checkArch(arch string) error {
	return archError(fmt.Sprintf("%s (NVRTC %d.%d)", n.name, n.major, n.minor), arch, n.archs())
}

// archNumber is the number of "sm_XY" (70 for sm_70, 100 for sm_100), -1
// for anything else.
func archNumber(arch string) int {
	v, err := strconv.Atoi(strings.TrimPrefix(arch, "sm_"))
	if err != nil || !strings.HasPrefix(arch, "sm_") {
		return -1
	}
	return v
}

// archError says why an NVRTC (who) that compiles for the archs known
// cannot compile for arch, or nil when it can (or known is nil: it cannot
// say). An arch older than the oldest it knows was dropped (CUDA 13's
// NVRTC starts at sm_75, without Volta's sm_70): an older NVRTC still has
// it. An arch newer than the newest came after this NVRTC.
func archError(who, arch string, known []string) error {
	if known == nil {
		return nil
	}
	for _, a := range known {
		if a == arch {
			return nil
		}
	}
	oldest, newest := known[0], known[len(known)-1]
	switch v := archNumber(arch); {
	case v >= 0 && v < archNumber(oldest):
		return fmt.Errorf("%s cannot compile for %s: it compiles %s to %s, having dropped the older archs; use an older NVRTC that still has %s (CUDA 12's, pip's nvidia-cuda-nvrtc-cu12, compiles sm_50 to sm_90 and later)",
			who, arch, oldest, newest, arch)
	case v > archNumber(newest):
		return fmt.Errorf("%s cannot compile for %s: it compiles %s to %s; %s needs a newer NVRTC (sm_90 came with CUDA 11.8)",
			who, arch, oldest, newest, arch)
	}
	return fmt.Errorf("%s cannot compile for %s: it compiles %s", who, arch, strings.Join(known, " "))
}

// splitArchs divides want into the archs an NVRTC that compiles for known
// can compile (all of want when known is nil) and, for the others, why not.
func splitArchs(who string, want, known []string) (compile []string, skipped []error) {
	for _, a := range want {
		if err := archError(who, a, known); err != nil {
			skipped = append(skipped, err)
			continue
		}
		compile = append(compile, a)
	}
	return compile, skipped
}

// compileNVRTC compiles src for arch (sm_XY) into a CUBIN.
func (l *libs) compileNVRTC(src, name, arch string) ([]byte, error) {
	n := &l.nvrtc
	if err := n.checkArch(arch); err != nil {
		return nil, err
	}
	srcC, nameC := cstr(src), cstr(name)
	var prog uintptr
	if err := l.nvrtcErr("nvrtcCreateProgram", call(n.createProgram, uintptr(unsafe.Pointer(&prog)),
		uintptr(unsafe.Pointer(&srcC[0])), uintptr(unsafe.Pointer(&nameC[0])), 0, 0, 0)); err != nil {
		return nil, err
	}
	defer call(n.destroyProgram, uintptr(unsafe.Pointer(&prog)))
	opts := compileOptions(arch)
	optC := make([][]byte, len(opts))
	optP := make([]*byte, len(opts))
	for i, o := range opts {
		optC[i] = cstr(o)
		optP[i] = &optC[i][0]
	}
	r := call(n.compileProgram, prog, uintptr(len(optP)), uintptr(unsafe.Pointer(&optP[0])))
	runtime.KeepAlive(optC)
	runtime.KeepAlive(srcC)
	if r != 0 {
		err := l.nvrtcErr("nvrtcCompileProgram", r)
		var size uintptr
		if call(n.getProgramLogSize, prog, uintptr(unsafe.Pointer(&size))) == 0 && size > 1 {
			buf := make([]byte, size)
			if call(n.getProgramLog, prog, uintptr(unsafe.Pointer(&buf[0]))) == 0 {
				return nil, fmt.Errorf("NVRTC %d.%d compiling %s for %s: %w\n%s", n.major, n.minor, name, arch, err, strings.TrimRight(string(buf), "\x00\n"))
			}
		}
		return nil, fmt.Errorf("NVRTC %d.%d compiling %s for %s: %w", n.major, n.minor, name, arch, err)
	}
	var size uintptr
	if err := l.nvrtcErr("nvrtcGetCUBINSize", call(n.getCUBINSize, prog, uintptr(unsafe.Pointer(&size)))); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, fmt.Errorf("NVRTC %d.%d made an empty CUBIN for %s", n.major, n.minor, arch)
	}
	image := make([]byte, size)
	if err := l.nvrtcErr("nvrtcGetCUBIN", call(n.getCUBIN, prog, uintptr(unsafe.Pointer(&image[0])))); err != nil {
		return nil, err
	}
	return image, nil
}
