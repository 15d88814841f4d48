package train

import (
	"math"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// Tolerances of the GPU-vs-CPU loss curves, from arithmetic. The device
// opens in FP32 matmul precision (CUBLAS_COMPUTE_32F: no TF32, whose
// 10-bit mantissas would perturb each product by about 1e-3 and need
// another bound), so the GPU differs from the CPU by order: cuBLAS adds a
// GEMM's k products in another order than the CPU (tiles, split-k), and
// the CUDA kernels reduce rows as trees. Each order is exact to float32
// rounding (about 6e-8 relative) in one step, but training amplifies the
// difference over its steps. What it grows to is measured here, on the
// CPU: the same run with every GEMM's k sum split in two halves (the
// second half added to the first's rounded result, as a split-k GEMM
// does) against the plain CPU run. The GPU curve may differ from the CPU's
// by reorderFactor times that spread: the GPU reorders more sums (every
// GEMM, every row reduction, in its own tree), each contributing a spread
// of the same size, and the sum of a few such independent perturbations
// stays within a small multiple. (Measured on the GPT of the GPU layout
// tests: 7e-9 with k in 2 parts, 7e-9 in 3, 8e-9 in 8; the loss, a mean
// over many tokens, averages most of the rounding away.)
const reorderFactor = 10

// floorTol is the least tolerance: a run whose reordering changes nothing
// measurable still allows a few float32 roundings of the loss.
const floorTol = 1e-6

// curveTolerance is the relative tolerance of cfg's GPU loss curve against
// want, the CPU's: reorderFactor times the largest relative difference of
// the reordered CPU runs from want (k split in 2 and in 3 parts: one
// reordering's spread is a sample, which another order may pass by a few
// times at bf16, where a last-bit difference flips a rounding), at least
// floorTol.
func curveTolerance(t *testing.T, cfg config.Config, ds *data.Data, want []float64) float64 {
	t.Helper()
	spread := 0.0
	for _, parts := range []int{2, 3} {
		dir := t.TempDir()
		res, err := runRanks(t, cfg, ds, func(int) Options { return Options{Device: splitCPU(parts), RunDir: dir} })
		if err != nil {
			t.Fatal(err)
		}
		spread = math.Max(spread, maxRelDiff(res[0].Losses, want))
	}
	tol := math.Max(reorderFactor*spread, floorTol)
	t.Logf("CPU-vs-CPU spread with the GEMM sums reordered over %d steps: %.2g; GPU tolerance %d x that: %.2g", len(want), spread, reorderFactor, tol)
	return tol
}

// splitCPU is a CPU device whose GEMMs add their k products in parts.
func splitCPU(parts int) *tensor.CPUDevice {
	d := tensor.NewCPU()
	d.SplitGemmK(parts)
	return d
}

func maxRelDiff(got, want []float64) float64 {
	worst := 0.0
	for i := range want {
		worst = math.Max(worst, math.Abs(got[i]-want[i])/math.Abs(want[i]))
	}
	return worst
}

// The reordered GEMM gives the same products to float32 rounding (so it
// is a reordering, not another computation), and the spread it causes
// over 10 AdamW steps of the GPU layout tests' GPT is what the GPU
// tolerances are built on: it is measured, positive (the reordering
// changes the rounding) and small.
func TestReorderSpread(t *testing.T) {
	cpu, r := tensor.NewCPU(), splitCPU(2)
	for _, c := range []struct {
		transA, transB bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		const m, n, k = 5, 7, 33
		fill := func(d *tensor.CPUDevice, f func(int) float64, n int) *tensor.Tensor {
			x, _ := d.Alloc(n)
			for i := range x.Host() {
				x.Host()[i] = float32(f(i))
			}
			return x
		}
		sin, cos, idx := func(i int) float64 { return math.Sin(float64(i)) }, func(i int) float64 { return math.Cos(float64(3 * i)) }, func(i int) float64 { return float64(i) }
		a1, b1, c1 := fill(cpu, sin, k*k), fill(cpu, cos, k*k), fill(cpu, idx, m*n)
		a2, b2, c2 := fill(r, sin, k*k), fill(r, cos, k*k), fill(r, idx, m*n)
		cpu.Gemm(c.transA, c.transB, m, n, k, 0.5, a1, 1, k, b1, 2, k, 0.25, c1, 0, n)
		r.Gemm(c.transA, c.transB, m, n, k, 0.5, a2, 1, k, b2, 2, k, 0.25, c2, 0, n)
		for i := range c1.Host() {
			if d := math.Abs(float64(c1.Host()[i] - c2.Host()[i])); d > 1e-5*math.Max(1, math.Abs(float64(c1.Host()[i]))) {
				t.Fatalf("transA %v transB %v: element %d: %g split, %g whole", c.transA, c.transB, i, c2.Host()[i], c1.Host()[i])
			}
		}
	}

	cfg := smallConfig("gpt")
	cfg.Data = textFile(t)
	cfg.Layers, cfg.Steps, cfg.CkptEvery, cfg.BatchSize = 4, 10, -1, 4
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := runRanks(t, cfg, ds, func(int) Options { return Options{Device: tensor.NewCPU()} })
	if err != nil {
		t.Fatal(err)
	}
	tol := curveTolerance(t, cfg, ds, want[0].Losses)
	if tol > 1e-3 {
		t.Errorf("reordering the GEMM sums moves 10 steps' losses by %.2g relative: the curve is too sensitive to compare", tol/reorderFactor)
	}
}
