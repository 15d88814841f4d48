package cuda

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/internal/cpusim"
)

// The kernels of kernels.cu on the CPU: a test of the kernels' logic, not
// of a GPU. g++ compiles kernels.cu with internal/cpusim's cuda_cpu.h (CUDA's
// thread and block indices, __shared__, __syncthreads, __shfl_xor_sync and
// atomicAdd mapped onto CPU fibers and threads) into a stand-in for
// libcuda, cuBLAS and NVRTC (internal/cpusim's sim.cpp), and the Device, its
// own Go code unchanged (launch shapes, argument slots, scratch buffers),
// runs on it. The GPU tests of gpu_test.go then compare every kernel with
// the CPU device, as they do on a GPU, and the edge shapes below add grid-
// stride loops, idle lanes, masked rows, c = 1 and c past a block, and
// bf16 rounding with NaN. The simulation runs a block's threads in order
// until each waits at a barrier, so a missing barrier shows; it does not
// model memory ordering between blocks, timing or float intrinsics' ulps.

// simLibEnv and simMutEnv pass a built library and a planted mutation to
// the child process of TestKernelMutantsFail.
const (
	simLibEnv = "HPCRUN_CPUSIM_LIB"
	simMutEnv = "HPCRUN_CPUSIM_MUT"
)

// buildSim compiles the simulation with kernelsCU as kernels.cu into dir
// and returns the library's path; it skips the test without g++ (fails
// where cpusim.RequireEnv is set).
func buildSim(t *testing.T, dir, kernelsCU string) string {
	t.Helper()
	lib, err := cpusim.Build(dir, kernelsCU)
	if errors.Is(err, cpusim.ErrNoCompiler) && os.Getenv(cpusim.RequireEnv) == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// openSim opens a Device on the simulation library at path, with planted
// mutation mut selected (0: none), and the library's handle.
func openSim(t *testing.T, path string, mut int) (*Device, uintptr) {
	t.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	l := &libs{}
	if err := l.bindDriver(h, path); err != nil {
		t.Fatal(err)
	}
	if err := l.blas.bind(h, path); err != nil {
		t.Fatal(err)
	}
	if err := l.nvrtc.bind(h, path); err != nil {
		t.Fatal(err)
	}
	setMut, err := purego.Dlsym(h, "hpcrun_sim_set_mut")
	if err != nil {
		t.Fatal(err)
	}
	call(setMut, uintptr(mut))
	d, err := openOn(l, 0, Options{CacheDir: "-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d, h
}

// kernelTests are the GPU tests that run every kernel, each comparing it
// with the CPU device.
var kernelTests = []struct {
	name string
	fn   func(*testing.T)
}{
	{"Elementwise", TestGPUElementwise}, {"Blocks", TestGPUBlocks}, {"Bias", TestGPUBias},
	{"Embedding", TestGPUEmbedding}, {"LayerNorm", TestGPULayerNorm}, {"Activations", TestGPUActivations}, {"Llama", TestGPULlama},
	{"Softmax", TestGPUSoftmax}, {"CrossEntropy", TestGPUCrossEntropy},
	{"AdamWAndSumSquares", TestGPUAdamWAndSumSquares}, {"Gemm", TestGPUGemm},
	{"GemmStridedBatched", TestGPUGemmStridedBatched}, {"Composites", TestGPUComposites},
	{"NormAndClipOnDevice", TestGPUNormAndClipOnDevice}, {"SumToAndFetch", TestGPUSumToAndFetch},
	{"KernelEdges", TestGPUKernelEdges}, {"BF16Rounding", TestGPUBF16Rounding}, {"BF16Packed", TestGPUBF16Packed},
	{"FusedAttention", TestGPUFusedAttention}, {"AdamWMany", TestGPUAdamWMany}, {"BF16Storage", TestGPUBF16Storage},
	{"BiasActivation", TestGPUBiasActivation}, {"AddNorm", TestGPUAddNorm}, {"ResidualBF16", TestGPUResidualBF16},
	{"ResidualGradBF16", TestGPUResidualGradBF16},
}

// TestKernelsOnCPU runs the kernel tests on the CUDA kernels compiled for
// the CPU (see above), then checks that every kernel of the table ran.
func TestKernelsOnCPU(t *testing.T) {
	lib := os.Getenv(simLibEnv)
	if lib == "" {
		lib = buildSim(t, t.TempDir(), kernelSource)
	}
	mut, _ := strconv.Atoi(os.Getenv(simMutEnv))
	d, h := openSim(t, lib, mut)
	simulated = d
	defer func() { simulated = nil }()
	for _, kt := range kernelTests {
		t.Run(kt.name, kt.fn)
	}
	if os.Getenv(simLibEnv) != "" {
		return // a mutant's run of some tests
	}
	// Again with each block's threads in an order drawn from a seed: a
	// race that thread order hides (a reader warp that runs after its
	// writer there) shows in some order.
	setSeed, err := purego.Dlsym(h, "hpcrun_sim_set_order_seed")
	if err != nil {
		t.Fatal(err)
	}
	call(setSeed, 7)
	for _, kt := range kernelTests {
		t.Run("seeded/"+kt.name, kt.fn)
	}
	call(setSeed, 0)
	// A watched device's wait on a stream that never drains gives up
	// after the watch's limit with its error, and works again after.
	setStuck, err := purego.Dlsym(h, "hpcrun_sim_set_stuck")
	if err != nil {
		t.Fatal(err)
	}
	w := &fakeWatch{limit: 50 * time.Millisecond}
	d.WatchWaits(w)
	call(setStuck, 1)
	err = d.Sync()
	call(setStuck, 0)
	if err == nil || !strings.Contains(err.Error(), "for rank 1") || w.stalled.Load() != 1 {
		t.Errorf("Sync on a stream that never drains: %v (stalled %d times)", err, w.stalled.Load())
	}
	if err := d.Sync(); err != nil || w.drained.Load() != 1 {
		t.Errorf("Sync after: %v (drained %d times)", err, w.drained.Load())
	}
	d.WatchWaits(nil)

	// Open refuses kernels the driver says cannot run their largest
	// launch (registers, as CUDA 13's CUBIN may not say in its ELF notes).
	setMax, err := purego.Dlsym(h, "hpcrun_sim_set_max_threads")
	if err != nil {
		t.Fatal(err)
	}
	call(setMax, 512)
	_, err = openOn(d.l, 0, Options{CacheDir: "-"})
	call(setMax, 1024)
	if err == nil || !strings.Contains(err.Error(), "runs at most 512 threads a block (64 registers a thread), but it is launched with up to 1024") {
		t.Errorf("Open where kernels run at most 512 threads: %v", err)
	}
	launches, err := purego.Dlsym(h, "hpcrun_sim_launches")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kernels {
		name := cstr(k.name)
		r, _, _ := purego.SyscallN(launches, uintptr(unsafe.Pointer(&name[0])))
		if n := int64(r); n <= 0 {
			t.Errorf("kernel %s never ran (%d launches)", k.name, n)
		}
	}
}

// A mutation planted in kernels.cu: the text old, which must occur once,
// becomes new, where new reads hpcrun_mut (the mutant's number) so that
// one build holds every mutant; tests are the kernel tests that must fail,
// in the thread order seed draws (a missing barrier between warps shows
// only when one warp runs ahead).
type mutation struct {
	what     string
	old, new string
	tests    string
	seed     int // the order of a block's threads the tests run in (HPCRUN_CPUSIM_SEED; 0: thread order)
}

var mutations = []mutation{
	{"block_sum without its second __syncthreads (a warp reads sh[] before another wrote it)",
		"if (lane == 0) sh[w] = v;\n    __syncthreads();\n    v = lane < nw ? sh[lane] : 0.f;",
		"if (lane == 0) sh[w] = v;\n    if (hpcrun_mut != 1) __syncthreads();\n    v = lane < nw ? sh[lane] : 0.f;",
		"LayerNorm|KernelEdges", 0},
	{"bias_backward without its __syncthreads",
		"sh[threadIdx.y][threadIdx.x] = s;\n    __syncthreads();",
		"sh[threadIdx.y][threadIdx.x] = s;\n    if (hpcrun_mut != 2) __syncthreads();",
		"Bias|KernelEdges", 0},
	{"softmax's causal mask off by one (a query does not see its own key)",
		"long long e = r % tq + 1 + tk - tq;",
		"long long e = r % tq + (hpcrun_mut == 3 ? 0 : 1) + tk - tq;",
		"Softmax|KernelEdges", 0},
	{"ce_target_logit's slice test off by one (j <= v reads the next row)",
		"out[i] = (t >= 0 && j >= 0 && j < v) ?",
		"out[i] = (t >= 0 && j >= 0 && (hpcrun_mut == 4 ? j <= v : j < v)) ?",
		"KernelEdges", 0},
	{"warp_sum one shuffle short (lanes 16 apart never added)",
		"__device__ __forceinline__ float warp_sum(float v) {\n    for (int o = 16; o > 0; o >>= 1)",
		"__device__ __forceinline__ float warp_sum(float v) {\n    for (int o = hpcrun_mut == 5 ? 8 : 16; o > 0; o >>= 1)",
		"LayerNorm|Softmax|CrossEntropy", 0},
	{"f32_to_bf16 without the quiet bit (a signalling NaN becomes infinity)",
		"return (bf16_t)((u >> 16) | 0x40u);",
		"return (bf16_t)((u >> 16) | (hpcrun_mut == 6 ? 0u : 0x40u));",
		"BF16Rounding", 0},
	{"rope_f32 without the sign (the backward turns forward again)",
		"c = t[j], s = sign * t[j + half];",
		"c = t[j], s = (hpcrun_mut == 7 ? 1.f : sign) * t[j + half];",
		"Llama", 0},
	{"swiglu_backward without silu's second term (d silu/dg taken as sigmoid)",
		"store_out(dg, load_in(dg) + d * u * s * (1.f + g * (1.f - s)));",
		"store_out(dg, load_in(dg) + d * u * s * (hpcrun_mut == 8 ? 1.f : 1.f + g * (1.f - s)));",
		"Llama", 0},
	{"f32_to_bf16 packing every matrix of a batch from the first",
		"const float* src = in + b * stride + i * ld;",
		"const float* src = in + (hpcrun_mut == 9 ? 0 : b) * stride + i * ld;",
		"BF16Packed", 0},
	{"f32_to_bf16 converting one block's columns of a row",
		"for (long long j = threadIdx.x; j < cols; j += blockDim.x) dst[j]",
		"for (long long j = threadIdx.x; j < cols; j += (hpcrun_mut == 10 ? cols : blockDim.x)) dst[j]",
		"BF16Packed", 0},
	{"f32_to_bf16 converting only the matrices of the grid's first pass in y",
		"for (long long b = blockIdx.y; b < batch; b += gridDim.y)",
		"for (long long b = blockIdx.y; b < batch; b += (hpcrun_mut == 11 ? batch : gridDim.y))",
		"BF16Packed", 0},
	{"tanh_backward with 1 - y for 1 - y^2",
		"return 1.f - y * y;",
		"return 1.f - (hpcrun_mut == 12 ? 1.f : y) * y;",
		"Activations", 0},
	{"the fused forward without the online softmax's rescale of its output",
		"o[dn][2 * r] *= corr;\n                o[dn][2 * r + 1] *= corr;",
		"if (hpcrun_mut != 13) {\n                o[dn][2 * r] *= corr;\n                o[dn][2 * r + 1] *= corr;\n                }",
		"FusedAttention", 0},
	{"the fused forward writing a lane's columns to its neighbour's (a wrong lane map)",
		"h * HD + 2 * tq;",
		"h * HD + 2 * (hpcrun_mut == 14 ? tq ^ 1 : tq);",
		"FusedAttention", 0},
	{"the fused kernels' key bound off by one (the zero row past the last key is seen)",
		"return i < T && j < T &&",
		"return i < T && (hpcrun_mut == 15 ? j <= T : j < T) &&",
		"FusedAttention", 0},
	{"the fused forward without the barrier before it stages the next key tile",
		"fa_accumulate<HD>(o, s, sv);\n        __syncthreads();",
		"fa_accumulate<HD>(o, s, sv);\n        if (hpcrun_mut != 16) __syncthreads();",
		"FusedAttention", 7},
	{"the fused dK/dV walk starting a tile past the diagonal",
		"for (int i0 = causal ? j0 : 0; i0 < T; i0 += FA_ROWS)",
		"for (int i0 = causal ? j0 + (hpcrun_mut == 17 ? FA_ROWS : 0) : 0; i0 < T; i0 += FA_ROWS)",
		"FusedAttention", 0},
	{"bias_backward's chunks each summing every row from theirs on (rows counted twice)",
		"r < rows; r += (long long)gridDim.y * blockDim.y)",
		"r < rows; r += (hpcrun_mut == 18 ? 1 : gridDim.y) * (long long)blockDim.y)",
		"Bias|KernelEdges", 0},
	{"a tensor table's search one tensor late (a block updates its successor)",
		"if (table[9 * mid + 5] <= b) lo = mid;",
		"if (hpcrun_mut == 19 ? table[9 * mid + 5] < b : table[9 * mid + 5] <= b) lo = mid;",
		"AdamWMany|AdamWAndSumSquares", 0},
	{"the in-place cross-entropy gradient written past cols (over a padded head's masked logits)",
		"for (int j = threadIdx.x; j < cols; j += blockDim.x) {\n            float g",
		"for (int j = threadIdx.x; j < (hpcrun_mut == 20 ? v : cols); j += blockDim.x) {\n            float g",
		"CrossEntropy|KernelEdges", 0},
	{"the in-place cross-entropy gradient leaving rows without a target as logits",
		"for (int j = threadIdx.x; j < cols; j += blockDim.x) store_out(x + j, 0.f);",
		"for (int j = threadIdx.x; j < cols; j += blockDim.x) store_out(x + j, hpcrun_mut == 21 ? load_in(x + j) : 0.f);",
		"CrossEntropy|KernelEdges", 0},
	{"the fused cross-entropy's loss without the target logit",
		"float tl = (t >= 0 && t < v) ? load_in(x + t) : 0.f;",
		"float tl = (t >= 0 && t < v && hpcrun_mut != 22) ? load_in(x + t) : 0.f;",
		"CrossEntropy", 0},
	{"the fused bias and activation taking f of the sum before pre's rounding",
		"store_out(out + i, F(load_in(pre + i)));",
		"store_out(out + i, F(hpcrun_mut == 23 ? v : load_in(pre + i)));",
		"BiasActivation", 0},
	{"the activation's backward in place accumulating into its gradient",
		"GRID_STRIDE(i, n) store_out(dout + i, Grad(load_in(inp + i)) * load_in(dout + i));",
		"GRID_STRIDE(i, n) store_out(dout + i, (hpcrun_mut == 24 ? load_in(dout + i) : 0.f) + Grad(load_in(inp + i)) * load_in(dout + i));",
		"BiasActivation", 0},
	{"the residual add fused into a norm normalising the row before the add",
		"            layernorm_row(out + i * c, mean, rstd, sum + i * c, weight, bias, i, c, eps, sh);",
		"            if (hpcrun_mut == 25) layernorm_row(out + i * c, mean, rstd, inp + i * c, weight, bias, i, c, eps, sh);\n            else layernorm_row(out + i * c, mean, rstd, sum + i * c, weight, bias, i, c, eps, sh);",
		"AddNorm", 0},
}

// Each planted mutation makes the kernel tests fail: one build of every
// mutant, then a child test process per mutant on it, which must fail
// (and, with no mutant selected, pass: the instrumented source is sound).
func TestKernelMutantsFail(t *testing.T) {
	if os.Getenv(simLibEnv) != "" {
		t.Skip("a child process")
	}
	src := kernelSource
	for _, m := range mutations {
		if n := strings.Count(src, m.old); n != 1 {
			t.Fatalf("mutation %q: its text occurs %d times in kernels.cu", m.what, n)
		}
		src = strings.Replace(src, m.old, m.new, 1)
	}
	lib := buildSim(t, t.TempDir(), "extern \"C\" int hpcrun_mut;\n"+src)
	run := func(mut int, tests string, seed int) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestKernelsOnCPU$/^("+tests+")$", "-test.count=1")
		cmd.Env = append(os.Environ(), simLibEnv+"="+lib, simMutEnv+"="+strconv.Itoa(mut), "HPCRUN_CPUSIM_SEED="+strconv.Itoa(seed))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(0, "LayerNorm|Bias|BiasActivation|AddNorm|ResidualBF16|Softmax|CrossEntropy|KernelEdges|BF16Rounding|BF16Packed|Llama|Activations|FusedAttention|AdamWMany|AdamWAndSumSquares", 0); err != nil {
		t.Fatalf("the instrumented kernels fail with no mutation: %v\n%s", err, out)
	}
	failLine := regexp.MustCompile(`--- FAIL: TestKernelsOnCPU/\w+`)
	for i, m := range mutations {
		out, err := run(i+1, m.tests, m.seed)
		if err == nil {
			t.Errorf("mutant %d, %s: the kernel tests pass", i+1, m.what)
			continue
		}
		t.Logf("mutant %d, %s: caught by %s", i+1, m.what, strings.Join(failLine.FindAllString(out, -1), ", "))
	}
}

// bf16Reference rounds f to bfloat16 to nearest, ties to even, by
// arithmetic on the value (not the bit trick of the kernel); NaN stays a
// NaN of the same sign.
func bf16Reference(f float32) uint16 {
	if f != f {
		return uint16(math.Float32bits(f)>>16) | 0x7fc0
	}
	u := math.Float32bits(f)
	lo := math.Float32frombits(u & 0xffff0000) // toward zero
	if lo == f || math.IsInf(float64(f), 0) {
		return uint16(u >> 16)
	}
	// The next bfloat16 away from zero, 2^128 past the largest (it
	// rounds to infinity).
	ulp := math.Ldexp(1, max(int(u>>23&0xff), 1)-127-7)
	a, hi := math.Abs(float64(f)), math.Abs(float64(lo))+ulp
	dl, dh := a-math.Abs(float64(lo)), hi-a
	if dl < dh || dl == dh && (u>>16)&1 == 0 {
		return uint16(u >> 16)
	}
	return uint16((u&0xffff0000 + 0x10000) >> 16)
}

// The bf16 conversion of the GEMM operands rounds to nearest even, turns
// the largest floats into infinity, keeps infinities and zeros' signs, and
// keeps every NaN a NaN (a signalling one included).
func TestGPUBF16Rounding(t *testing.T) {
	d := gpu(t)
	bits := []uint32{0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f80ffff, 0x7f7fffff, 0xff7fffff,
		0x7f7f7fff, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x7f800000, 0xff800000,
		0x7fc00000, 0x7f800001, 0xff800001, 0xffff0001, 0x7fbfffff, 0xc0490fdb}
	src := make([]float32, len(bits))
	for i, b := range bits {
		src[i] = math.Float32frombits(b)
	}
	x, err := d.Alloc(len(src))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(x)
	d.CopyFromHost(x, src)
	got, _ := convertBF16(t, d, len(src), func(s *scratch) (uintptr, bool) {
		return d.toBF16(s, x.Ptr(), 1, len(src), len(src), 0, 1)
	})
	for i, f := range src {
		want := bf16Reference(f)
		isNaN := func(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }
		if f != f {
			if !isNaN(got[i]) || got[i]>>15 != want>>15 {
				t.Errorf("%08x (NaN) -> %04x, want a NaN of the same sign", bits[i], got[i])
			}
			continue
		}
		if got[i] != want {
			t.Errorf("%08x (%g) -> %04x, want %04x", bits[i], f, got[i], want)
		}
	}
}
