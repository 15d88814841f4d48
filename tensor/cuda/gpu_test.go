package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/hpcrun/hpcrun/tensor"
)

// GPU tests: every kernel against the CPU device on the same random data.
// They skip, saying why, where CUDA does not load. Tolerances: relative to
// the largest magnitude of the CPU result, 1e-4 for float32 kernels, 1e-2
// for bf16 GEMM, 5e-3 for TF32.

var shared struct {
	once sync.Once
	d    *Device
	err  error
}

// simulated, while TestKernelsOnCPU runs, is the device the kernel tests
// use: the CUDA kernels compiled for the CPU (kernels_cpu_test.go).
var simulated *Device

// gpu returns the device shared by the kernel tests (its kernels from the
// default cache, compiled on first use), or the simulated one.
func gpu(t testing.TB) *Device {
	t.Helper()
	if simulated != nil {
		simulated.SetMatmulPrecision(tensor.FP32)
		return simulated
	}
	if ok, why := Available(); !ok {
		t.Skip("no CUDA here: " + why)
	}
	shared.once.Do(func() { shared.d, shared.err = Open(0) })
	if shared.err != nil {
		t.Fatalf("CUDA is available but Open fails: %v", shared.err)
	}
	shared.d.SetMatmulPrecision(tensor.FP32)
	return shared.d
}

// twin is one tensor on both devices, with the same contents.
type twin struct {
	name string
	c, g *tensor.Tensor
}

type bench struct {
	t   *testing.T
	cpu *tensor.CPUDevice
	gpu *Device
	r   *rand.Rand
	all []twin
}

func newBench(t *testing.T) *bench {
	d := gpu(t)
	b := &bench{t: t, cpu: tensor.NewCPU(), gpu: d, r: rand.New(rand.NewPCG(7, 11))}
	t.Cleanup(func() {
		for _, x := range b.all {
			d.Free(x.g)
		}
		if err := d.Sync(); err != nil {
			t.Errorf("Sync at the end: %v", err)
		}
	})
	return b
}

// rand makes a twin with elements uniform in [-scale, scale).
func (b *bench) rand(name string, scale float32, shape ...int) twin {
	c, err := b.cpu.Alloc(shape...)
	if err != nil {
		b.t.Fatal(err)
	}
	for i := range c.Host() {
		c.Host()[i] = (2*b.r.Float32() - 1) * scale
	}
	g, err := b.gpu.Alloc(shape...)
	if err != nil {
		b.t.Fatal(err)
	}
	b.gpu.CopyFromHost(g, c.Host())
	x := twin{name, c, g}
	b.all = append(b.all, x)
	return x
}

// bf16 makes a zeroed bfloat16 tensor on the GPU, freed when the test
// ends.
func (b *bench) bf16(shape ...int) *tensor.Tensor {
	x, err := b.gpu.AllocAs(tensor.BFloat16, shape...)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { b.gpu.Free(x) })
	return x
}

func (b *bench) zeros(name string, shape ...int) twin {
	x := b.rand(name, 0, shape...)
	return x
}

// check compares each twin's GPU contents with its CPU contents.
func (b *bench) check(what string, tol float64, xs ...twin) {
	b.t.Helper()
	if err := b.gpu.Sync(); err != nil {
		b.t.Fatalf("%s: Sync: %v", what, err)
	}
	for _, x := range xs {
		got := make([]float32, x.g.Len())
		b.gpu.CopyToHost(got, x.g)
		if e, at := relErr(got, x.c.Host()); e > tol || math.IsNaN(e) {
			b.t.Errorf("%s: %s differs from the CPU by %.3g (tolerance %.0g) at %d: gpu %g, cpu %g", what, x.name, e, tol, at, got[at], x.c.Host()[at])
		}
	}
}

// relErr is max|got-want| / max|want| (absolute when want is all zeros)
// and where the largest difference is; NaN where only one of them is NaN.
func relErr(got, want []float32) (float64, int) {
	var maxDiff, maxRef float64
	at := 0
	for i := range want {
		if math.IsNaN(float64(got[i])) != math.IsNaN(float64(want[i])) {
			return math.NaN(), i
		}
		if math.IsNaN(float64(want[i])) {
			continue // a NaN where the CPU has one
		}
		diff := math.Abs(float64(got[i]) - float64(want[i]))
		if diff > maxDiff {
			maxDiff, at = diff, i
		}
		maxRef = math.Max(maxRef, math.Abs(float64(want[i])))
	}
	if maxRef == 0 {
		return maxDiff, at
	}
	return maxDiff / maxRef, at
}

func ids(r *rand.Rand, n, lo, hi int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(lo + r.IntN(hi-lo))
	}
	return s
}

const tol32 = 1e-4

func TestGPUElementwise(t *testing.T) {
	b := newBench(t)
	for _, n := range []int{1, 1000, 1 << 20, 3*(1<<20) + 17} {
		x, y, z := b.rand("x", 1, n), b.rand("y", 1, n), b.rand("out", 1, n)
		b.cpu.Add(z.c, x.c, y.c)
		b.gpu.Add(z.g, x.g, y.g)
		b.check("Add", tol32, z)
		b.cpu.Add(x.c, x.c, y.c) // in place
		b.gpu.Add(x.g, x.g, y.g)
		b.check("Add in place", tol32, x)
		b.cpu.Axpy(y.c, -0.75, x.c)
		b.gpu.Axpy(y.g, -0.75, x.g)
		b.check("Axpy", tol32, y)
		b.cpu.Scale(y.c, 3)
		b.gpu.Scale(y.g, 3)
		b.check("Scale", tol32, y)
		b.cpu.Fill(x.c, 2.5)
		b.gpu.Fill(x.g, 2.5)
		b.check("Fill", 0, x)
		b.cpu.Zero(y.c)
		b.gpu.Zero(y.g)
		b.check("Zero", 0, y)
		b.cpu.Copy(x.c, z.c)
		b.gpu.Copy(x.g, z.g)
		b.check("Copy", 0, x)
	}
}

func TestGPUBlocks(t *testing.T) {
	b := newBench(t)
	src, dst := b.rand("src", 1, 50, 70), b.rand("dst", 1, 40, 90)
	b.cpu.Copy2D(dst.c, 5, 90, src.c, 3, 70, 30, 60)
	b.gpu.Copy2D(dst.g, 5, 90, src.g, 3, 70, 30, 60)
	b.check("Copy2D", 0, dst)
	b.cpu.Axpy2D(dst.c, 17, 90, -2, src.c, 1, 70, 39, 61)
	b.gpu.Axpy2D(dst.g, 17, 90, -2, src.g, 1, 70, 39, 61)
	b.check("Axpy2D", tol32, dst)
}

func TestGPUBias(t *testing.T) {
	b := newBench(t)
	for _, s := range [][2]int{{300, 70}, {8 * 64, 768}, {5, 3072}} {
		out, bias := b.rand("out", 1, s[0], s[1]), b.rand("bias", 1, s[1])
		b.cpu.AddBias(out.c, bias.c)
		b.gpu.AddBias(out.g, bias.g)
		b.check("AddBias", tol32, out)
		dbias := b.rand("dbias", 1, s[1]) // accumulates
		b.cpu.BiasBackward(dbias.c, out.c)
		b.gpu.BiasBackward(dbias.g, out.g)
		b.check("BiasBackward", tol32, dbias)
	}
}

func TestGPUEmbedding(t *testing.T) {
	b := newBench(t)
	const n, c, v, start = 257, 96, 50, 100
	table, out := b.rand("table", 1, v, c), b.rand("out", 1, n, c)
	id := ids(b.r, n, start-20, start+v+20) // some outside the slice, many repeated
	b.cpu.EmbeddingForward(out.c, id, table.c, start)
	b.gpu.EmbeddingForward(out.g, id, table.g, start)
	b.check("EmbeddingForward", 0, out)
	dtable, dout := b.rand("dtable", 1, v, c), b.rand("dout", 1, n, c)
	b.cpu.EmbeddingBackward(dtable.c, dout.c, id, start)
	b.gpu.EmbeddingBackward(dtable.g, dout.g, id, start)
	b.check("EmbeddingBackward", tol32, dtable)
}

func TestGPULayerNorm(t *testing.T) {
	b := newBench(t)
	for _, s := range [][2]int{{37, 100}, {4 * 64, 768}, {3, 1600}, {2000, 32}} {
		n, c := s[0], s[1]
		inp, w, bias := b.rand("inp", 3, n, c), b.rand("weight", 1, c), b.rand("bias", 1, c)
		out, mean, rstd := b.zeros("out", n, c), b.zeros("mean", n), b.zeros("rstd", n)
		b.cpu.LayerNormForward(out.c, mean.c, rstd.c, inp.c, w.c, bias.c, 1e-5)
		b.gpu.LayerNormForward(out.g, mean.g, rstd.g, inp.g, w.g, bias.g, 1e-5)
		b.check("LayerNormForward", tol32, out, mean, rstd)
		dinp, dw, db, dout := b.rand("dinp", 1, n, c), b.rand("dweight", 1, c), b.rand("dbias", 1, c), b.rand("dout", 1, n, c)
		b.cpu.LayerNormBackward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c)
		b.gpu.LayerNormBackward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g)
		b.check("LayerNormBackward", tol32, dinp, dw, db)
	}
}

// The Llama kernels: RMSNorm over rows short and long (c past a block),
// rotary embeddings with every head or some of a group turned, SwiGLU with
// exp's overflow on both sides.
func TestGPULlama(t *testing.T) {
	b := newBench(t)
	for _, s := range [][2]int{{37, 100}, {3, 1}, {5, 33}, {3, 2*maxRowThreads + 5}, {2000, 32}} {
		n, c := s[0], s[1]
		inp, w := b.rand("inp", 3, n, c), b.rand("weight", 1, c)
		out, rstd := b.zeros("out", n, c), b.zeros("rstd", n)
		b.cpu.RMSNormForward(out.c, rstd.c, inp.c, w.c, 1e-6)
		b.gpu.RMSNormForward(out.g, rstd.g, inp.g, w.g, 1e-6)
		b.check("RMSNormForward", tol32, out, rstd)
		dinp, dw, dout := b.rand("dinp", 1, n, c), b.rand("dweight", 1, c), b.rand("dout", 1, n, c)
		b.cpu.RMSNormBackward(dinp.c, dw.c, dout.c, inp.c, w.c, rstd.c)
		b.gpu.RMSNormBackward(dinp.g, dw.g, dout.g, inp.g, w.g, rstd.g)
		b.check("RMSNormBackward", tol32, dinp, dw)

		gate := b.rand("gate_up", 40, n, 2*c)
		act := b.zeros("act", n, c)
		b.cpu.SwiGLUForward(act.c, gate.c)
		b.gpu.SwiGLUForward(act.g, gate.g)
		b.check("SwiGLUForward", tol32, act)
		dgate := b.rand("dgate_up", 1, n, 2*c)
		b.cpu.SwiGLUBackward(dgate.c, gate.c, dout.c)
		b.gpu.SwiGLUBackward(dgate.g, gate.g, dout.g)
		b.check("SwiGLUBackward", tol32, dgate)
	}
	for _, r := range []struct{ rows, seq, heads, hd, period, rotated int }{
		{12, 6, 4, 8, 1, 1}, {14, 7, 9, 16, 3, 2}, {4, 4, 2, 64, 2, 0}, {5 * (b.gpu.sms*32*elemThreads/16/5 + 1), 5, 2, 16, 1, 1}, // past one grid-stride round
	} {
		table := b.rand("table", 1, r.seq, r.hd)
		x := b.rand("x", 2, r.rows, r.heads*r.hd)
		b.cpu.RoPEForward(x.c, table.c, r.seq, r.period, r.rotated)
		b.gpu.RoPEForward(x.g, table.g, r.seq, r.period, r.rotated)
		b.check(fmt.Sprintf("RoPEForward %+v", r), tol32, x)
		b.cpu.RoPEBackward(x.c, table.c, r.seq, r.period, r.rotated)
		b.gpu.RoPEBackward(x.g, table.g, r.seq, r.period, r.rotated)
		b.check(fmt.Sprintf("RoPEBackward %+v", r), tol32, x)
	}
}

// The activations on lengths of one element, not a multiple of a block
// and past one grid-stride round; GELU at exp's overflow on both sides,
// tanh where it saturates, at signed zeros, infinities and NaN.
func TestGPUActivations(t *testing.T) {
	b := newBench(t)
	edges := []float32{float32(math.NaN()), 100, -100, 9, -9, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1)), 1e-30}
	for _, f := range []tensor.Activation{tensor.GELU, tensor.Tanh} {
		for _, n := range []int{1, 10007, b.gpu.sms*32*elemThreads + 17} {
			for _, scale := range []float32{3, 40} { // 40 reaches exp's overflow on both sides
				what := fmt.Sprintf("activation %d, n %d, scale %g", f, n, scale)
				inp, out := b.rand("inp", scale, n), b.zeros("out", n)
				if f == tensor.Tanh && n > 1 {
					copy(inp.c.Host()[n/2:], edges)
					b.gpu.CopyFromHost(inp.g, inp.c.Host())
				}
				b.cpu.ActivationForward(f, out.c, inp.c)
				b.gpu.ActivationForward(f, out.g, inp.g)
				b.check("ActivationForward "+what, tol32, out)
				dinp, dout := b.rand("dinp", 1, n), b.rand("dout", 1, n)
				b.cpu.ActivationBackward(f, dinp.c, inp.c, dout.c)
				b.gpu.ActivationBackward(f, dinp.g, inp.g, dout.g)
				b.check("ActivationBackward "+what, tol32, dinp)
				b.cpu.ActivationForward(f, inp.c, inp.c)
				b.gpu.ActivationForward(f, inp.g, inp.g)
				b.check("ActivationForward in place "+what, tol32, inp)
			}
		}
	}
}

// The fused bias and activation, with pre and out in every dtype, and the
// activation's backward in place: against the CPU's, and on the GPU
// against its own unfused kernels to the bit (add_bias then the
// activation; the backward into zeros); rows of one column, of a width
// that is not a multiple of a block, and past one grid-stride round.
func TestGPUBiasActivation(t *testing.T) {
	b := newBench(t)
	d := b.gpu
	var made []*tensor.Tensor
	alloc := func(dev tensor.Device, dt tensor.DType, shape ...int) *tensor.Tensor {
		x, err := dev.AllocAs(dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		if dev == tensor.Device(d) {
			made = append(made, x)
		}
		return x
	}
	defer func() {
		for _, x := range made {
			d.Free(x)
		}
	}()
	// near compares a GPU tensor with the CPU's, both read as float32.
	near := func(what string, tol float64, g, c *tensor.Tensor) {
		t.Helper()
		gh, ch := make([]float32, g.Len()), make([]float32, c.Len())
		d.CopyToHost(gh, g)
		b.cpu.CopyToHost(ch, c)
		if e, at := relErr(gh, ch); e > tol || math.IsNaN(e) {
			t.Errorf("%s differs from the CPU by %.3g (tolerance %.0g) at %d: gpu %g, cpu %g", what, e, tol, at, gh[at], ch[at])
		}
	}
	for _, sh := range []struct{ rows, oc int }{{1, 1}, {13, 771}, {d.sms*32*elemThreads/64 + 3, 64}} {
		bias := b.rand("bias", 1, sh.oc)
		for _, f := range []tensor.Activation{tensor.GELU, tensor.Tanh} {
			for _, dts := range [][2]tensor.DType{{tensor.Float32, tensor.Float32}, {tensor.BFloat16, tensor.Float32}, {tensor.Float32, tensor.BFloat16}, {tensor.BFloat16, tensor.BFloat16}} {
				what := fmt.Sprintf("%dx%d activation %d pre %v out %v", sh.rows, sh.oc, f, dts[0], dts[1])
				tol := tol32
				if dts[1] == tensor.BFloat16 {
					tol = 1.0 / 128 // a value a last bit apart may round a bfloat16 apart
				}
				x := b.rand("x", 3, sh.rows, sh.oc)
				preC, outC := alloc(b.cpu, dts[0], sh.rows, sh.oc), alloc(b.cpu, dts[1], sh.rows, sh.oc)
				preG, outG := alloc(d, dts[0], sh.rows, sh.oc), alloc(d, dts[1], sh.rows, sh.oc)
				pre2, out2 := alloc(d, dts[0], sh.rows, sh.oc), alloc(d, dts[1], sh.rows, sh.oc)
				b.cpu.Copy(preC, x.c)
				d.Copy(preG, x.g)
				d.Copy(pre2, x.g)
				b.cpu.BiasActivationForward(f, outC, preC, bias.c)
				d.BiasActivationForward(f, outG, preG, bias.g)
				d.AddBias(pre2, bias.g)
				d.ActivationForward(f, out2, pre2)
				near("BiasActivationForward pre "+what, 0, preG, preC)
				near("BiasActivationForward out "+what, tol, outG, outC)
				sameGPUBits(t, d, "BiasActivationForward pre "+what+" (want AddBias's)", preG, pre2)
				sameGPUBits(t, d, "BiasActivationForward out "+what+" (want the activation's)", outG, out2)

				dout, dz := b.rand("dout", 1, sh.rows, sh.oc), b.zeros("dz", sh.rows, sh.oc)
				d.Zero(dz.g)
				d.ActivationBackward(f, dz.g, preG, dout.g)
				b.cpu.ActivationBackwardInPlace(f, dout.c, preC)
				d.ActivationBackwardInPlace(f, dout.g, preG)
				b.check("ActivationBackwardInPlace "+what, tol32, dout)
				sameGPUBits(t, d, "ActivationBackwardInPlace "+what+" (want ActivationBackward into zeros)", dout.g, dz.g)

				// A bfloat16 gradient in place: the float32 kernel's result
				// on the widened gradient, rounded (the CPU's, and the
				// GPU's own float32 kernel's bits); its column sums as
				// the widened gradient's.
				g := b.rand("dout", 1, sh.rows, sh.oc)
				ghC, ghG := alloc(b.cpu, tensor.BFloat16, sh.rows, sh.oc), alloc(d, tensor.BFloat16, sh.rows, sh.oc)
				b.cpu.Copy(ghC, g.c)
				d.Copy(ghG, g.g)
				wide, back := alloc(d, tensor.Float32, sh.rows, sh.oc), alloc(d, tensor.BFloat16, sh.rows, sh.oc)
				d.Copy(wide, ghG)
				b.cpu.ActivationBackwardInPlace(f, ghC, preC)
				d.ActivationBackwardInPlace(f, ghG, preG)
				d.ActivationBackwardInPlace(f, wide, preG)
				d.Copy(back, wide)
				near("ActivationBackwardInPlace bfloat16 dout "+what, 1.0/128, ghG, ghC)
				sameGPUBits(t, d, "ActivationBackwardInPlace bfloat16 dout "+what+" (want the float32 kernel's, rounded)", ghG, back)
				dbC, dbG := alloc(b.cpu, tensor.Float32, sh.oc), alloc(d, tensor.Float32, sh.oc)
				dbW := alloc(d, tensor.Float32, sh.oc)
				d.Copy(wide, ghG)
				b.cpu.BiasBackward(dbC, ghC)
				d.BiasBackward(dbG, ghG)
				d.BiasBackward(dbW, wide)
				near("BiasBackward bfloat16 dout "+what, tol32, dbG, dbC)
				sameGPUBits(t, d, "BiasBackward bfloat16 dout "+what+" (want the widened gradient's)", dbG, dbW)
			}
		}
	}
}

// The residual add fused into the norm after it: AddLayerNormForward and
// AddRMSNormForward against the CPU's, and on the GPU against its own Add
// then the norm, to the bit; float32 and bfloat16 outputs, the sum
// written over an addend, one channel, a width not a multiple of a warp,
// more rows than the grid.
func TestGPUAddNorm(t *testing.T) {
	b := newBench(t)
	d := b.gpu
	for _, sh := range []struct{ rows, c int }{{3, 1}, {13, 771}, {d.sms*32 + 5, 64}} {
		w, bias := b.rand("weight", 1, sh.c), b.rand("bias", 1, sh.c)
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			for _, inPlace := range []bool{false, true} {
				what := fmt.Sprintf("%dx%d out %v in place %v", sh.rows, sh.c, dt, inPlace)
				x, y := b.rand("a", 2, sh.rows, sh.c), b.rand("b", 2, sh.rows, sh.c)
				sum, sum2 := b.zeros("sum", sh.rows, sh.c), b.zeros("sum2", sh.rows, sh.c)
				mean, rstd, mean2, rstd2 := b.zeros("mean", sh.rows), b.zeros("rstd", sh.rows), b.zeros("mean2", sh.rows), b.zeros("rstd2", sh.rows)
				outC, err := b.cpu.AllocAs(dt, sh.rows, sh.c)
				if err != nil {
					t.Fatal(err)
				}
				outG, err := d.AllocAs(dt, sh.rows, sh.c)
				if err != nil {
					t.Fatal(err)
				}
				out2, err := d.AllocAs(dt, sh.rows, sh.c)
				if err != nil {
					t.Fatal(err)
				}
				d.Add(sum2.g, x.g, y.g)
				d.LayerNormForward(out2, mean2.g, rstd2.g, sum2.g, w.g, bias.g, 1e-5)
				dst := sum
				if inPlace {
					dst = x
				}
				b.cpu.AddLayerNormForward(dst.c, outC, mean.c, rstd.c, x.c, y.c, w.c, bias.c, 1e-5)
				d.AddLayerNormForward(dst.g, outG, mean.g, rstd.g, x.g, y.g, w.g, bias.g, 1e-5)
				b.check("AddLayerNormForward "+what, tol32, dst, mean, rstd)
				sameGPUBits(t, d, "AddLayerNormForward sum "+what+" (want Add's)", dst.g, sum2.g)
				sameGPUBits(t, d, "AddLayerNormForward out "+what+" (want LayerNormForward's)", outG, out2)
				sameGPUBits(t, d, "AddLayerNormForward rstd "+what, rstd.g, rstd2.g)
				if dt == tensor.Float32 {
					b.check("AddLayerNormForward out "+what, tol32, twin{"out", outC, outG})
				}

				x, y = b.rand("a", 2, sh.rows, sh.c), b.rand("b", 2, sh.rows, sh.c)
				dst = sum
				if inPlace {
					dst = y
				}
				d.Add(sum2.g, x.g, y.g)
				d.RMSNormForward(out2, rstd2.g, sum2.g, w.g, 1e-5)
				b.cpu.AddRMSNormForward(dst.c, outC, rstd.c, x.c, y.c, w.c, 1e-5)
				d.AddRMSNormForward(dst.g, outG, rstd.g, x.g, y.g, w.g, 1e-5)
				b.check("AddRMSNormForward "+what, tol32, dst, rstd)
				sameGPUBits(t, d, "AddRMSNormForward sum "+what+" (want Add's)", dst.g, sum2.g)
				sameGPUBits(t, d, "AddRMSNormForward out "+what+" (want RMSNormForward's)", outG, out2)
				if dt == tensor.Float32 {
					b.check("AddRMSNormForward out "+what, tol32, twin{"out", outC, outG})
				}
				d.Free(outG)
				d.Free(out2)
			}
		}
	}
}

// A residual stream stored as bfloat16: the norms reading a bfloat16
// input, forward and backward, the residual adds into a bfloat16 sum (from
// a float32 or bfloat16 a, fused into either norm or alone) give the bits
// of the float32 kernels on the widened values, the sums rounded once; on
// the CPU device too (the CPU's float32 kernels against the GPU's within
// tol32, as TestGPULayerNorm).
func TestGPUResidualBF16(t *testing.T) {
	b := newBench(t)
	d := b.gpu
	half := func(x twin) *tensor.Tensor { // x rounded to bfloat16 on the GPU
		h := b.bf16(x.g.Shape()...)
		d.Copy(h, x.g)
		return h
	}
	wide := func(name string, h *tensor.Tensor) twin { // h widened, on both devices
		w := b.zeros(name, h.Shape()...)
		d.Copy(w.g, h)
		d.CopyToHost(w.c.Host(), w.g)
		return w
	}
	cpuHalf := func(x twin) *tensor.Tensor {
		h, err := b.cpu.AllocAs(tensor.BFloat16, x.c.Shape()...)
		if err != nil {
			t.Fatal(err)
		}
		d.CopyToHost(x.c.Host(), x.g) // the GPU's values
		b.cpu.Copy(h, x.c)
		return h
	}
	for _, sh := range []struct{ rows, c int }{{3, 1}, {13, 771}, {d.sms*32 + 5, 64}} {
		n, c := sh.rows, sh.c
		what := fmt.Sprintf("%dx%d", n, c)
		w, bias := b.rand("weight", 1, c), b.rand("bias", 1, c)
		xh := half(b.rand("x", 3, n, c))
		x := wide("x widened", xh)
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			out, out2 := b.bf16(n, c), b.bf16(n, c)
			if dt == tensor.Float32 {
				out, out2 = b.zeros("out", n, c).g, b.zeros("out2", n, c).g
			}
			mean, rstd, mean2, rstd2 := b.zeros("mean", n), b.zeros("rstd", n), b.zeros("mean2", n), b.zeros("rstd2", n)
			d.LayerNormForward(out, mean.g, rstd.g, xh, w.g, bias.g, 1e-5)
			d.LayerNormForward(out2, mean2.g, rstd2.g, x.g, w.g, bias.g, 1e-5)
			sameGPUBits(t, d, "LayerNormForward of a bfloat16 inp "+what+" out "+dt.String(), outAsF32(b, out), outAsF32(b, out2))
			sameGPUBits(t, d, "LayerNormForward of a bfloat16 inp "+what+" rstd", rstd.g, rstd2.g)
			d.RMSNormForward(out, rstd.g, xh, w.g, 1e-5)
			d.RMSNormForward(out2, rstd2.g, x.g, w.g, 1e-5)
			sameGPUBits(t, d, "RMSNormForward of a bfloat16 inp "+what+" out "+dt.String(), outAsF32(b, out), outAsF32(b, out2))
			sameGPUBits(t, d, "RMSNormForward of a bfloat16 inp "+what+" rstd", rstd.g, rstd2.g)

			// The residual add into a bfloat16 sum, from a float32 a and
			// from a bfloat16 one: the sum is Add's (rounded), the rest
			// the norm's of that sum.
			y := b.rand("y", 2, n, c)
			for _, aHalf := range []bool{false, true} {
				a := b.rand("a", 2, n, c).g
				if aHalf {
					a = half(twin{"a", nil, a})
				}
				sum, sum2 := b.bf16(n, c), b.bf16(n, c)
				if aHalf {
					d.Add(sum2, a, y.g)
				} else { // a float32 a: the float32 sum rounded
					tmp := b.zeros("tmp", n, c)
					d.Add(tmp.g, a, y.g)
					d.Copy(sum2, tmp.g)
				}
				what := fmt.Sprintf("%s out %v a bfloat16 %v", what, dt, aHalf)
				d.AddLayerNormForward(sum, out, mean.g, rstd.g, a, y.g, w.g, bias.g, 1e-5)
				d.LayerNormForward(out2, mean2.g, rstd2.g, sum2, w.g, bias.g, 1e-5)
				sameGPUBits(t, d, "AddLayerNormForward's bfloat16 sum "+what, outAsF32(b, sum), outAsF32(b, sum2))
				sameGPUBits(t, d, "AddLayerNormForward's out "+what, outAsF32(b, out), outAsF32(b, out2))
				sameGPUBits(t, d, "AddLayerNormForward's mean "+what, mean.g, mean2.g)
				d.AddRMSNormForward(sum, out, rstd.g, a, y.g, w.g, 1e-5)
				d.RMSNormForward(out2, rstd2.g, sum2, w.g, 1e-5)
				sameGPUBits(t, d, "AddRMSNormForward's bfloat16 sum "+what, outAsF32(b, sum), outAsF32(b, sum2))
				sameGPUBits(t, d, "AddRMSNormForward's out "+what, outAsF32(b, out), outAsF32(b, out2))
				sameGPUBits(t, d, "AddRMSNormForward's rstd "+what, rstd.g, rstd2.g)
			}
		}

		// The backward of a bfloat16 inp: the float32 kernel's on the
		// widened one; and on the CPU device likewise, within tol32.
		mean, rstd := b.zeros("mean", n), b.zeros("rstd", n)
		b.cpu.LayerNormForward(b.zeros("o", n, c).c, mean.c, rstd.c, x.c, w.c, bias.c, 1e-5)
		d.LayerNormForward(b.zeros("o", n, c).g, mean.g, rstd.g, x.g, w.g, bias.g, 1e-5)
		dout := b.rand("dout", 1, n, c)
		dinp, dw, db := b.rand("dinp", 1, n, c), b.rand("dweight", 1, c), b.rand("dbias", 1, c)
		ref := [3]twin{b.zeros("dinp2", n, c), b.zeros("dweight2", c), b.zeros("dbias2", c)}
		for i, x := range []twin{dinp, dw, db} {
			d.Copy(ref[i].g, x.g)
		}
		d.LayerNormBackward(dinp.g, dw.g, db.g, dout.g, xh, w.g, mean.g, rstd.g)
		d.LayerNormBackward(ref[0].g, ref[1].g, ref[2].g, dout.g, x.g, w.g, mean.g, rstd.g)
		for i, x := range []twin{dinp, dw, db} {
			sameGPUBits(t, d, "LayerNormBackward of a bfloat16 inp "+what+" "+x.name, x.g, ref[i].g)
		}
		b.cpu.LayerNormBackward(dinp.c, dw.c, db.c, dout.c, cpuHalf(x), w.c, mean.c, rstd.c)
		b.check("LayerNormBackward of a bfloat16 inp "+what, tol32, dinp, dw, db)
		b.cpu.RMSNormForward(b.zeros("o", n, c).c, rstd.c, x.c, w.c, 1e-5)
		d.RMSNormForward(b.zeros("o", n, c).g, rstd.g, x.g, w.g, 1e-5)
		d.Copy(ref[0].g, dinp.g)
		d.Copy(ref[1].g, dw.g)
		d.RMSNormBackward(dinp.g, dw.g, dout.g, xh, w.g, rstd.g)
		d.RMSNormBackward(ref[0].g, ref[1].g, dout.g, x.g, w.g, rstd.g)
		sameGPUBits(t, d, "RMSNormBackward of a bfloat16 inp "+what+" dinp", dinp.g, ref[0].g)
		sameGPUBits(t, d, "RMSNormBackward of a bfloat16 inp "+what+" dweight", dw.g, ref[1].g)
		b.cpu.RMSNormBackward(dinp.c, dw.c, dout.c, cpuHalf(x), w.c, rstd.c)
		b.check("RMSNormBackward of a bfloat16 inp "+what, tol32, dinp, dw)
	}
}

// TestGPUResidualGradBF16: the kernels that read or write the residual
// stream's gradient as bfloat16 (Axpy, the norms' backward into dinp and
// from a norm output's gradient dout, EmbeddingBackward's dout), and the embeddings' forward into the stream
// (EmbeddingForward, Add of float32 a and b) give the float32 kernels'
// results on the widened values, rounded once where they write
// bfloat16, to the bit.
func TestGPUResidualGradBF16(t *testing.T) {
	b := newBench(t)
	d := b.gpu
	half := func(x *tensor.Tensor) *tensor.Tensor { // x rounded to bfloat16
		h := b.bf16(x.Shape()...)
		d.Copy(h, x)
		return h
	}
	for _, sh := range []struct{ rows, c int }{{3, 1}, {13, 771}, {d.sms*32 + 5, 64}} {
		n, c := sh.rows, sh.c
		what := fmt.Sprintf("%dx%d", n, c)
		x, y := half(b.rand("x", 2, n, c).g), half(b.rand("y", 2, n, c).g)
		xw, yw := outAsF32(b, x), outAsF32(b, y)
		for _, dts := range [][2]tensor.DType{{tensor.Float32, tensor.BFloat16}, {tensor.BFloat16, tensor.Float32}, {tensor.BFloat16, tensor.BFloat16}} {
			yy, xx := yw, xw
			if dts[0] == tensor.BFloat16 {
				yy = half(yw)
			} else {
				yy = b.zeros("y32", n, c).g
				d.Copy(yy, yw)
			}
			if dts[1] == tensor.BFloat16 {
				xx = x
			}
			ref := b.zeros("ref", n, c).g
			d.Copy(ref, yw)
			d.Axpy(ref, -0.75, xw)
			d.Axpy(yy, -0.75, xx)
			want := ref
			if dts[0] == tensor.BFloat16 {
				want = outAsF32(b, half(ref))
			}
			sameGPUBits(t, d, fmt.Sprintf("Axpy %s y %v x %v", what, dts[0], dts[1]), outAsF32(b, yy), want)
		}

		// The norms' backward into a bfloat16 dinp and from a bfloat16
		// dout, from a float32 and a bfloat16 inp: the float32 kernel's
		// on the widened values, dinp rounded, the same weight and bias
		// gradients.
		w, bias := b.rand("weight", 1, c), b.rand("bias", 1, c)
		mean, rstd := b.zeros("mean", n), b.zeros("rstd", n)
		dout32 := outAsF32(b, half(b.rand("dout", 1, n, c).g))
		dinp0 := outAsF32(b, half(b.rand("dinp", 1, n, c).g))
		for _, inp := range []*tensor.Tensor{xw, x} {
			for _, dts := range [][2]tensor.DType{{tensor.BFloat16, tensor.Float32}, {tensor.Float32, tensor.BFloat16}, {tensor.BFloat16, tensor.BFloat16}} {
				what := fmt.Sprintf("%s inp %v dinp %v dout %v", what, inp.DType(), dts[0], dts[1])
				grads := func() (dinp, dout *tensor.Tensor) {
					dinp, dout = b.zeros("dinp", n, c).g, dout32
					d.Copy(dinp, dinp0)
					if dts[0] == tensor.BFloat16 {
						dinp = half(dinp0)
					}
					if dts[1] == tensor.BFloat16 {
						dout = half(dout32)
					}
					return dinp, dout
				}
				want := func(ref *tensor.Tensor) *tensor.Tensor {
					if dts[0] == tensor.BFloat16 {
						return outAsF32(b, half(ref))
					}
					return ref
				}
				d.LayerNormForward(b.zeros("o", n, c).g, mean.g, rstd.g, inp, w.g, bias.g, 1e-5)
				dinp, dout := grads()
				ref := b.zeros("dinp2", n, c).g
				d.Copy(ref, dinp0)
				dw, db, dw2, db2 := b.zeros("dw", c), b.zeros("db", c), b.zeros("dw2", c), b.zeros("db2", c)
				d.LayerNormBackward(dinp, dw.g, db.g, dout, inp, w.g, mean.g, rstd.g)
				d.LayerNormBackward(ref, dw2.g, db2.g, dout32, inp, w.g, mean.g, rstd.g)
				sameGPUBits(t, d, "LayerNormBackward "+what, outAsF32(b, dinp), want(ref))
				sameGPUBits(t, d, "LayerNormBackward "+what+" dweight", dw.g, dw2.g)
				sameGPUBits(t, d, "LayerNormBackward "+what+" dbias", db.g, db2.g)
				d.RMSNormForward(b.zeros("o", n, c).g, rstd.g, inp, w.g, 1e-5)
				dinp, dout = grads()
				d.Copy(ref, dinp0)
				d.RMSNormBackward(dinp, dw.g, dout, inp, w.g, rstd.g)
				d.RMSNormBackward(ref, dw2.g, dout32, inp, w.g, rstd.g)
				sameGPUBits(t, d, "RMSNormBackward "+what, outAsF32(b, dinp), want(ref))
				sameGPUBits(t, d, "RMSNormBackward "+what+" dweight", dw.g, dw2.g)
			}
		}
	}

	// EmbeddingBackward of a bfloat16 dout: ids without repeats, so that
	// the atomic adds' order cannot change the bits.
	const n, c, v, start = 37, 96, 50, 100
	id := make([]int32, n)
	for i, p := range b.r.Perm(v + 10)[:n] {
		id[i] = int32(start - 5 + p) // some outside the slice
	}
	dout := half(b.rand("dout", 1, n, c).g)
	dtable, ref := b.rand("dtable", 1, v, c), b.zeros("dtable2", v, c)
	d.Copy(ref.g, dtable.g)
	d.EmbeddingBackward(dtable.g, dout, id, start)
	d.EmbeddingBackward(ref.g, outAsF32(b, dout), id, start)
	sameGPUBits(t, d, "EmbeddingBackward of a bfloat16 dout", dtable.g, ref.g)

	// The embeddings' forward into a bfloat16 stream: the float32
	// kernels' results rounded once.
	out, ref32 := b.bf16(n, c), b.zeros("out32", n, c).g
	d.Fill(out, 3) // rows outside the slice must be zeroed
	d.EmbeddingForward(out, id, dtable.g, start)
	d.EmbeddingForward(ref32, id, dtable.g, start)
	sameGPUBits(t, d, "EmbeddingForward into a bfloat16 out", outAsF32(b, out), outAsF32(b, half(ref32)))
	pos := b.rand("pos", 1, n, c)
	d.Add(out, ref32, pos.g)
	d.Add(ref32, ref32, pos.g)
	sameGPUBits(t, d, "Add of float32 a and b into a bfloat16 out", outAsF32(b, out), outAsF32(b, half(ref32)))
}

// outAsF32 is x as float32 on the GPU: itself, or a bfloat16 x widened
// into a new tensor.
func outAsF32(b *bench, x *tensor.Tensor) *tensor.Tensor {
	if x.DType() == tensor.Float32 {
		return x
	}
	w := b.zeros("widened", x.Shape()...)
	b.gpu.Copy(w.g, x)
	return w.g
}

func TestGPUSoftmax(t *testing.T) {
	b := newBench(t)
	for _, tt := range []struct {
		bsz, nh, tq, tk int
		causal, mask    bool
	}{
		{2, 3, 17, 17, false, false},
		{2, 3, 17, 17, true, false},
		{2, 2, 5, 40, true, false}, // Tq < Tk: query i sees keys up to i+Tk-Tq
		{3, 2, 33, 33, false, true},
		{1, 12, 64, 64, true, false},
		{1, 1, 4, 1500, false, true},
	} {
		inp := b.rand("inp", 4, tt.bsz, tt.nh, tt.tq, tt.tk)
		out := b.zeros("out", tt.bsz, tt.nh, tt.tq, tt.tk)
		var valid []int32
		if tt.mask {
			valid = ids(b.r, tt.bsz*tt.tk, 0, 2)
			for j := 0; j < tt.tk; j++ { // item 0 has every key masked
				valid[j] = 0
			}
		}
		b.cpu.SoftmaxForward(out.c, inp.c, 0.3, tt.causal, valid)
		b.gpu.SoftmaxForward(out.g, inp.g, 0.3, tt.causal, valid)
		b.check("SoftmaxForward", tol32, out)
		dinp, dout := b.rand("dinp", 1, tt.bsz, tt.nh, tt.tq, tt.tk), b.rand("dout", 1, tt.bsz, tt.nh, tt.tq, tt.tk)
		b.cpu.SoftmaxBackward(dinp.c, dout.c, out.c, 0.3)
		b.gpu.SoftmaxBackward(dinp.g, dout.g, out.g, 0.3)
		b.check("SoftmaxBackward", tol32, dinp)
		b.softmaxBF16(inp, out, dout, tt.causal, valid)
		b.cpu.SoftmaxForward(inp.c, inp.c, 1, tt.causal, valid)
		b.gpu.SoftmaxForward(inp.g, inp.g, 1, tt.causal, valid)
		b.check("SoftmaxForward in place", tol32, inp)
	}
}

// softmaxBF16 checks the softmax into bfloat16 probabilities (the unfused
// attention's under bf16 compute): on the GPU the float32 kernel's
// probabilities (out, from inp) rounded, to the bit, and near the CPU's;
// the backward reading them widened gives the float32 kernel's bits on
// the widened values, near the CPU's.
func (b *bench) softmaxBF16(inp, out, dout twin, causal bool, valid []int32) {
	b.t.Helper()
	shape := inp.c.Shape()
	half := func(dev tensor.Device) *tensor.Tensor {
		h, err := dev.AllocAs(tensor.BFloat16, shape...)
		if err != nil {
			b.t.Fatal(err)
		}
		return h
	}
	hc, hg, rounded := half(b.cpu), half(b.gpu), half(b.gpu)
	defer b.gpu.Free(hg)
	defer b.gpu.Free(rounded)
	b.cpu.SoftmaxForward(hc, inp.c, 0.3, causal, valid)
	b.gpu.SoftmaxForward(hg, inp.g, 0.3, causal, valid)
	b.gpu.Copy(rounded, out.g)
	sameGPUBits(b.t, b.gpu, "SoftmaxForward into bfloat16 (want the float32 probabilities rounded)", hg, rounded)
	probs := b.zeros("bf16 probabilities", shape...)
	b.cpu.Copy(probs.c, hc)
	b.gpu.Copy(probs.g, hg)
	b.check("SoftmaxForward into bfloat16", 1.0/128, probs) // a last bit apart may round a bfloat16 apart
	d, wide := b.zeros("dinp from bf16", shape...), b.zeros("dinp from the widened", shape...)
	b.gpu.Zero(d.g) // zeros' elements may be -0
	b.gpu.Zero(wide.g)
	b.cpu.SoftmaxBackward(d.c, dout.c, hc, 0.3)
	b.gpu.SoftmaxBackward(d.g, dout.g, hg, 0.3)
	b.gpu.SoftmaxBackward(wide.g, dout.g, probs.g, 0.3)
	b.check("SoftmaxBackward from bfloat16", tol32, d)
	sameGPUBits(b.t, b.gpu, "SoftmaxBackward from bfloat16 (want the float32 kernel's on the widened probabilities)", d.g, wide.g)
	// Into a bfloat16 gradient, from either dtype of the probabilities:
	// the float32 kernel's sums rounded, to the bit; near the CPU's.
	for _, p := range []*tensor.Tensor{probs.g, hg} {
		dh, dhc, back := half(b.gpu), half(b.cpu), half(b.gpu)
		b.gpu.Zero(dh)
		b.gpu.Zero(wide.g)
		b.gpu.SoftmaxBackward(dh, dout.g, p, 0.3)
		b.gpu.SoftmaxBackward(wide.g, dout.g, p, 0.3)
		b.gpu.Copy(back, wide.g)
		sameGPUBits(b.t, b.gpu, fmt.Sprintf("SoftmaxBackward into bfloat16 from %v (want the float32 gradient rounded)", p.DType()), dh, back)
		b.cpu.SoftmaxBackward(dhc, dout.c, hc, 0.3)
		got := b.zeros("bf16 dinp", shape...)
		b.cpu.Copy(got.c, dhc)
		b.gpu.Copy(got.g, dh)
		b.check("SoftmaxBackward into bfloat16", 1.0/64, got)
		b.gpu.Free(dh)
		b.gpu.Free(back)
		b.cpu.Free(dhc)
	}
}

func TestGPUCrossEntropy(t *testing.T) {
	b := newBench(t)
	for _, tt := range []struct{ n, v, start int }{{7, 33, 0}, {64, 50257, 0}, {40, 1000, 500}} {
		logits := b.rand("logits", 8, tt.n, tt.v)
		rowMax, sumExp, tl, loss := b.zeros("rowMax", tt.n), b.zeros("sumExp", tt.n), b.zeros("targetLogit", tt.n), b.zeros("losses", tt.n)
		targets := ids(b.r, tt.n, tt.start-tt.v/2, tt.start+tt.v+tt.v/2)
		targets[0] = -1
		b.cpu.CrossEntropyRowMax(rowMax.c, logits.c)
		b.gpu.CrossEntropyRowMax(rowMax.g, logits.g)
		b.check("CrossEntropyRowMax", 0, rowMax)
		b.cpu.CrossEntropySumExp(sumExp.c, logits.c, rowMax.c)
		b.gpu.CrossEntropySumExp(sumExp.g, logits.g, rowMax.g)
		b.check("CrossEntropySumExp", tol32, sumExp)
		b.cpu.CrossEntropyTargetLogit(tl.c, logits.c, targets, tt.start)
		b.gpu.CrossEntropyTargetLogit(tl.g, logits.g, targets, tt.start)
		b.check("CrossEntropyTargetLogit", 0, tl)
		b.cpu.CrossEntropyLoss(loss.c, rowMax.c, sumExp.c, tl.c, targets)
		b.gpu.CrossEntropyLoss(loss.g, rowMax.g, sumExp.g, tl.g, targets)
		b.check("CrossEntropyLoss", tol32, loss)
		dlogits := b.rand("dlogits", 1e-3, tt.n, tt.v)
		b.cpu.CrossEntropyBackward(dlogits.c, logits.c, rowMax.c, sumExp.c, targets, tt.start, 0.25)
		b.gpu.CrossEntropyBackward(dlogits.g, logits.g, rowMax.g, sumExp.g, targets, tt.start, 0.25)
		b.check("CrossEntropyBackward", tol32, dlogits)
		b.fusedClassifier(fmt.Sprintf("n=%d v=%d", tt.n, tt.v), logits, rowMax, sumExp, targets, tt.start, tt.v-tt.v/7)
		b.bf16Classifier(fmt.Sprintf("n=%d v=%d", tt.n, tt.v), logits, targets, tt.start, tt.v-tt.v/7)
	}
}

// bf16Classifier checks the cross-entropy kernels on logits rounded to
// bfloat16 (an LM head's under bf16 compute): on the GPU each gives the
// bits of its float32 kernel on the widened values (the in-place gradient
// rounded once, the columns from cols on untouched), and the CPU's
// results on the same bfloat16 logits.
func (b *bench) bf16Classifier(what string, logits twin, targets []int32, start, cols int) {
	b.t.Helper()
	n, v := logits.c.Rows(), logits.c.Cols()
	what += " bf16"
	half := func(dev tensor.Device, src *tensor.Tensor) *tensor.Tensor {
		h, err := dev.AllocAs(tensor.BFloat16, n, v)
		if err != nil {
			b.t.Fatal(err)
		}
		dev.Copy(h, src)
		return h
	}
	hc, hg := half(b.cpu, logits.c), half(b.gpu, logits.g)
	defer b.gpu.Free(hg)
	wide := b.zeros("widened logits", n, v)
	b.cpu.Copy(wide.c, hc)
	b.gpu.Copy(wide.g, hg)
	// piece runs a kernel on the bfloat16 logits (into x, both devices)
	// and on the GPU's widened ones (into y), to the bit.
	rowMax, sumExp, wMax, wSum := b.zeros("rowMax", n), b.zeros("sumExp", n), b.zeros("rowMax", n), b.zeros("sumExp", n)
	piece := func(name string, x, y twin, run func(dev tensor.Device, logits, out, rowMax *tensor.Tensor)) {
		b.t.Helper()
		run(b.cpu, hc, x.c, rowMax.c)
		run(b.gpu, hg, x.g, rowMax.g)
		run(b.gpu, wide.g, y.g, wMax.g)
		b.check(name+" "+what, tol32, x)
		sameGPUBits(b.t, b.gpu, name+" "+what+" (want the float32 kernel's on the widened logits)", x.g, y.g)
	}
	piece("CrossEntropyRowMax", rowMax, wMax, func(dev tensor.Device, l, out, _ *tensor.Tensor) { dev.CrossEntropyRowMax(out, l) })
	piece("CrossEntropySumExp", sumExp, wSum, func(dev tensor.Device, l, out, mx *tensor.Tensor) { dev.CrossEntropySumExp(out, l, mx) })
	tl, wTL := b.zeros("targetLogit", n), b.zeros("targetLogit", n)
	piece("CrossEntropyTargetLogit", tl, wTL, func(dev tensor.Device, l, out, _ *tensor.Tensor) {
		dev.CrossEntropyTargetLogit(out, l, targets, start)
	})
	if start == 0 {
		fMax, fSum, loss, wLoss := b.zeros("fused rowMax", n), b.zeros("fused sumExp", n), b.zeros("losses", n), b.zeros("losses", n)
		piece("CrossEntropyForward", loss, wLoss, func(dev tensor.Device, l, out, _ *tensor.Tensor) {
			m, s := fMax.c, fSum.c
			if dev != tensor.Device(b.cpu) {
				m, s = fMax.g, fSum.g
			}
			dev.CrossEntropyForward(out, m, s, l, targets)
		})
	}
	b.cpu.CrossEntropyBackwardInPlace(hc, rowMax.c, sumExp.c, targets, start, cols, 0.25)
	b.gpu.CrossEntropyBackwardInPlace(hg, rowMax.g, sumExp.g, targets, start, cols, 0.25)
	b.gpu.CrossEntropyBackwardInPlace(wide.g, rowMax.g, sumExp.g, targets, start, cols, 0.25)
	g := b.zeros("gradient in place", n, v)
	b.cpu.Copy(g.c, hc)
	b.gpu.Copy(g.g, hg)
	b.check("CrossEntropyBackwardInPlace "+what, 1.0/128, g) // a last bit apart may round a bfloat16 apart
	rounded := half(b.gpu, wide.g)                           // the float32 gradient rounded
	defer b.gpu.Free(rounded)
	sameGPUBits(b.t, b.gpu, "CrossEntropyBackwardInPlace "+what+" (want the float32 gradient rounded)", hg, rounded)
}

// fusedClassifier checks the fused cross-entropy on logits against the
// CPU's and against the GPU's own pieces: CrossEntropyForward (start 0)
// gives the pieces' rowMax, sumExp and losses to the bit, and
// CrossEntropyBackwardInPlace the gradient that CrossEntropyBackward adds
// to zeros, to the bit, over the first cols columns, leaving the rest.
// rowMax and sumExp hold the pieces' results; logits is not changed.
func (b *bench) fusedClassifier(what string, logits, rowMax, sumExp twin, targets []int32, start, cols int) {
	b.t.Helper()
	n, v := logits.c.Rows(), logits.c.Cols()
	download := func(x *tensor.Tensor) []float32 {
		h := make([]float32, x.Len())
		b.gpu.CopyToHost(h, x)
		return h
	}
	sameBits := func(name string, got, want []float32) {
		b.t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				b.t.Errorf("%s %s: [%d] = %g on the GPU, its pieces %g", what, name, i, got[i], want[i])
				return
			}
		}
	}
	if start == 0 {
		tl, loss := b.zeros("targetLogit", n), b.zeros("losses", n)
		b.gpu.CrossEntropyTargetLogit(tl.g, logits.g, targets, 0)
		b.gpu.CrossEntropyLoss(loss.g, rowMax.g, sumExp.g, tl.g, targets)
		fMax, fSum, fLoss := b.zeros("fused rowMax", n), b.zeros("fused sumExp", n), b.zeros("fused losses", n)
		b.cpu.CrossEntropyForward(fLoss.c, fMax.c, fSum.c, logits.c, targets)
		b.gpu.CrossEntropyForward(fLoss.g, fMax.g, fSum.g, logits.g, targets)
		b.check("CrossEntropyForward "+what, tol32, fMax, fSum, fLoss)
		sameBits("CrossEntropyForward rowMax", download(fMax.g), download(rowMax.g))
		sameBits("CrossEntropyForward sumExp", download(fSum.g), download(sumExp.g))
		sameBits("CrossEntropyForward losses", download(fLoss.g), download(loss.g))
	}
	dx, g := b.zeros("dlogits", n, v), b.zeros("gradient in place", n, v)
	b.gpu.Zero(dx.g) // zeros' elements may be -0
	b.cpu.Copy(g.c, logits.c)
	b.gpu.Copy(g.g, logits.g)
	b.gpu.CrossEntropyBackward(dx.g, logits.g, rowMax.g, sumExp.g, targets, start, 0.25)
	b.cpu.CrossEntropyBackwardInPlace(g.c, rowMax.c, sumExp.c, targets, start, cols, 0.25)
	b.gpu.CrossEntropyBackwardInPlace(g.g, rowMax.g, sumExp.g, targets, start, cols, 0.25)
	b.check("CrossEntropyBackwardInPlace "+what, tol32, g)
	got, want, x := download(g.g), download(dx.g), download(logits.g)
	for i := 0; i < n; i++ {
		copy(want[i*v+cols:(i+1)*v], x[i*v+cols:(i+1)*v])
	}
	sameBits("CrossEntropyBackwardInPlace", got, want)
}

func TestGPUAdamWAndSumSquares(t *testing.T) {
	b := newBench(t)
	p, g, m, v := b.rand("param", 1, 100003), b.rand("grad", 1, 100003), b.rand("m", 0.1, 100003), b.rand("v", 0.1, 100003)
	b.cpu.Scale(v.c, 0) // second moments are not negative
	b.gpu.Scale(v.g, 0)
	s := b.zeros("scale", 1)
	for step, gs := range []float32{0, 0.5, 1} { // 0: no scale tensor
		hp := tensor.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step + 1}
		sc, sg := s.c, s.g
		if gs == 0 {
			sc, sg = nil, nil
		}
		b.cpu.Fill(s.c, gs)
		b.gpu.Fill(s.g, gs)
		b.cpu.AdamW(p.c, g.c, m.c, v.c, nil, hp, sc)
		b.gpu.AdamW(p.g, g.g, m.g, v.g, nil, hp, sg)
		b.check(fmt.Sprintf("AdamW scale %g", gs), tol32, p, m, v)
	}
	x, y := b.rand("x", 1, 3), b.rand("y", 2, 5<<20) // y past sumBlocks blocks
	want := sumSquares(t, b.cpu, p.c, x.c, y.c, g.c)
	got := sumSquares(t, b.gpu, p.g, x.g, y.g, g.g)
	for i := range want {
		if e := math.Abs(got[i]-want[i]) / want[i]; e > 1e-6 { // p after AdamW differs within tol32
			t.Errorf("SumSquaresEach %d = %g, cpu %g: relative error %.2g", i, got[i], want[i], e)
		}
	}
	if s := sumSquares(t, b.gpu); len(s) != 1 || s[0] != 0 {
		t.Errorf("SumSquaresEach of no tensor into 2 floats = %v, want [0]", s)
	}
}

// sumSquares is SumSquaresEach of ts on d, read back; of no tensor, it is
// the one float64 that SumSquaresEach must clear.
func sumSquares(t *testing.T, d tensor.Device, ts ...*tensor.Tensor) []float64 {
	t.Helper()
	out, err := d.Alloc(2 * max(len(ts), 1))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(out)
	d.Fill(out, 3)
	d.SumSquaresEach(out, ts...)
	h := make([]float32, out.Len())
	if err := d.Fetch(h, out); err != nil {
		t.Fatal(err)
	}
	s := make([]float64, out.Len()/2)
	for i := range s {
		s[i] = tensor.Float64At(h, i)
	}
	return s
}

// gemmCase runs one GEMM on both devices; a, b, c are big enough for
// every layout below.
func gemmCase(t *testing.T, bn *bench, tol float64, transA, transB bool, m, n, k int, alpha, beta float32, aOff, lda, bOff, ldb, cOff, ldc int) {
	t.Helper()
	a, b, c := bn.rand("a", 1, 80000), bn.rand("b", 1, 80000), bn.rand("c", 1, 80000)
	bn.cpu.Gemm(transA, transB, m, n, k, alpha, a.c, aOff, lda, b.c, bOff, ldb, beta, c.c, cOff, ldc)
	bn.gpu.Gemm(transA, transB, m, n, k, alpha, a.g, aOff, lda, b.g, bOff, ldb, beta, c.g, cOff, ldc)
	bn.check("Gemm", tol, c)
}

func TestGPUGemm(t *testing.T) {
	bn := newBench(t)
	for _, p := range []struct {
		prec tensor.Precision
		tol  float64
	}{{tensor.FP32, tol32}, {tensor.TF32, 5e-3}, {tensor.BF16, 1e-2}} {
		bn.gpu.SetMatmulPrecision(p.prec)
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			ta, tb := tr[0], tr[1]
			m, n, k := 67, 45, 129
			lda, ldb := k+3, n+5
			if ta {
				lda = m + 1
			}
			if tb {
				ldb = k + 2
			}
			gemmCase(t, bn, p.tol, ta, tb, m, n, k, 1, 0, 7, lda, 11, ldb, 5, n+9)
			gemmCase(t, bn, p.tol, ta, tb, m, n, k, -0.5, 1, 0, lda, 0, ldb, 0, n)
		}
		gemmCase(t, bn, p.tol, false, false, 8, 8, 0, 1, 0.5, 0, 1, 0, 8, 0, 8) // k = 0: C = beta*C
	}
	bn.gpu.SetMatmulPrecision(tensor.FP32)
	// beta 0 ignores NaNs already in C.
	a, b, c := bn.rand("a", 1, 64, 64), bn.rand("b", 1, 64, 64), bn.rand("c", 1, 64, 64)
	nan := make([]float32, 64*64)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	bn.gpu.CopyFromHost(c.g, nan)
	tensor.MatMul(c.c, a.c, b.c, false, false, 1, 0)
	tensor.MatMul(c.g, a.g, b.g, false, false, 1, 0)
	bn.check("MatMul over NaN with beta 0", tol32, c)
}

func TestGPUGemmStridedBatched(t *testing.T) {
	bn := newBench(t)
	for _, p := range []struct {
		prec tensor.Precision
		tol  float64
	}{{tensor.FP32, tol32}, {tensor.BF16, 1e-2}} {
		bn.gpu.SetMatmulPrecision(p.prec)
		// separate blocks, A shared (stride 0)
		a, b, c := bn.rand("a", 1, 30, 40), bn.rand("b", 1, 6, 40, 20), bn.rand("c", 1, 6, 30, 20)
		bn.cpu.GemmStridedBatched(false, false, 30, 20, 40, 1, a.c, 0, 40, 0, b.c, 0, 20, 800, 0, c.c, 0, 20, 600, 6)
		bn.gpu.GemmStridedBatched(false, false, 30, 20, 40, 1, a.g, 0, 40, 0, b.g, 0, 20, 800, 0, c.g, 0, 20, 600, 6)
		bn.check("GemmStridedBatched blocks "+p.prec.String(), p.tol, c)
		// attention layout: heads of a (T,3C) qkv read in place, outputs side by side in rows
		const T, C, nh = 33, 48, 4
		hs := C / nh
		qkv, att, out := bn.rand("qkv", 1, T, 3*C), bn.rand("att", 1, nh, T, T), bn.rand("out", 1, T, C)
		bn.cpu.GemmStridedBatched(false, true, T, T, hs, 1, qkv.c, 0, 3*C, hs, qkv.c, C, 3*C, hs, 0, att.c, 0, T, T*T, nh)
		bn.gpu.GemmStridedBatched(false, true, T, T, hs, 1, qkv.g, 0, 3*C, hs, qkv.g, C, 3*C, hs, 0, att.g, 0, T, T*T, nh)
		bn.check("GemmStridedBatched q k^T "+p.prec.String(), p.tol, att)
		bn.cpu.GemmStridedBatched(false, false, T, hs, T, 1, att.c, 0, T, T*T, qkv.c, 2*C, 3*C, hs, 0.5, out.c, 0, C, hs, nh)
		bn.gpu.GemmStridedBatched(false, false, T, hs, T, 1, att.g, 0, T, T*T, qkv.g, 2*C, 3*C, hs, 0.5, out.g, 0, C, hs, nh)
		bn.check("GemmStridedBatched att v "+p.prec.String(), p.tol, out)
	}
	bn.gpu.SetMatmulPrecision(tensor.FP32)
}

// The ops built from Device calls (attention, linear, cross-entropy) agree
// end to end.
func TestGPUComposites(t *testing.T) {
	bn := newBench(t)
	const B, T, C, nh = 2, 24, 32, 4
	qkv, att, out := bn.rand("qkv", 1, B, T, 3*C), bn.zeros("att", B, nh, T, T), bn.zeros("out", B, T, C)
	valid := ids(bn.r, B*T, 0, 2)
	valid[0] = 1
	tensor.AttentionForward(out.c, att.c, nil, qkv.c, nh, true, valid)
	tensor.AttentionForward(out.g, att.g, nil, qkv.g, nh, true, valid)
	bn.check("AttentionForward", tol32, out, att)
	dqkv, datt, dpre, dout := bn.rand("dqkv", 1, B, T, 3*C), bn.zeros("datt", B, nh, T, T), bn.zeros("dpreatt", B, nh, T, T), bn.rand("dout", 1, B, T, C)
	tensor.AttentionBackward(dqkv.c, datt.c, dpre.c, dout.c, qkv.c, att.c, nh)
	tensor.AttentionBackward(dqkv.g, datt.g, dpre.g, dout.g, qkv.g, att.g, nh)
	bn.check("AttentionBackward", tol32, dqkv)

	inp, w, bias, lo := bn.rand("inp", 1, B*T, C), bn.rand("w", 1, 3*C, C), bn.rand("bias", 1, 3*C), bn.zeros("linear out", B*T, 3*C)
	tensor.LinearForward(lo.c, inp.c, w.c, bias.c)
	tensor.LinearForward(lo.g, inp.g, w.g, bias.g)
	bn.check("LinearForward", tol32, lo)
	dinp, dw, db := bn.rand("dinp", 1, B*T, C), bn.rand("dw", 1, 3*C, C), bn.rand("db", 1, 3*C)
	tensor.LinearBackward(dinp.c, dw.c, db.c, lo.c, inp.c, w.c)
	tensor.LinearBackward(dinp.g, dw.g, db.g, lo.g, inp.g, w.g)
	bn.check("LinearBackward", tol32, dinp, dw, db)
}

// bf16 GEMM operands are packed: the conversion reads only the matrices'
// elements (the q heads of a (B, T, 3C) tensor, hs columns of each row of
// 3C, one matrix a batch item) and writes them rows of cols apart, so
// its scratch is the matrices' size, not the span they lie in; and the
// attention, whose head loop runs over heads when B > NH, agrees with the
// CPU's.
func TestGPUBF16Packed(t *testing.T) {
	bn := newBench(t)
	d := bn.gpu
	const B, T, C, nh = 5, 160, 192, 4
	hs := C / nh
	qkv := bn.rand("qkv", 1, B, T, 3*C)
	src := qkv.c.Host()
	const h = 1 // the second head's q: columns h*hs.. of every row, one (T, hs) matrix a batch item
	var ld, stride int
	got, bytes := convertBF16(t, d, B*T*hs, func(s *scratch) (p uintptr, ok bool) {
		p, ld, stride, ok = d.operandBF16(s, qkv.g.Ptr()+uintptr(h*hs)*4, false, T, hs, 3*C, T*3*C, B)
		return p, ok
	})
	if ld != hs || stride != T*hs {
		t.Errorf("packed operand: ld %d, stride %d; want %d, %d", ld, stride, hs, T*hs)
	}
	if want := int64(2 * B * T * hs); bytes != want {
		t.Errorf("packed operand's scratch: %d bytes, want %d (the span would be %d)", bytes, want, 2*(B-1)*T*3*C+2*(T-1)*3*C+2*hs)
	}
	checkPacked(t, "q heads", got, src[h*hs:], B, T, hs, 3*C, T*3*C)

	// Rows longer than a block (cols > 256, with a tail), and a grid of
	// fewer blocks in y than matrices: the kernel's column and batch loops.
	wide := bn.rand("wide", 1, 5, 7, 310)
	defer func(y int) { maxGridY = y }(maxGridY)
	maxGridY = 2
	got, _ = convertBF16(t, d, 5*7*300, func(s *scratch) (uintptr, bool) {
		return d.toBF16(s, wide.g.Ptr()+4, 7, 300, 310, 7*310, 5)
	})
	checkPacked(t, "wide rows", got, wide.c.Host()[1:], 5, 7, 300, 310, 7*310)

	d.SetMatmulPrecision(tensor.BF16)
	defer d.SetMatmulPrecision(tensor.FP32)
	att, out := bn.zeros("att", B, nh, T, T), bn.zeros("out", B, T, C)
	tensor.AttentionForward(out.c, att.c, nil, qkv.c, nh, true, nil)
	tensor.AttentionForward(out.g, att.g, nil, qkv.g, nh, true, nil)
	bn.check("AttentionForward bf16, B > NH", 1e-2, out, att)
	dqkv, datt, dpre, dout := bn.zeros("dqkv", B, T, 3*C), bn.zeros("datt", B, nh, T, T), bn.zeros("dpreatt", B, nh, T, T), bn.rand("dout", 1, B, T, C)
	tensor.AttentionBackward(dqkv.c, datt.c, dpre.c, dout.c, qkv.c, att.c, nh)
	tensor.AttentionBackward(dqkv.g, datt.g, dpre.g, dout.g, qkv.g, att.g, nh)
	bn.check("AttentionBackward bf16, B > NH", 1e-2, dqkv)
}

// checkPacked compares got, batch packed (rows, cols) bfloat16 matrices,
// with the bf16 rounding of src's matrices, ld apart in rows and stride
// apart.
func checkPacked(t *testing.T, what string, got []uint16, src []float32, batch, rows, cols, ld, stride int) {
	t.Helper()
	for b := range batch {
		for i := range rows {
			for j := range cols {
				x := src[b*stride+i*ld+j]
				if g, w := got[(b*rows+i)*cols+j], bf16Reference(x); g != w {
					t.Fatalf("%s: packed [%d][%d][%d] = %04x, want %04x (bf16 of %g)", what, b, i, j, g, w, x)
				}
			}
		}
	}
}

// convertBF16 runs convert, a bf16 conversion into a fresh scratch, and
// returns the n bfloat16s it wrote and the scratch's size.
func convertBF16(t *testing.T, d *Device, n int, convert func(*scratch) (uintptr, bool)) ([]uint16, int64) {
	t.Helper()
	if err := d.enter(); err != nil {
		t.Fatal(err)
	}
	var s scratch
	p, ok := convert(&s)
	got := make([]uint16, n)
	if ok {
		d.fail(d.l.cuErr("cuMemcpyDtoHAsync_v2", call(d.l.cu.memcpyDtoHAsync, uintptr(unsafe.Pointer(&got[0])), p, uintptr(2*n), d.stream)))
		d.fail(d.streamSync())
	}
	bytes := s.bytes
	d.fail(s.free(d.alloc))
	d.leave()
	if err := d.Sync(); err != nil || !ok {
		t.Fatalf("bf16 conversion: %v", err)
	}
	return got, bytes
}

// Allocation: zeroed tensors even from reused blocks, accounting as on the
// CPU, and a second round of the same shapes served from the cache.
func TestGPUAllocator(t *testing.T) {
	d := gpu(t)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	start := d.MemStats()
	d.ResetPeak()
	// The peak also counts the kernels' scratch the device holds (grown by
	// earlier tests): the tensors come on top of it.
	held := d.AllocStats().Workspace
	shapes := [][]int{{1}, {768}, {1024, 768}, {50257, 768}, {3, 5, 7}}
	var want int64
	for _, s := range shapes {
		n := int64(4)
		for _, x := range s {
			n *= int64(x)
		}
		want += n
	}
	var before AllocStats
	for round := 0; round < 3; round++ {
		if round == 1 {
			before = d.AllocStats()
		}
		var ts []*tensor.Tensor
		for _, s := range shapes {
			x, err := d.Alloc(s...)
			if err != nil {
				t.Fatal(err)
			}
			host := make([]float32, x.Len())
			d.CopyToHost(host, x)
			for i, v := range host {
				if v != 0 {
					t.Fatalf("round %d: Alloc%v element %d is %g, not zero", round, s, i, v)
				}
			}
			d.Fill(x, 7) // dirty it for the next round
			ts = append(ts, x)
		}
		if got := d.MemStats(); got.Current-start.Current != want || got.Peak-start.Current-held != want {
			t.Errorf("round %d: current %d peak %d, want %d more than %d (peak: and %d of scratch)", round, got.Current, got.Peak, want, start.Current, held)
		}
		for _, x := range ts {
			d.Free(x)
			d.Free(x) // a second Free does nothing
		}
		if got := d.MemStats().Current; got != start.Current {
			t.Errorf("round %d: %d bytes after freeing everything, want %d", round, got, start.Current)
		}
	}
	after := d.AllocStats()
	if after.Mallocs != before.Mallocs || after.Reuses-before.Reuses != 2*int64(len(shapes)) {
		t.Errorf("rounds 2 and 3 called cuMemAlloc %d times and reused %d blocks; want 0 and %d", after.Mallocs-before.Mallocs, after.Reuses-before.Reuses, 2*len(shapes))
	}
	if after.Reserved < want {
		t.Errorf("reserved %d < %d asked", after.Reserved, want)
	}
	if err := d.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	// An impossible allocation fails with the CUDA error, not a panic.
	_, err := d.Alloc(1<<40, 64)
	if err == nil || !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("Alloc of 256 TiB: %v, want CUDA_ERROR_OUT_OF_MEMORY", err)
	}
	if err := d.Sync(); err != nil {
		t.Errorf("Sync after a refused allocation: %v", err)
	}
	free, total, err := d.MemInfo()
	if err != nil || free <= 0 || total < free {
		t.Errorf("MemInfo = %d free of %d, %v", free, total, err)
	}
	t.Logf("%s: %d MiB free of %d; allocator %+v", d.Describe(), free>>20, total>>20, d.AllocStats())
}

// The first Open with an empty cache compiles with NVRTC and writes one
// image; the second finds it.
func TestGPUKernelCache(t *testing.T) {
	gpu(t)
	dir := t.TempDir()
	d1, err := OpenWith(0, Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if d1.KernelsFromCache() {
		t.Error("the first Open with an empty cache reports a cache hit")
	}
	if err := d1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 || !strings.HasSuffix(files[0], ".cubin") {
		t.Fatalf("cache holds %v, want one .cubin", files)
	}
	d2, err := OpenWith(0, Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if !d2.KernelsFromCache() {
		t.Error("the second Open compiled again")
	}
	// A damaged cache entry is replaced, not fatal.
	os.WriteFile(files[0], []byte("not a cubin"), 0o644)
	d3, err := OpenWith(0, Options{CacheDir: dir})
	if err != nil {
		t.Fatalf("Open over a damaged cache entry: %v", err)
	}
	if d3.KernelsFromCache() {
		t.Error("a damaged cache entry was used")
	}
	d3.Close()
	// The cached kernels work.
	x, err := d2.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	d2.Fill(x, 3)
	if s := sumSquares(t, d2, x); s[0] != 9000 {
		t.Errorf("SumSquaresEach on a cached module = %g, want 9000", s[0])
	}
}

// BenchmarkGPUGemm times the GPT-2 MLP's forward GEMM (B*T=8192, C=768,
// 4C) at each precision; b.ReportMetric gives TFLOP/s.
func BenchmarkGPUGemm(b *testing.B) {
	d := gpu(b)
	const m, n, k = 8192, 3072, 768
	x, _ := d.Alloc(m, k)
	w, _ := d.Alloc(n, k)
	y, _ := d.Alloc(m, n)
	defer func() { d.Free(x); d.Free(w); d.Free(y); d.SetMatmulPrecision(tensor.FP32) }()
	for _, p := range []tensor.Precision{tensor.FP32, tensor.TF32, tensor.BF16} {
		b.Run(p.String(), func(b *testing.B) {
			d.SetMatmulPrecision(p)
			d.Gemm(false, true, m, n, k, 1, x, 0, k, w, 0, k, 0, y, 0, n)
			d.Sync()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				d.Gemm(false, true, m, n, k, 1, x, 0, k, w, 0, k, 0, y, 0, n)
			}
			if err := d.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(2*m*n*k*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
		})
	}
}

// The norm, the clip coefficient and the clipped AdamW step computed on
// the device (no host synchronisation) match the CPU's host computation.
func TestGPUNormAndClipOnDevice(t *testing.T) {
	b := newBench(t)
	p, g, m, v := b.rand("param", 1, 70001), b.rand("grad", 1, 70001), b.rand("m", 0.1, 70001), b.rand("v", 0.1, 70001)
	b.cpu.Scale(v.c, 0)
	b.gpu.Scale(v.g, 0)
	x, y := b.rand("x", 3, 5), b.rand("y", 2, 1<<20)
	// Three tensors' squares (and a nil one, and a padding slot), then two
	// "ranks" of them summed block by block, then the norm and the scale.
	sq, two, sum, out := b.zeros("sq", 10), b.zeros("two", 20), b.zeros("sum", 10), b.zeros("out", 3)
	for _, clip := range []float64{0, 1, 1e6} {
		b.cpu.SumSquaresEach(sq.c, g.c, nil, x.c, y.c)
		b.gpu.SumSquaresEach(sq.g, g.g, nil, x.g, y.g)
		gs, cs := make([]float32, 10), make([]float32, 10)
		b.gpu.CopyToHost(gs, sq.g)
		b.cpu.CopyToHost(cs, sq.c)
		for i := range 5 {
			// The float64 sums, added in another order on the device.
			if g, c := tensor.Float64At(gs, i), tensor.Float64At(cs, i); math.Abs(g-c) > 1e-12*math.Abs(c) || (c == 0) != (g == 0) {
				t.Errorf("SumSquaresEach %d: device %.17g, CPU %.17g", i, g, c)
			}
		}
		for _, d := range []tensor.Device{b.cpu, b.gpu} {
			s, w := sq.c, two.c
			if d == tensor.Device(b.gpu) {
				s, w = sq.g, two.g
			}
			d.Copy(w.View(0, 10), s)
			d.Copy(w.View(10, 10), s)
		}
		b.cpu.SumBlocks(sum.c, two.c)
		b.gpu.SumBlocks(sum.g, two.g)
		b.cpu.ClipNorm(out.c, sum.c, clip)
		b.gpu.ClipNorm(out.g, sum.g, clip)
		got, want := make([]float32, 3), make([]float32, 3)
		b.gpu.CopyToHost(got, out.g)
		b.cpu.CopyToHost(want, out.c)
		gn, wn := tensor.Float64At(got, 0), tensor.Float64At(want, 0)
		if math.Abs(gn-wn)/wn > 1e-12 || math.Abs(float64(got[2]-want[2])) > 1e-6*float64(want[2]) {
			t.Errorf("clip %g: device norm %g scale %g, host %g and %g", clip, gn, got[2], wn, want[2])
		}
		hp := tensor.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
		b.cpu.AdamW(p.c, g.c, m.c, v.c, nil, hp, out.c.View(2, 1))
		b.gpu.AdamW(p.g, g.g, m.g, v.g, nil, hp, out.g.View(2, 1))
		b.check("AdamW with ClipNorm's scale", tol32, p, m, v)
	}
}

// SumTo keeps a scaled sum on the device; Fetch reads it with one wait.
func TestGPUSumToAndFetch(t *testing.T) {
	b := newBench(t)
	x, y, out := b.rand("x", 1, 300007), b.rand("y", 1, 17), b.zeros("out", 2)
	var want float64
	for _, v := range x.c.Host() {
		want += 0.25 * float64(v)
	}
	for _, v := range y.c.Host() {
		want += -2 * float64(v)
	}
	b.gpu.SumTo(out.g, 0.25, false, x.g)
	b.gpu.SumTo(out.g, -2, true, y.g)
	before := b.gpu.HostSyncs()
	got := make([]float32, 2)
	if err := b.gpu.Fetch(got, out.g); err != nil {
		t.Fatal(err)
	}
	if n := b.gpu.HostSyncs() - before; n != 1 {
		t.Errorf("Fetch waited %d times, want 1", n)
	}
	if math.Abs(float64(got[0])-want) > 1e-5*math.Max(1, math.Abs(want)) {
		t.Errorf("SumTo = %g, want %g", got[0], want)
	}
}

// The kernels at their edges: grid-stride loops (more elements or rows
// than the grid has threads or blocks), rows of 1 element (a block of 32
// threads, 31 idle) and of more than a block (each thread loops), rows
// with no key left (masked or causal with Tq > Tk), targets and ids just
// outside the vocabulary slice, bias columns past a block of 32.
func TestGPUKernelEdges(t *testing.T) {
	b := newBench(t)
	n := b.gpu.sms*32*elemThreads*2 + 37 // two and a bit grid-stride rounds
	x, y := b.rand("x", 1, n), b.rand("y", 1, n)
	b.cpu.Axpy(y.c, 0.5, x.c)
	b.gpu.Axpy(y.g, 0.5, x.g)
	b.check("Axpy grid-stride", tol32, y)
	rows := b.gpu.sms*32*2 + 3 // more rows than blocks
	for _, c := range []int{1, 31, 33, maxRowThreads + 1, 2*maxRowThreads + 5} {
		r := rows
		if c > 64 {
			r = 3
		}
		inp, w, bias := b.rand("inp", 3, r, c), b.rand("weight", 1, c), b.rand("bias", 1, c)
		out, mean, rstd := b.zeros("out", r, c), b.zeros("mean", r), b.zeros("rstd", r)
		what := fmt.Sprintf("%d rows of %d", r, c)
		b.cpu.LayerNormForward(out.c, mean.c, rstd.c, inp.c, w.c, bias.c, 1e-5)
		b.gpu.LayerNormForward(out.g, mean.g, rstd.g, inp.g, w.g, bias.g, 1e-5)
		b.check("LayerNormForward "+what, tol32, out, mean, rstd)
		dinp, dw, db, dout := b.rand("dinp", 1, r, c), b.rand("dweight", 1, c), b.rand("dbias", 1, c), b.rand("dout", 1, r, c)
		b.cpu.LayerNormBackward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, mean.c, rstd.c)
		b.gpu.LayerNormBackward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, mean.g, rstd.g)
		b.check("LayerNormBackward "+what, tol32, dinp, dw, db)

		dbias := b.rand("dbias", 1, c)
		b.cpu.BiasBackward(dbias.c, inp.c)
		b.gpu.BiasBackward(dbias.g, inp.g)
		b.check("BiasBackward "+what, tol32, dbias)

		const v, start = 5, 10
		table, emb := b.rand("table", 1, v, c), b.rand("emb", 1, r, c)
		id := make([]int32, r)
		for i := range id {
			id[i] = int32(start - 1 + i%(v+2)) // start-1 .. start+v: both ends outside
		}
		b.cpu.EmbeddingForward(emb.c, id, table.c, start)
		b.gpu.EmbeddingForward(emb.g, id, table.g, start)
		b.check("EmbeddingForward "+what, 0, emb)
		b.cpu.EmbeddingBackward(table.c, emb.c, id, start)
		b.gpu.EmbeddingBackward(table.g, emb.g, id, start)
		b.check("EmbeddingBackward "+what, tol32, table)

		// Cross-entropy over a vocabulary slice of c logits starting at
		// 100: targets -1 (ignored), just below, at both ends, just past.
		logits := b.rand("logits", 8, r, c)
		rowMax, sumExp, tl, loss := b.zeros("rowMax", r), b.zeros("sumExp", r), b.zeros("targetLogit", r), b.zeros("losses", r)
		targets := make([]int32, r)
		for i := range targets {
			targets[i] = []int32{-1, 99, 100, int32(100 + c - 1), int32(100 + c)}[i%5]
		}
		b.cpu.CrossEntropyRowMax(rowMax.c, logits.c)
		b.gpu.CrossEntropyRowMax(rowMax.g, logits.g)
		b.cpu.CrossEntropySumExp(sumExp.c, logits.c, rowMax.c)
		b.gpu.CrossEntropySumExp(sumExp.g, logits.g, rowMax.g)
		b.cpu.CrossEntropyTargetLogit(tl.c, logits.c, targets, 100)
		b.gpu.CrossEntropyTargetLogit(tl.g, logits.g, targets, 100)
		b.cpu.CrossEntropyLoss(loss.c, rowMax.c, sumExp.c, tl.c, targets)
		b.gpu.CrossEntropyLoss(loss.g, rowMax.g, sumExp.g, tl.g, targets)
		b.check("CrossEntropy "+what, tol32, rowMax, sumExp, tl, loss)
		dlogits := b.rand("dlogits", 1e-3, r, c)
		b.cpu.CrossEntropyBackward(dlogits.c, logits.c, rowMax.c, sumExp.c, targets, 100, 0.25)
		b.gpu.CrossEntropyBackward(dlogits.g, logits.g, rowMax.g, sumExp.g, targets, 100, 0.25)
		b.check("CrossEntropyBackward "+what, tol32, dlogits)
		b.fusedClassifier("CrossEntropy "+what, logits, rowMax, sumExp, targets, 100, c-min(c-1, 3))
	}
	// Softmax: one key; more queries than keys under the causal mask (the
	// first rows see no key); a batch item with every key masked; more
	// rows than the grid has warps.
	for _, tt := range []struct {
		bsz, nh, tq, tk int
		causal, mask    bool
	}{
		{1, 1, 1, 1, true, false},
		{2, 2, 7, 3, true, false},
		{2, 1, 3, 1, false, true},
		{3, 5, 40, 45, true, true},
	} {
		inp := b.rand("inp", 4, tt.bsz, tt.nh, tt.tq, tt.tk)
		out := b.zeros("out", tt.bsz, tt.nh, tt.tq, tt.tk)
		var valid []int32
		if tt.mask {
			valid = ids(b.r, tt.bsz*tt.tk, 0, 2)
			for j := 0; j < tt.tk; j++ {
				valid[j] = 0
			}
		}
		what := fmt.Sprintf("%+v", tt)
		b.cpu.SoftmaxForward(out.c, inp.c, 0.3, tt.causal, valid)
		b.gpu.SoftmaxForward(out.g, inp.g, 0.3, tt.causal, valid)
		b.check("SoftmaxForward "+what, tol32, out)
		dinp, dout := b.rand("dinp", 1, tt.bsz, tt.nh, tt.tq, tt.tk), b.rand("dout", 1, tt.bsz, tt.nh, tt.tq, tt.tk)
		b.cpu.SoftmaxBackward(dinp.c, dout.c, out.c, 0.3)
		b.gpu.SoftmaxBackward(dinp.g, dout.g, out.g, 0.3)
		b.check("SoftmaxBackward "+what, tol32, dinp)
	}
}

// TestGPUBF16Storage checks bfloat16 tensors (tensor.Device.AllocAs): the
// copies from and to the host and between dtypes round to nearest even
// (ties, NaN, overflow) exactly as tensor.BF16FromFloat32 does, views at
// odd offsets address 2-byte elements, the allocation counts 2 bytes an
// element; and a GEMM at bf16 that reads a bfloat16 operand in place
// gives the bits of the one that rounds the float32 operand first, while
// at fp32 one is refused.
func TestGPUBF16Storage(t *testing.T) {
	bn := newBench(t)
	d := bn.gpu
	const n = 1001
	src := make([]float32, n)
	for i := range src {
		src[i] = (2*bn.r.Float32() - 1) * 3
	}
	ties := []float32{1 + 1.0/256, 1 + 3.0/256, -(1 + 1.0/256), float32(math.NaN()), float32(math.Inf(1)), math.MaxFloat32, 0x1p-130, 0}
	copy(src, ties)
	want := make([]float32, n)
	for i, v := range src {
		want[i] = tensor.Float32FromBF16(tensor.BF16FromFloat32(v))
	}
	same := func(what string, got []float32) {
		t.Helper()
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("%s: element %d is %g (%#x), want %g (%#x) from %g", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]), src[i])
			}
		}
	}
	before := d.MemStats().Current
	h, err := d.AllocAs(tensor.BFloat16, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(h)
	if got := d.MemStats().Current - before; got != 2*n || h.Bytes() != 2*n || h.DType() != tensor.BFloat16 {
		t.Errorf("a bfloat16 tensor of %d elements: %d bytes allocated, Bytes %d, %v; want %d", n, got, h.Bytes(), h.DType(), 2*n)
	}
	d.CopyFromHost(h, src)
	got := make([]float32, n)
	d.CopyToHost(got, h)
	same("CopyFromHost then CopyToHost", got)

	f := bn.zeros("f", n)
	d.CopyFromHost(f.g, src)
	h2, err := d.AllocAs(tensor.BFloat16, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(h2)
	d.Copy(h2, f.g) // round_bf16
	d.CopyToHost(got, h2)
	same("Copy float32 -> bfloat16", got)
	back := bn.zeros("back", n)
	d.Copy(back.g, h2) // widen_bf16
	d.CopyToHost(got, back.g)
	same("Copy bfloat16 -> float32", got)
	// Fill (fill_bf16) rounds its value once; Zero of a bfloat16 tensor.
	for _, v := range []float32{-1e30, 1 + 1.0/256, 0} {
		if v == 0 {
			d.Zero(h2.View(1, n-2))
		} else {
			d.Fill(h2.View(1, n-2), v)
		}
		d.CopyToHost(got, h2)
		if got[0] != want[0] || got[n-1] != want[n-1] {
			t.Fatalf("Fill(bfloat16 view, %g) wrote past the view: %g, %g; want %g, %g", v, got[0], got[n-1], want[0], want[n-1])
		}
		for i, x := range got[1 : n-1] {
			if w := tensor.Float32FromBF16(tensor.BF16FromFloat32(v)); x != w {
				t.Fatalf("Fill(bfloat16, %g): element %d is %g, want %g", v, i+1, x, w)
			}
		}
	}
	d.Copy(h2, f.g)
	// Views at an odd element: 2-byte steps.
	part := make([]float32, 500)
	d.Copy(h2.View(501, 500), h.View(3, 500))
	d.CopyToHost(part, h2.View(501, 500))
	want = want[3:503]
	same("Copy between bfloat16 views at odd offsets", part)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}

	// C = A B^T at bf16 with B float32 (rounded into scratch), then with
	// B's bfloat16 copy read in place (from its second row: 128 bytes in,
	// aligned as the scratch is, so that cuBLAS takes the same kernel):
	// the same bits. Then batched, the copy's rows in five matrices of
	// nine: within float32 reordering of the same products.
	const m, k, nn = 37, 64, 45
	a, b := bn.rand("a", 1, m, k), bn.rand("b", 1, nn+1, k)
	bh, err := d.AllocAs(tensor.BFloat16, nn+1, k)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(bh)
	d.Copy(bh, b.g)
	c1, c2, c3 := bn.zeros("c1", m, nn), bn.zeros("c2", m, nn), bn.zeros("c3", m, nn)
	d.SetMatmulPrecision(tensor.BF16)
	d.Gemm(false, true, m, nn, k, 1, a.g, 0, k, b.g, k, k, 0, c1.g, 0, nn)
	d.Gemm(false, true, m, nn, k, 1, a.g, 0, k, bh, k, k, 0, c2.g, 0, nn)
	d.GemmStridedBatched(false, true, m, nn/5, k, 1, a.g, 0, k, 0, bh, k, k, nn/5*k, 0, c3.g, 0, nn, nn/5, 5)
	r1, r2, r3 := make([]float32, m*nn), make([]float32, m*nn), make([]float32, m*nn)
	d.CopyToHost(r1, c1.g)
	d.CopyToHost(r2, c2.g)
	d.CopyToHost(r3, c3.g)
	for i := range r1 {
		if math.Float32bits(r1[i]) != math.Float32bits(r2[i]) {
			t.Fatalf("bf16 GEMM: element %d is %g with the float32 operand, %g with its bfloat16 copy", i, r1[i], r2[i])
		}
		if math.Abs(float64(r3[i]-r1[i])) > 1e-5*(1+math.Abs(float64(r1[i]))) {
			t.Fatalf("bf16 batched GEMM on the bfloat16 copy: element %d is %g, the single GEMM's %g", i, r3[i], r1[i])
		}
	}
	// A in bfloat16 too (an activation saved as bf16), B either: within
	// float32 reordering of the product of the same rounded values.
	ah, err := d.AllocAs(tensor.BFloat16, m, k)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(ah)
	d.Copy(ah, a.g)
	for _, bop := range []*tensor.Tensor{b.g, bh} {
		d.Gemm(false, true, m, nn, k, 1, ah, 0, k, bop, k, k, 0, c3.g, 0, nn)
		d.CopyToHost(r3, c3.g)
		for i := range r1 {
			if math.Abs(float64(r3[i]-r1[i])) > 1e-5*(1+math.Abs(float64(r1[i]))) {
				t.Fatalf("bf16 GEMM with a bfloat16 A, B %s: element %d is %g, want %g", bop.DType(), i, r3[i], r1[i])
			}
		}
	}
	d.SetMatmulPrecision(tensor.FP32)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}

	// The kernels with a bfloat16 output: the float32 kernel's values
	// rounded to nearest even.
	rounds := func(what string, full *tensor.Tensor) {
		t.Helper()
		wide, rounded := make([]float32, n), make([]float32, n)
		d.CopyToHost(wide, full)
		d.CopyToHost(rounded, h2)
		for i, v := range wide {
			if w := tensor.Float32FromBF16(tensor.BF16FromFloat32(v)); math.Float32bits(rounded[i]) != math.Float32bits(w) {
				t.Fatalf("%s into bfloat16: element %d is %g, want %g rounded, %g", what, i, rounded[i], v, w)
			}
		}
	}
	for _, fn := range []tensor.Activation{tensor.GELU, tensor.Tanh} {
		x, full := bn.rand("x", 3, n), bn.zeros("full", n)
		d.ActivationForward(fn, full.g, x.g)
		d.ActivationForward(fn, h2, x.g)
		rounds(fmt.Sprintf("activation %d", fn), full.g)
	}
	{
		const rows, f = 7, 143 // n = 1001
		x, full := bn.rand("x", 3, rows, 2*f), bn.zeros("full", rows, f)
		d.SwiGLUForward(full.g, x.g)
		d.SwiGLUForward(h2.Reshape(rows, f), x.g)
		rounds("SwiGLU", full.g)
	}
	{
		const rows, c = 11, 91 // n = 1001
		x, w, bias := bn.rand("x", 1, rows, c), bn.rand("w", 1, c), bn.rand("b", 1, c)
		full, mean, rstd := bn.zeros("full", rows, c), bn.zeros("mean", rows), bn.zeros("rstd", rows)
		hv := h2.Reshape(rows, c)
		d.LayerNormForward(full.g, mean.g, rstd.g, x.g, w.g, bias.g, 1e-5)
		d.LayerNormForward(hv, mean.g, rstd.g, x.g, w.g, bias.g, 1e-5)
		rounds("LayerNormForward", full.g)
		d.RMSNormForward(full.g, rstd.g, x.g, w.g, 1e-5)
		d.RMSNormForward(hv, rstd.g, x.g, w.g, 1e-5)
		rounds("RMSNormForward", full.g)
	}

	// The kernels that read a bfloat16 input (the MLP's pre-activation):
	// the float32 kernel on the widened input, to the bit; into bfloat16,
	// its values rounded.
	xh, err := d.AllocAs(tensor.BFloat16, n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(xh)
	sameBits := func(what string, got, want *tensor.Tensor) {
		t.Helper()
		sameGPUBits(t, d, what+" (want the float32 kernel on the widened input)", got, want)
	}
	for _, fn := range []tensor.Activation{tensor.GELU, tensor.Tanh} {
		x, xw, full, got := bn.rand("x", 3, n), bn.zeros("xw", n), bn.zeros("full", n), bn.zeros("got", n)
		d.Copy(xh, x.g)
		d.Copy(xw.g, xh)
		d.ActivationForward(fn, full.g, xw.g)
		d.ActivationForward(fn, got.g, xh)
		sameBits(fmt.Sprintf("activation %d from bfloat16", fn), got.g, full.g)
		d.ActivationForward(fn, h2, xh)
		rounds(fmt.Sprintf("activation %d from bfloat16 into bfloat16", fn), full.g)
		dout := bn.rand("dout", 1, n)
		d.ActivationBackward(fn, full.g, xw.g, dout.g)
		d.ActivationBackward(fn, got.g, xh, dout.g)
		sameBits(fmt.Sprintf("activation %d backward from bfloat16", fn), got.g, full.g)
	}
	{
		const rows, f = 7, 143
		x, xw := bn.rand("x", 3, rows, 2*f), bn.zeros("xw", rows, 2*f)
		full, got := bn.zeros("full", rows, f), bn.zeros("got", rows, f)
		x2h, err := d.AllocAs(tensor.BFloat16, rows, 2*f)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(x2h)
		d.Copy(x2h, x.g)
		d.Copy(xw.g, x2h)
		d.SwiGLUForward(full.g, xw.g)
		d.SwiGLUForward(got.g, x2h)
		sameBits("SwiGLU from bfloat16", got.g, full.g)
		d.SwiGLUForward(h2.Reshape(rows, f), x2h)
		rounds("SwiGLU from bfloat16 into bfloat16", full.g)
		dout, dw, dg := bn.rand("dout", 1, rows, f), bn.rand("dw", 1, rows, 2*f), bn.zeros("dg", rows, 2*f)
		d.Copy(dg.g, dw.g)
		d.SwiGLUBackward(dw.g, xw.g, dout.g)
		d.SwiGLUBackward(dg.g, x2h, dout.g)
		sameBits("SwiGLU backward from bfloat16", dg.g, dw.g)
		// bfloat16 gradients: the float32 kernel on the widened ones,
		// rounded into dinp, from either dtype of inp.
		for _, in := range []*tensor.Tensor{xw.g, x2h} {
			var hs [3]*tensor.Tensor
			for i, n := range []int{rows * f, rows * 2 * f, rows * 2 * f} {
				if hs[i], err = d.AllocAs(tensor.BFloat16, n); err != nil {
					t.Fatal(err)
				}
				defer d.Free(hs[i])
			}
			doH, diH, back := hs[0].Reshape(rows, f), hs[1].Reshape(rows, 2*f), hs[2].Reshape(rows, 2*f)
			d.Copy(doH, bn.rand("dout", 1, rows, f).g)
			d.Copy(diH, bn.rand("dinp", 1, rows, 2*f).g)
			doW, diW := bn.zeros("doutw", rows, f), bn.zeros("dinpw", rows, 2*f)
			d.Copy(doW.g, doH)
			d.Copy(diW.g, diH)
			d.SwiGLUBackward(diW.g, in, doW.g)
			d.SwiGLUBackward(diH, in, doH)
			d.Copy(back, diW.g)
			sameBits(fmt.Sprintf("SwiGLU backward into bfloat16 from %v", in.DType()), diH, back)
		}
	}
	{
		const rows, oc = 11, 91
		x, bias, full := bn.rand("x", 2, rows, oc), bn.rand("bias", 1, oc), bn.zeros("full", rows, oc)
		hv := h2.Reshape(rows, oc)
		d.Copy(hv, x.g)
		d.Copy(full.g, hv)
		d.AddBias(full.g, bias.g)
		d.AddBias(hv, bias.g)
		rounds("AddBias on bfloat16", full.g)
	}
	// RoPE on a bfloat16 x: widened, rotated, rounded again; a bfloat16
	// block copied as is.
	{
		const rows, seq, hd, heads = 12, 6, 8, 5
		x, xw, table := bn.rand("x", 1, rows, heads*hd), bn.zeros("xw", rows, heads*hd), bn.rand("table", 1, seq, hd)
		xr, err := d.AllocAs(tensor.BFloat16, rows, heads*hd)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(xr)
		d.Copy(xr, x.g)
		d.Copy(xw.g, xr)
		d.RoPEForward(xw.g, table.g, seq, heads, heads-1)
		d.RoPEForward(xr, table.g, seq, heads, heads-1)
		wide, got := make([]float32, xw.g.Len()), make([]float32, xw.g.Len())
		d.CopyToHost(wide, xw.g)
		d.CopyToHost(got, xr)
		for i, v := range wide {
			if w := tensor.Float32FromBF16(tensor.BF16FromFloat32(v)); math.Float32bits(got[i]) != math.Float32bits(w) {
				t.Fatalf("RoPE on bfloat16: element %d is %g, want %g rounded, %g", i, got[i], v, w)
			}
		}
		dst, err := d.AllocAs(tensor.BFloat16, rows, 2*hd)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(dst)
		d.Copy2D(dst, 1, 2*hd, xr, 3, heads*hd, rows, hd+2)
		blk := make([]float32, rows*2*hd)
		d.CopyToHost(blk, dst)
		for i := range rows {
			for j := range 2 * hd {
				want := float32(0)
				if j >= 1 && j < hd+3 {
					want = got[i*heads*hd+3+j-1]
				}
				if blk[i*2*hd+j] != want {
					t.Fatalf("Copy2D of bfloat16: (%d,%d) is %g, want %g", i, j, blk[i*2*hd+j], want)
				}
			}
		}
	}

	// A product into a bfloat16 C at bf16, beta 0 and 1: within a
	// bfloat16 rounding (and float32 reordering) of the float32 C.
	cb, err := d.AllocAs(tensor.BFloat16, m, nn)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(cb)
	d.SetMatmulPrecision(tensor.BF16)
	for _, beta := range []float32{0, 1} {
		for _, batched := range []bool{false, true} {
			d.Copy(c1.g, cb)
			if batched { // five matrices of nine columns, as the attention's heads
				d.GemmStridedBatched(false, true, m, nn/5, k, 1, ah, 0, k, 0, bh, k, k, nn/5*k, beta, c1.g, 0, nn, nn/5, 5)
				d.GemmStridedBatched(false, true, m, nn/5, k, 1, ah, 0, k, 0, bh, k, k, nn/5*k, beta, cb, 0, nn, nn/5, 5)
			} else {
				d.Gemm(false, true, m, nn, k, 1, ah, 0, k, bh, k, k, beta, c1.g, 0, nn)
				d.Gemm(false, true, m, nn, k, 1, ah, 0, k, bh, k, k, beta, cb, 0, nn)
			}
			d.CopyToHost(r1, c1.g)
			d.CopyToHost(r2, cb)
			for i := range r1 {
				if math.Abs(float64(r2[i]-r1[i])) > 0x1p-8*math.Abs(float64(r1[i]))+1e-6 {
					t.Fatalf("bf16 GEMM into a bfloat16 C, beta %g, batched %v: element %d is %g, the float32 C's %g", beta, batched, i, r2[i], r1[i])
				}
			}
		}
	}
	d.SetMatmulPrecision(tensor.FP32)
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Gemm(false, true, m, nn, k, 1, a.g, 0, k, bh, k, k, 0, c2.g, 0, nn)
	if err := d.Sync(); err == nil || !strings.Contains(err.Error(), "bfloat16 operands need bf16") {
		t.Errorf("a bfloat16 operand at fp32: Sync says %v, want a refusal", err)
	}
}
