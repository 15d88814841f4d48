package cpusim

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// sim is the simulation's driver, opened for the tests' own kernels.
type sim struct {
	t                                                        *testing.T
	launch, alloc, htod, dtoh, getFunc, setAttr, setSeed, ld uintptr
	module                                                   uintptr
}

func call(t *testing.T, fn uintptr, args ...uintptr) int32 {
	t.Helper()
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// built is the simulation of testdata/intrinsics.cu, built once for the
// package's tests.
var built struct {
	once     sync.Once
	dir, lib string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// openSim builds the simulation of testdata/intrinsics.cu (once) and opens
// it.
func openSim(t *testing.T) *sim {
	t.Helper()
	built.once.Do(func() {
		src, err := os.ReadFile(filepath.Join("testdata", "intrinsics.cu"))
		if err != nil {
			built.err = err
			return
		}
		if built.dir, built.err = os.MkdirTemp("", "cpusim-test-"); built.err != nil {
			return
		}
		built.lib, built.err = Build(built.dir, string(src))
	})
	lib, err := built.lib, built.err
	if errors.Is(err, ErrNoCompiler) && os.Getenv(RequireEnv) == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	h, err := purego.Dlopen(lib, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t}
	for name, slot := range map[string]*uintptr{
		"cuLaunchKernel": &s.launch, "cuMemAlloc_v2": &s.alloc, "cuMemcpyHtoDAsync_v2": &s.htod,
		"cuMemcpyDtoHAsync_v2": &s.dtoh, "cuModuleGetFunction": &s.getFunc, "cuFuncSetAttribute": &s.setAttr,
		"hpcrun_sim_set_order_seed": &s.setSeed, "cuModuleLoadData": &s.ld,
	} {
		if *slot, err = purego.Dlsym(h, name); err != nil {
			t.Fatal(err)
		}
	}
	image := []byte("HPCRUN-CPUSIM\x00")
	if r := call(t, s.ld, uintptr(unsafe.Pointer(&s.module)), uintptr(unsafe.Pointer(&image[0]))); r != 0 {
		t.Fatalf("cuModuleLoadData: %d", r)
	}
	return s
}

func (s *sim) fn(name string) uintptr {
	var f uintptr
	c := append([]byte(name), 0)
	if r := call(s.t, s.getFunc, uintptr(unsafe.Pointer(&f)), s.module, uintptr(unsafe.Pointer(&c[0]))); r != 0 {
		s.t.Fatalf("cuModuleGetFunction(%s): %d", name, r)
	}
	return f
}

// buf is a device buffer of n 4-byte elements.
func (s *sim) buf(n int) uintptr {
	var p uintptr
	if r := call(s.t, s.alloc, uintptr(unsafe.Pointer(&p)), uintptr(4*n)); r != 0 {
		s.t.Fatalf("cuMemAlloc: %d", r)
	}
	return p
}

func (s *sim) put(p uintptr, v []float32) {
	call(s.t, s.htod, p, uintptr(unsafe.Pointer(&v[0])), uintptr(4*len(v)), 0)
}

func (s *sim) get(p uintptr, n int) []uint32 {
	v := make([]uint32, n)
	if r := call(s.t, s.dtoh, uintptr(unsafe.Pointer(&v[0])), p, uintptr(4*n), 0); r != 0 {
		s.t.Fatalf("cuMemcpyDtoH: %d", r)
	}
	return v
}

// run launches name on grid x block threads with shmem bytes of dynamic
// shared memory; args are the kernel's arguments (8 bytes each).
func (s *sim) run(name string, grid, block, shmem int, args ...uint64) int32 {
	ptrs := make([]uintptr, len(args))
	for i := range args {
		ptrs[i] = uintptr(unsafe.Pointer(&args[i]))
	}
	var pp uintptr
	if len(ptrs) > 0 {
		pp = uintptr(unsafe.Pointer(&ptrs[0]))
	}
	return call(s.t, s.launch, s.fn(name), uintptr(grid), 1, 1, uintptr(block), 1, 1, uintptr(shmem), 0, pp, 0)
}

// The shuffles return what CUDA's definitions say: __shfl_sync the
// named lane, down and up the lane delta away or the caller's own value
// past the segment's edge, xor the lane ^ mask, each within segments of
// width lanes; __syncwarp orders a warp's shared memory.
func TestShufflesAndSyncwarp(t *testing.T) {
	s := openSim(t)
	out := s.buf(64 * 5)
	if r := s.run("shuffles", 1, 64, 0, uint64(out)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	got := s.get(out, 64*5)
	for th := range 64 {
		lane, base := th&31, th&^31
		down := th + 3
		if lane+3 >= 32 {
			down = th
		}
		up := th - 5
		if lane < 5 {
			up = th
		}
		seg := th &^ 7
		down8 := th + 2
		if down8 >= seg+8 {
			down8 = th
		}
		want := []int{base + (lane*7)&31, down, up, base + lane ^ 9, down8}
		for k, src := range want {
			if int32(got[5*th+k]) != int32(100*src) {
				t.Errorf("thread %d, shuffle %d: got %d, want lane %d's %d", th, k, int32(got[5*th+k]), src, 100*src)
			}
		}
	}
	if r := s.run("syncwarp_exchange", 1, 64, 0, uint64(out)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	for th, v := range s.get(out, 64) {
		if want := 32*(th/32) + 31 - th%32; int(v) != want {
			t.Errorf("syncwarp_exchange thread %d read %d, want %d", th, v, want)
		}
	}
}

// Dynamic shared memory holds a block's slice; it starts as NaNs (no
// zeros to hide a read before a write); past 48 KiB a launch needs the
// kernel's attribute raised, as on a GPU.
func TestDynamicSharedMemory(t *testing.T) {
	s := openSim(t)
	const blocks, n = 3, 96
	in, out := s.buf(blocks*n), s.buf(blocks*n)
	v := make([]float32, blocks*n)
	for i := range v {
		v[i] = float32(i)
	}
	s.put(in, v)
	if r := s.run("dyn_reverse", blocks, n, 4*n, uint64(out), uint64(in)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	for i, u := range s.get(out, blocks*n) {
		b, th := i/n, i%n
		if want := float32(b*n + n - 1 - th); math.Float32frombits(u) != want {
			t.Fatalf("element %d = %v, want %v", i, math.Float32frombits(u), want)
		}
	}
	if r := s.run("dyn_unwritten", 1, 32, 4*32, uint64(out)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	for i, u := range s.get(out, 32) {
		if f := math.Float32frombits(u); !math.IsNaN(float64(f)) {
			t.Fatalf("unwritten shared memory read %v at %d, want NaN", f, i)
		}
	}
	if r := s.run("dyn_reverse", 1, 32, 64<<10, uint64(out), uint64(in)); r == 0 {
		t.Error("64 KiB of dynamic shared memory launched without the attribute")
	}
	if r := call(t, s.setAttr, s.fn("dyn_reverse"), 8, 64<<10); r != 0 {
		t.Fatalf("cuFuncSetAttribute: %d", r)
	}
	if r := s.run("dyn_reverse", 1, 32, 64<<10, uint64(out), uint64(in)); r != 0 {
		t.Errorf("64 KiB with the attribute raised: %d", r)
	}
}

// A race between warps that thread order hides (warp 1 reads warp 0's
// writes without a barrier) shows when the threads run in an order drawn
// from a seed: the seeded order catches what the fixed order cannot.
func TestSeededOrderCatchesARace(t *testing.T) {
	s := openSim(t)
	out := s.buf(64)
	racy := func(gen int) bool {
		if r := s.run("racy_warps", 1, 64, 0, uint64(out), uint64(gen)); r != 0 {
			t.Fatalf("launch: %d", r)
		}
		for th, u := range s.get(out, 64) {
			if math.Float32frombits(u) != float32(1000*gen+th%32) {
				return true
			}
		}
		return false
	}
	call(t, s.setSeed, 0)
	for gen := 1; gen <= 3; gen++ {
		if racy(gen) {
			t.Fatalf("thread order: the race showed (launch %d), so this test proves nothing", gen)
		}
	}
	var caught []string
	for seed := uint64(1); seed <= 8; seed++ {
		call(t, s.setSeed, uintptr(seed))
		if racy(int(seed) + 10) {
			caught = append(caught, "seed "+string(rune('0'+seed)))
		}
	}
	call(t, s.setSeed, 0)
	if len(caught) == 0 {
		t.Fatal("no seed of 8 made warp 1 run before warp 0")
	}
	t.Logf("the race shows under %s", strings.Join(caught, ", "))
}

// bf16 rounds f to bfloat16, to nearest even (finite values).
func bf16(f float32) uint16 {
	u := math.Float32bits(f)
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// mma.sync's product, from fragments loaded by PTX's layout formulas and
// from shared memory by ldmatrix, equals A B + C summed in float64 from
// the same bf16 values (to float32 rounding), and ldmatrix's registers
// are the fragments' layout.
func TestMMAAndLdmatrix(t *testing.T) {
	s := openSim(t)
	A, B, bt := make([]uint16, 256), make([]uint16, 128), make([]uint16, 128)
	C := make([]float32, 128)
	for i := range A {
		A[i] = bf16(float32(math.Sin(float64(i)*0.37)) * 2)
	}
	for k := range 16 {
		for n := range 8 {
			v := bf16(float32(math.Cos(float64(k*8+n) * 0.61)))
			B[k*8+n], bt[n*16+k] = v, v
		}
	}
	for i := range C {
		C[i] = float32(i%7) - 3
	}
	val := func(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }
	want := make([]float64, 128)
	for m := range 16 {
		for n := range 8 {
			sum := float64(C[m*8+n])
			for k := range 16 {
				sum += val(A[m*16+k]) * val(B[k*8+n])
			}
			want[m*8+n] = sum
		}
	}
	up16 := func(v []uint16) uintptr {
		p := s.buf((len(v) + 1) / 2)
		call(t, s.htod, p, uintptr(unsafe.Pointer(&v[0])), uintptr(2*len(v)), 0)
		return p
	}
	dA, dB, dBt, dC := up16(A), up16(B), up16(bt), s.buf(128)
	s.put(dC, C)
	D, frag := s.buf(128), s.buf(128)
	check := func(name string) {
		for i, u := range s.get(D, 128) {
			got := float64(math.Float32frombits(u))
			if math.Abs(got-want[i]) > 1e-5*(1+math.Abs(want[i])) {
				t.Fatalf("%s: D[%d][%d] = %v, want %v", name, i/8, i%8, got, want[i])
			}
		}
	}
	if r := s.run("mma_fragments", 1, 32, 0, uint64(D), uint64(dA), uint64(dBt), uint64(dC)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	check("fragments from global memory")
	if r := s.run("ldmatrix_mma", 1, 32, 0, uint64(D), uint64(frag), uint64(dA), uint64(dB), uint64(dC)); r != 0 {
		t.Fatalf("launch: %d", r)
	}
	check("ldmatrix from shared memory")
	regs := s.get(frag, 128)
	for lane := range 32 {
		g, tt := lane>>2, lane&3
		for i := range 4 {
			row, col := g+8*(i&1), 2*tt+8*(i>>1)
			if want := uint32(A[row*16+col]) | uint32(A[row*16+col+1])<<16; regs[4*lane+i] != want {
				t.Errorf("lane %d register %d = %08x, want A(%d,%d..%d) = %08x", lane, i, regs[4*lane+i], row, col, col+1, want)
			}
		}
	}
}
