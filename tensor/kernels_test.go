package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// testDevices are a serial CPU device and one that splits every kernel into
// three chunks however small, so both code paths meet every test.
func testDevices() []struct {
	name string
	d    *CPUDevice
} {
	serial := NewCPU()
	serial.SetThreads(1)
	par := NewCPU()
	par.SetThreads(3)
	par.minWork = 1
	return []struct {
		name string
		d    *CPUDevice
	}{{"serial", serial}, {"parallel", par}}
}

// eachDevice runs f on every test device, with the vector (assembly) loops
// and, where they are on, once more without them.
func eachDevice(t *testing.T, f func(t *testing.T, d *CPUDevice)) {
	vec := []bool{false}
	if useVecAsm {
		vec = []bool{true, false}
		defer func() { useVecAsm = true }()
	}
	for _, v := range vec {
		useVecAsm = v
		for _, td := range testDevices() {
			name := td.name + "-go"
			if v {
				name = td.name + "-vec"
			}
			t.Run(name, func(t *testing.T) { f(t, td.d) })
		}
	}
}

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = (r.Float32()*2 - 1) * scale
	}
	return s
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// upload allocates a tensor of the given shape on d holding data.
func upload(t *testing.T, d Device, data []float32, shape ...int) *Tensor {
	t.Helper()
	x, err := d.Alloc(shape...)
	if err != nil {
		t.Fatal(err)
	}
	d.CopyFromHost(x, data)
	return x
}

// uploadHalf is upload into a bfloat16 tensor: data rounded.
func uploadHalf(t *testing.T, d Device, data []float32, shape ...int) *Tensor {
	t.Helper()
	x, err := d.AllocAs(BFloat16, shape...)
	if err != nil {
		t.Fatal(err)
	}
	d.CopyFromHost(x, data)
	return x
}

// download copies x to a new host slice.
func download(x *Tensor) []float32 {
	h := make([]float32, x.Len())
	x.Device().CopyToHost(h, x)
	return h
}

// checkClose fails unless |got-want| <= tol*(1+|want|) everywhere.
func checkClose(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.Abs(g-w) > tol*(1+math.Abs(w)) {
			t.Fatalf("%s[%d] = %v, want %v (tolerance %g)", what, i, g, w, tol)
		}
	}
}

// checkGrad fails unless got is within tol of want relative to want's
// largest magnitude (finite-difference gradients are compared this way).
func checkGrad(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	scale = max(scale, 1e-3)
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.Abs(g-w) > tol*scale {
			t.Fatalf("%s[%d] = %v, want %v (tolerance %g of %g)", what, i, g, w, tol, scale)
		}
	}
}

// numGrad is dL/dx by central differences in float64, for L = loss()
// reading x.
func numGrad(x []float64, loss func() float64) []float64 {
	const h = 1e-6
	g := make([]float64, len(x))
	for i := range x {
		v := x[i]
		x[i] = v + h
		lp := loss()
		x[i] = v - h
		lm := loss()
		x[i] = v
		g[i] = (lp - lm) / (2 * h)
	}
	return g
}

// dot64 is sum(a*b).
func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// plus is base + d elementwise: the expected value of an accumulating gradient.
func plus(base []float32, d []float64) []float64 {
	out := make([]float64, len(d))
	for i := range d {
		out[i] = float64(base[i]) + d[i]
	}
	return out
}

// rowSizes are odd (N,C) sizes, including single rows and columns.
var rowSizes = [][2]int{{1, 1}, {1, 7}, {5, 1}, {7, 13}, {13, 33}}

func TestElementwise(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, n := range []int{1, 7, 1001} {
			a, b := randF32(r, n, 2), randF32(r, n, 2)
			ta, tb, to := upload(t, d, a, n), upload(t, d, b, n), upload(t, d, make([]float32, n), n)
			want := make([]float64, n)

			d.Add(to, ta, tb)
			for i := range want {
				want[i] = float64(a[i] + b[i])
			}
			checkClose(t, "Add", download(to), want, 0)

			d.Add(ta, ta, tb) // in place
			checkClose(t, "Add in place", download(ta), want, 0)
			d.CopyFromHost(ta, a)

			d.Axpy(tb, -0.75, ta)
			for i := range want {
				want[i] = float64(b[i]) - 0.75*float64(a[i])
			}
			checkClose(t, "Axpy", download(tb), want, 1e-6)

			d.Scale(ta, 3)
			for i := range want {
				want[i] = 3 * float64(a[i])
			}
			checkClose(t, "Scale", download(ta), want, 1e-6)

			d.Fill(ta, 2.5)
			for i := range want {
				want[i] = 2.5
			}
			checkClose(t, "Fill", download(ta), want, 0)
			d.Zero(ta)
			clear(want)
			checkClose(t, "Zero", download(ta), want, 0)

			d.Copy(ta, tb)
			checkClose(t, "Copy", download(ta), to64(download(tb)), 0)
		}
	})
}

func TestBlocks(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(27, 28))
		const rows, cols, ldSrc, ldDst, srcOff, dstOff = 7, 5, 13, 9, 4, 3
		src, dst := randF32(r, 100, 1), randF32(r, 70, 1)
		ts, td := upload(t, d, src, 100), upload(t, d, dst, 70)
		d.Copy2D(td, dstOff, ldDst, ts, srcOff, ldSrc, rows, cols)
		want := to64(dst)
		for i := 0; i < rows; i++ {
			for j := 0; j < cols; j++ {
				want[dstOff+i*ldDst+j] = float64(src[srcOff+i*ldSrc+j])
			}
		}
		checkClose(t, "Copy2D", download(td), want, 0)
		d.Axpy2D(td, dstOff, ldDst, -2, ts, srcOff, ldSrc, rows, cols)
		for i := 0; i < rows; i++ {
			for j := 0; j < cols; j++ {
				want[dstOff+i*ldDst+j] -= 2 * float64(src[srcOff+i*ldSrc+j])
			}
		}
		checkClose(t, "Axpy2D", download(td), want, 1e-6)
		mustPanic(t, "Copy2D past the end", "tensor.Copy2D: dst block ends at element 75", func() {
			d.Copy2D(td, dstOff+13, ldDst, ts, srcOff, ldSrc, rows, cols)
		})
		mustPanic(t, "Axpy2D ld", "bad src block", func() { d.Axpy2D(td, 0, ldDst, 1, ts, 0, 3, 2, 4) })
	})
}

func TestBias(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, sz := range rowSizes {
			n, oc := sz[0], sz[1]
			out, bias := randF32(r, n*oc, 1), randF32(r, oc, 1)
			tout, tbias := upload(t, d, out, n, oc), upload(t, d, bias, oc)
			d.AddBias(tout, tbias)
			want := make([]float64, n*oc)
			for i := range want {
				want[i] = float64(out[i] + bias[i%oc])
			}
			checkClose(t, fmt.Sprintf("AddBias %v", sz), download(tout), want, 0)

			// dbias += column sums, onto nonzero dbias.
			d.BiasBackward(tbias, tout)
			colsum := make([]float64, oc)
			for i, v := range want {
				colsum[i%oc] += v
			}
			checkClose(t, fmt.Sprintf("BiasBackward %v", sz), download(tbias), plus(bias, colsum), 1e-5)
		}
	})
}

func TestEmbedding(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(5, 6))
		const n, c, v, start = 19, 9, 11, 4 // this table holds ids [4,15)
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32(r.IntN(20)) // some outside the slice, some repeated
		}
		ids[0], ids[1], ids[2] = 3, 4, 14 // both edges and one below
		table := randF32(r, v*c, 1)
		ttable := upload(t, d, table, v, c)
		tout := upload(t, d, randF32(r, n*c, 1), n, c) // garbage to overwrite
		d.EmbeddingForward(tout, ids, ttable, start)
		want := make([]float64, n*c)
		for i, id := range ids {
			if j := int(id) - start; j >= 0 && j < v {
				for k := 0; k < c; k++ {
					want[i*c+k] = float64(table[j*c+k])
				}
			}
		}
		checkClose(t, "EmbeddingForward", download(tout), want, 0)

		dout := randF32(r, n*c, 1)
		tdout := upload(t, d, dout, n, c)
		dtable := randF32(r, v*c, 1)
		tdtable := upload(t, d, dtable, v, c)
		d.EmbeddingBackward(tdtable, tdout, ids, start)
		grad := make([]float64, v*c)
		for i, id := range ids {
			if j := int(id) - start; j >= 0 && j < v {
				for k := 0; k < c; k++ {
					grad[j*c+k] += float64(dout[i*c+k])
				}
			}
		}
		checkClose(t, "EmbeddingBackward", download(tdtable), plus(dtable, grad), 1e-6)
	})
}

func refGELU(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func TestGELU(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(9, 10))
		for _, n := range []int{1, 7, 333} {
			x := randF32(r, n, 5)
			x[0] = 0
			tx, tout := upload(t, d, x, n), upload(t, d, make([]float32, n), n)
			d.ActivationForward(GELU, tout, tx)
			x64 := to64(x)
			want := make([]float64, n)
			for i, v := range x64 {
				want[i] = refGELU(v)
			}
			checkClose(t, "GELUForward", download(tout), want, 2e-6)

			g := to64(randF32(r, n, 1))
			loss := func() float64 {
				var s float64
				for i, v := range x64 {
					s += refGELU(v) * g[i]
				}
				return s
			}
			dx0 := randF32(r, n, 1)
			tdx := upload(t, d, dx0, n)
			d.ActivationBackward(GELU, tdx, tx, upload(t, d, toF32(g), n))
			checkGrad(t, "GELUBackward", download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)

			d.ActivationForward(GELU, tx, tx) // in place
			checkClose(t, "GELUForward in place", download(tx), want, 2e-6)
		}
	})
}

// TestTanh checks the tanh activation against math.Tanh: rounded once
// (within half a float32 ulp) on random inputs and where tanh saturates,
// underflows or is signed zero, infinity or NaN; its gradient against
// finite differences and, at the edges, against 1 - tanh^2.
func TestTanh(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(11, 12))
		inf, nan := float32(math.Inf(1)), float32(math.NaN())
		edges := []float32{0, float32(math.Copysign(0, -1)), 1e-30, -1e-45, 1e-4, 0.5, 9, -9, 20, -20, 1e30, inf, -inf, nan}
		for _, n := range []int{1, 7, 333} {
			x := randF32(r, n, 4)
			tx, tout := upload(t, d, x, n), upload(t, d, make([]float32, n), n)
			d.ActivationForward(Tanh, tout, tx)
			x64 := to64(x)
			checkTanh(t, "forward", x, download(tout))

			g := to64(randF32(r, n, 1))
			loss := func() float64 {
				var s float64
				for i, v := range x64 {
					s += math.Tanh(v) * g[i]
				}
				return s
			}
			dx0 := randF32(r, n, 1)
			tdx := upload(t, d, dx0, n)
			d.ActivationBackward(Tanh, tdx, tx, upload(t, d, toF32(g), n))
			checkGrad(t, "tanh backward", download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)

			d.ActivationForward(Tanh, tx, tx) // in place
			checkTanh(t, "in place", x, download(tx))
		}
		n := len(edges)
		tx, tout := upload(t, d, edges, n), upload(t, d, make([]float32, n), n)
		d.ActivationForward(Tanh, tout, tx)
		checkTanh(t, "edges", edges, download(tout))
		dout := randF32(r, n, 1)
		tdx := upload(t, d, make([]float32, n), n)
		d.ActivationBackward(Tanh, tdx, tx, upload(t, d, dout, n))
		for i, got := range download(tdx) {
			y := math.Tanh(float64(edges[i]))
			want := float64(dout[i]) * (1 - y*y)
			if math.IsNaN(want) != math.IsNaN(float64(got)) || math.Abs(float64(got)-want) > 1e-6*math.Abs(float64(dout[i])) {
				t.Errorf("tanh backward at %g: %g, want %g", edges[i], got, want)
			}
		}
	})
}

// checkTanh fails unless each of got is math.Tanh of x rounded once: a
// float32 within half an ulp (2^-24 relative, 2^-150 absolute among the
// subnormals), of the same sign at zero, NaN for NaN.
func checkTanh(t *testing.T, what string, x, got []float32) {
	t.Helper()
	for i, v := range x {
		w, g := math.Tanh(float64(v)), float64(got[i])
		if math.IsNaN(w) != math.IsNaN(g) || math.Signbit(w) != math.Signbit(g) && !math.IsNaN(w) ||
			math.Abs(g-w) > max(0x1p-24*math.Abs(w), 0x1p-150) {
			t.Fatalf("%s: tanh(%g) = %g, math.Tanh %g", what, v, g, w)
		}
	}
}

func toF32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// refSoftmax is the masked softmax of scale*x over rows of tk in float64;
// x is (B,rows/B...,Tq,Tk).
func refSoftmax(x []float64, b, tq, tk int, scale float64, causal bool, keyValid []int32) []float64 {
	out := make([]float64, len(x))
	rows := len(x) / tk
	for r := 0; r < rows; r++ {
		item, q := r/(rows/b), r%tq
		ok := func(j int) bool {
			if causal && j > q+tk-tq {
				return false
			}
			return keyValid == nil || keyValid[item*tk+j] != 0
		}
		mx := math.Inf(-1)
		for j := 0; j < tk; j++ {
			if ok(j) {
				mx = max(mx, scale*x[r*tk+j])
			}
		}
		var s float64
		for j := 0; j < tk; j++ {
			if ok(j) {
				s += math.Exp(scale*x[r*tk+j] - mx)
			}
		}
		for j := 0; j < tk; j++ {
			if ok(j) {
				out[r*tk+j] = math.Exp(scale*x[r*tk+j]-mx) / s
			}
		}
	}
	return out
}

func TestSoftmax(t *testing.T) {
	cases := []struct {
		name           string
		b, h, tq, tk   int
		scale          float32
		causal, padded bool
	}{
		{"plain", 1, 1, 1, 1, 1, false, false},
		{"causal", 2, 3, 5, 5, 0.35, true, false},
		{"causal-rect", 2, 1, 3, 7, 1, true, false},
		{"padded", 3, 2, 4, 6, 0.5, false, true},
		{"causal-padded", 3, 2, 5, 5, 0.5, true, true},
		{"wide", 1, 2, 3, 21, 0.25, false, false},
		{"causal-wide", 2, 2, 9, 19, 0.7, true, false},
	}
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, tc := range cases {
			n := tc.b * tc.h * tc.tq * tc.tk
			x := randF32(r, n, 4)
			var keyValid []int32
			if tc.padded {
				keyValid = make([]int32, tc.b*tc.tk)
				for i := 0; i < tc.b; i++ {
					for j := 0; j < tc.tk; j++ {
						if i == 1 || (i == 0 && j < tc.tk-2) || (i == 2 && j%2 == 1) {
							keyValid[i*tc.tk+j] = 1 // item 0 right-padded, item 1 full, item 2 holes
						}
					}
				}
				keyValid[2*tc.tk+1] = 0 // a row of item 2 may see nothing under causality
			}
			tx := upload(t, d, x, tc.b, tc.h, tc.tq, tc.tk)
			tout := upload(t, d, randF32(r, n, 1), tc.b, tc.h, tc.tq, tc.tk)
			d.SoftmaxForward(tout, tx, tc.scale, tc.causal, keyValid)
			x64 := to64(x)
			want := refSoftmax(x64, tc.b, tc.tq, tc.tk, float64(tc.scale), tc.causal, keyValid)
			out := download(tout)
			checkClose(t, "SoftmaxForward "+tc.name, out, want, 1e-6)

			g := to64(randF32(r, n, 1))
			loss := func() float64 {
				return dot64(refSoftmax(x64, tc.b, tc.tq, tc.tk, float64(tc.scale), tc.causal, keyValid), g)
			}
			dx0 := randF32(r, n, 1)
			tdx := upload(t, d, dx0, tc.b, tc.h, tc.tq, tc.tk)
			d.SoftmaxBackward(tdx, upload(t, d, toF32(g), n), tout, tc.scale)
			checkGrad(t, "SoftmaxBackward "+tc.name, download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)

			d.SoftmaxForward(tx, tx, tc.scale, tc.causal, keyValid) // in place
			checkClose(t, "SoftmaxForward in place "+tc.name, download(tx), want, 1e-6)
		}
	})
}

// refCrossEntropy is the per-row loss -log softmax(x)[t] in float64, 0 for
// negative targets. x is (N,V).
func refCrossEntropy(x []float64, v int, targets []int32) []float64 {
	losses := make([]float64, len(targets))
	for i, tg := range targets {
		if tg < 0 {
			continue
		}
		row := x[i*v : (i+1)*v]
		mx := math.Inf(-1)
		for _, l := range row {
			mx = max(mx, l)
		}
		var s float64
		for _, l := range row {
			s += math.Exp(l - mx)
		}
		losses[i] = math.Log(s) + mx - row[tg]
	}
	return losses
}

func TestCrossEntropy(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(13, 14))
		const n, v = 7, 13
		x := randF32(r, n*v, 6)
		targets := []int32{0, 12, 5, -1, 7, 3, 9}
		tx := upload(t, d, x, n, v)
		alloc := func() *Tensor { return upload(t, d, make([]float32, n), n) }
		losses, rowMax, sumExp, tl := alloc(), alloc(), alloc(), alloc()
		d.CrossEntropyRowMax(rowMax, tx)
		d.CrossEntropySumExp(sumExp, tx, rowMax)
		d.CrossEntropyTargetLogit(tl, tx, targets, 0)
		d.CrossEntropyLoss(losses, rowMax, sumExp, tl, targets)
		x64 := to64(x)
		want := refCrossEntropy(x64, v, targets)
		checkClose(t, "CrossEntropy", download(losses), want, 1e-5)

		const dloss = 1.0 / 6 // mean over the 6 counted targets
		loss := func() float64 {
			var s float64
			for _, l := range refCrossEntropy(x64, v, targets) {
				s += l * dloss
			}
			return s
		}
		dx0 := randF32(r, n*v, 1)
		tdx := upload(t, d, dx0, n, v)
		d.CrossEntropyBackward(tdx, tx, rowMax, sumExp, targets, 0, dloss)
		full := download(tdx)
		checkGrad(t, "CrossEntropyBackward", full, plus(dx0, numGrad(x64, loss)), 1e-5)

		// Two vocab slices [0,6) and [6,13), combined as the all-reduces would.
		bounds := [][2]int{{0, 6}, {6, 13}}
		var slices, maxes, sums, tls []*Tensor
		for _, bd := range bounds {
			w := bd[1] - bd[0]
			part := make([]float32, n*w)
			for i := 0; i < n; i++ {
				copy(part[i*w:(i+1)*w], x[i*v+bd[0]:i*v+bd[1]])
			}
			slices = append(slices, upload(t, d, part, n, w))
			maxes, sums, tls = append(maxes, alloc()), append(sums, alloc()), append(tls, alloc())
		}
		allReduce := func(ts []*Tensor, op func(a, b float32) float32) {
			acc := download(ts[0])
			for _, tt := range ts[1:] {
				for i, v := range download(tt) {
					acc[i] = op(acc[i], v)
				}
			}
			for _, tt := range ts {
				d.CopyFromHost(tt, acc)
			}
		}
		sum := func(a, b float32) float32 { return a + b }
		for i := range bounds {
			d.CrossEntropyRowMax(maxes[i], slices[i])
		}
		allReduce(maxes, func(a, b float32) float32 { return max(a, b) })
		for i, bd := range bounds {
			d.CrossEntropySumExp(sums[i], slices[i], maxes[i])
			d.CrossEntropyTargetLogit(tls[i], slices[i], targets, bd[0])
		}
		allReduce(sums, sum)
		allReduce(tls, sum)
		d.CrossEntropyLoss(losses, maxes[0], sums[0], tls[0], targets)
		checkClose(t, "vocab-parallel CrossEntropy", download(losses), want, 1e-5)
		for i, bd := range bounds {
			w := bd[1] - bd[0]
			tdx := upload(t, d, make([]float32, n*w), n, w)
			d.CrossEntropyBackward(tdx, slices[i], maxes[i], sums[i], targets, bd[0], dloss)
			got := download(tdx)
			for row := 0; row < n; row++ {
				for j := 0; j < w; j++ {
					wantG := float64(full[row*v+bd[0]+j] - dx0[row*v+bd[0]+j])
					if g := float64(got[row*w+j]); math.Abs(g-wantG) > 1e-6 {
						t.Fatalf("vocab-parallel CrossEntropyBackward slice %d [%d,%d] = %v, unsharded %v", i, row, j, g, wantG)
					}
				}
			}
		}
	})
}

// TestFusedClassifier checks the fused cross-entropy against its pieces:
// CrossEntropyForward gives the pieces' rowMax, sumExp and losses to the
// bit, and CrossEntropyBackwardInPlace the gradient CrossEntropyBackward
// adds to zeros, to the bit, over the first cols columns, leaving the rest
// of the logits as they were; sharded slices likewise with their vocabStart.
func TestFusedClassifier(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(15, 16))
		for _, tc := range []struct{ n, v, cols, start int }{{7, 13, 13, 0}, {5, 37, 32, 0}, {9, 70, 61, 0}, {6, 40, 40, 30}, {3, 1, 0, 0}} {
			x := randF32(r, tc.n*tc.v, 8)
			targets := make([]int32, tc.n)
			for i := range targets {
				targets[i] = int32(tc.start + r.IntN(tc.v+tc.v/2)) // some outside the slice
				if tc.start == 0 {                                 // in the columns a padded head computes
					targets[i] = int32(r.IntN(max(tc.cols, 1)))
				}
			}
			targets[tc.n/2] = -1
			tx := upload(t, d, x, tc.n, tc.v)
			vec := func() *Tensor { return upload(t, d, make([]float32, tc.n), tc.n) }
			rowMax, sumExp, tl, losses := vec(), vec(), vec(), vec()
			d.CrossEntropyRowMax(rowMax, tx)
			d.CrossEntropySumExp(sumExp, tx, rowMax)
			name := fmt.Sprintf("n=%d v=%d cols=%d start=%d", tc.n, tc.v, tc.cols, tc.start)
			if tc.start == 0 {
				d.CrossEntropyTargetLogit(tl, tx, targets, 0)
				d.CrossEntropyLoss(losses, rowMax, sumExp, tl, targets)
				fMax, fSum, fLoss := vec(), vec(), vec()
				d.Fill(fLoss, 7)
				d.CrossEntropyForward(fLoss, fMax, fSum, tx, targets)
				for _, p := range [][2]*Tensor{{fMax, rowMax}, {fSum, sumExp}, {fLoss, losses}} {
					if !bitsEqual(download(p[0]), download(p[1])) {
						t.Fatalf("%s: CrossEntropyForward %v, the pieces %v", name, download(p[0]), download(p[1]))
					}
				}
			}
			const dloss = 0.3
			dx := upload(t, d, make([]float32, tc.n*tc.v), tc.n, tc.v)
			d.CrossEntropyBackward(dx, tx, rowMax, sumExp, targets, tc.start, dloss)
			d.CrossEntropyBackwardInPlace(tx, rowMax, sumExp, targets, tc.start, tc.cols, dloss)
			got, want := download(tx), download(dx)
			for i := 0; i < tc.n; i++ {
				for j := 0; j < tc.v; j++ {
					w := want[i*tc.v+j]
					if j >= tc.cols {
						w = x[i*tc.v+j]
					}
					if g := got[i*tc.v+j]; math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("%s: CrossEntropyBackwardInPlace [%d,%d] = %v, want %v", name, i, j, g, w)
					}
				}
			}
		}
	})
}

// TestBF16Classifier runs the cross-entropy kernels on bfloat16 logits (an
// LM head's under bf16 compute): every piece, the fused forward and the
// in-place backward give the float32 kernels' bits on float32 logits of
// the same (widened) values, the in-place gradient rounded once to
// bfloat16, the columns from cols on untouched; the losses match the
// definition on the widened values. Rows wider than a chunk's tile and a
// padded tail (cols < V) included.
func TestBF16Classifier(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(19, 20))
		for _, tc := range []struct{ n, v, cols, start int }{{7, 13, 13, 0}, {9, 1100, 1096, 0}, {6, 40, 40, 30}, {3, 1, 0, 0}} {
			name := fmt.Sprintf("n=%d v=%d cols=%d start=%d", tc.n, tc.v, tc.cols, tc.start)
			wide := make([]float32, tc.n*tc.v)
			for i, x := range randF32(r, len(wide), 8) {
				wide[i] = Float32FromBF16(BF16FromFloat32(x))
			}
			targets := make([]int32, tc.n)
			for i := range targets {
				targets[i] = int32(tc.start + r.IntN(max(tc.cols, 1)))
			}
			targets[tc.n/2] = -1
			half, err := d.AllocAs(BFloat16, tc.n, tc.v)
			if err != nil {
				t.Fatal(err)
			}
			d.CopyFromHost(half, wide) // exact: the values are bfloat16's
			tw := upload(t, d, wide, tc.n, tc.v)
			vec := func() *Tensor { return upload(t, d, make([]float32, tc.n), tc.n) }
			same := func(what string, got, want *Tensor) {
				t.Helper()
				if !bitsEqual(download(got), download(want)) {
					t.Fatalf("%s: %s on bfloat16 logits %v, on the widened float32 ones %v", name, what, download(got), download(want))
				}
			}
			hMax, hSum, hTL, wMax, wSum, wTL := vec(), vec(), vec(), vec(), vec(), vec()
			d.CrossEntropyRowMax(hMax, half)
			d.CrossEntropyRowMax(wMax, tw)
			same("CrossEntropyRowMax", hMax, wMax)
			d.CrossEntropySumExp(hSum, half, wMax)
			d.CrossEntropySumExp(wSum, tw, wMax)
			same("CrossEntropySumExp", hSum, wSum)
			d.CrossEntropyTargetLogit(hTL, half, targets, tc.start)
			d.CrossEntropyTargetLogit(wTL, tw, targets, tc.start)
			same("CrossEntropyTargetLogit", hTL, wTL)
			if tc.start == 0 {
				hLoss, wLoss := vec(), vec()
				d.CrossEntropyForward(hLoss, hMax, hSum, half, targets)
				d.CrossEntropyForward(wLoss, wMax, wSum, tw, targets)
				same("CrossEntropyForward", hLoss, wLoss)
				checkClose(t, name+" CrossEntropyForward", download(hLoss), refCrossEntropy(to64(wide), tc.v, targets), 1e-5)
			}
			const dloss = 0.3
			d.CrossEntropyBackwardInPlace(half, wMax, wSum, targets, tc.start, tc.cols, dloss)
			d.CrossEntropyBackwardInPlace(tw, wMax, wSum, targets, tc.start, tc.cols, dloss)
			got, want := half.HostBF16(), download(tw)
			for i, w := range want {
				if got[i] != BF16FromFloat32(w) {
					t.Fatalf("%s: CrossEntropyBackwardInPlace element %d is %#x, want %g rounded (%#x)", name, i, got[i], w, BF16FromFloat32(w))
				}
			}
		}
		// Fill and Zero of a bfloat16 tensor: the value rounded once.
		h, err := d.AllocAs(BFloat16, 1031)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []float32{-1e30, 1.00390625, 0} {
			if v == 0 {
				d.Zero(h)
			} else {
				d.Fill(h, v)
			}
			for i, u := range h.HostBF16() {
				if u != BF16FromFloat32(v) {
					t.Fatalf("Fill(bfloat16, %g): element %d is %#x, want %#x", v, i, u, BF16FromFloat32(v))
				}
			}
		}
	})
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestAdamWCutAnywhere updates a tensor whole and, from the same state,
// in ranges of odd lengths (as ZeRO-1 cuts parameters over DP ranks): the
// results must be the same to the bit, whichever elements a range's tail
// holds.
func TestAdamWCutAnywhere(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(17, 18))
		const n = 4099
		p, g, m, v := randF32(r, n, 1), randF32(r, n, 1), randF32(r, n, 0.1), randF32(r, n, 0.01)
		for i := range v {
			v[i] *= v[i]
		}
		hp := AdamWParams{Step: 3, LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
		scale := upload(t, d, []float32{0.7}, 1)
		whole := []*Tensor{upload(t, d, p, n), upload(t, d, g, n), upload(t, d, m, n), upload(t, d, v, n)}
		half, err := d.AllocAs(BFloat16, n) // rounded a piece at a time (adamPiece < n)
		if err != nil {
			t.Fatal(err)
		}
		d.AdamW(whole[0], whole[1], whole[2], whole[3], half, hp, scale)
		for i, w := range download(whole[0]) {
			if half.HostBF16()[i] != BF16FromFloat32(w) {
				t.Fatalf("the bf16 copy's element %d is %#x, want %g rounded", i, half.HostBF16()[i], w)
			}
		}
		cut := []*Tensor{upload(t, d, p, n), upload(t, d, g, n), upload(t, d, m, n), upload(t, d, v, n)}
		for off, k := 0, 0; off < n; k++ {
			l := min([]int{1, 13, 7, 1030, 3, 999, 8, 2047}[k%8], n-off)
			d.AdamW(cut[0].View(off, l), cut[1].View(off, l), cut[2].View(off, l), cut[3].View(off, l), nil, hp, scale)
			off += l
		}
		for j, name := range []string{"param", "", "m", "v"} {
			if name == "" {
				continue
			}
			a, b := download(whole[j]), download(cut[j])
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("%s[%d]: %v updated whole, %v updated in ranges", name, i, a[i], b[i])
				}
			}
		}
	})
}

func TestAdamW(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(15, 16))
		const n = 1003
		p := randF32(r, n, 1)
		tp := upload(t, d, p, n)
		tg, tm, tv := upload(t, d, make([]float32, n), n), upload(t, d, make([]float32, n), n), upload(t, d, make([]float32, n), n)
		p64, m64, v64 := to64(p), make([]float64, n), make([]float64, n)
		hp := AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
		scale := upload(t, d, []float32{0.5}, 1)
		for step := 1; step <= 4; step++ {
			g := randF32(r, n, 1)
			d.CopyFromHost(tg, g)
			hp.Step = step
			s, gs := scale, 0.5
			if step == 4 {
				s, gs = nil, 1 // no scale tensor: 1
			}
			d.AdamW(tp, tg, tm, tv, nil, hp, s)
			b1, b2 := float64(hp.Beta1), float64(hp.Beta2)
			for i := range p64 {
				gi := float64(g[i]) * gs
				m64[i] = b1*m64[i] + (1-b1)*gi
				v64[i] = b2*v64[i] + (1-b2)*gi*gi
				mh := m64[i] / (1 - math.Pow(b1, float64(step)))
				vh := v64[i] / (1 - math.Pow(b2, float64(step)))
				p64[i] -= float64(hp.LR) * (mh/(math.Sqrt(vh)+float64(hp.Eps)) + float64(hp.WeightDecay)*p64[i])
			}
			checkClose(t, fmt.Sprintf("AdamW step %d param", step), download(tp), p64, 1e-5)
			checkClose(t, fmt.Sprintf("AdamW step %d m", step), download(tm), m64, 1e-5)
			checkClose(t, fmt.Sprintf("AdamW step %d v", step), download(tv), v64, 1e-5)
		}
	})
}

// TestSumSquaresEach: each tensor's sum of squares (of a view, of a nil
// tensor) as a float64, and 0 in out's slots past them.
func TestSumSquaresEach(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(17, 18))
		a, b := randF32(r, 1001, 3), randF32(r, 7, 3)
		ta, tb := upload(t, d, a, 1001), upload(t, d, b, 7)
		want := make([]float64, 4)
		for _, v := range a[10:20] {
			want[0] += float64(v) * float64(v)
		}
		for _, v := range b {
			want[2] += float64(v) * float64(v)
		}
		out := upload(t, d, randF32(r, 8, 1), 8)
		d.SumSquaresEach(out, ta.View(10, 10), nil, tb)
		h := download(out)
		for i, w := range want {
			if got := Float64At(h, i); math.Abs(got-w) > 1e-12*w || (got == 0) != (w == 0) {
				t.Fatalf("SumSquaresEach %d = %v, want %v", i, got, w)
			}
		}
	})
}

func TestExp32(t *testing.T) {
	for x := -87.0; x <= 88.3; x += 0.0137 {
		got, want := float64(exp32(float32(x))), math.Exp(float64(float32(x)))
		if math.Abs(got-want) > 3e-7*want {
			t.Fatalf("exp32(%v) = %v, want %v", x, got, want)
		}
	}
	for _, x := range []float32{-100, -88, float32(math.Inf(-1))} { // flushed to zero below the normal range
		if got := exp32(x); got != 0 {
			t.Fatalf("exp32(%v) = %v, want 0", x, got)
		}
	}
	for _, x := range []float32{89, float32(math.Inf(1))} {
		if got := exp32(x); !math.IsInf(float64(got), 1) {
			t.Fatalf("exp32(%v) = %v, want +Inf", x, got)
		}
	}
	if v := exp32(float32(math.NaN())); v == v {
		t.Fatalf("exp32(NaN) = %v", v)
	}
}

// naiveGemm is C = alpha*op(A)*op(B) + beta*C in float64 on row-major
// matrices with leading dimensions.
func naiveGemm(transA, transB bool, m, n, k int, alpha float64, a []float32, lda int, b []float32, ldb int, beta float64, c []float64, ldc int) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if transA {
					ai = p*lda + i
				}
				if transB {
					bi = j*ldb + p
				}
				av, bv := a[ai], b[bi]
				s += float64(av) * float64(bv)
			}
			c[i*ldc+j] = alpha*s + beta*c[i*ldc+j]
		}
	}
}

func TestGemmOnTensors(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(19, 20))
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			const m, n, k, aOff, bOff, cOff, lda, ldb, ldc = 7, 9, 13, 3, 5, 2, 17, 19, 11
			a, b, c := randF32(r, 400, 1), randF32(r, 400, 1), randF32(r, 200, 1)
			ta, tb, tc := upload(t, d, a, 400), upload(t, d, b, 400), upload(t, d, c, 200)
			d.Gemm(tr[0], tr[1], m, n, k, 0.5, ta, aOff, lda, tb, bOff, ldb, 1.5, tc, cOff, ldc)
			want := to64(c)
			naiveGemm(tr[0], tr[1], m, n, k, 0.5, a[aOff:], lda, b[bOff:], ldb, 1.5, want[cOff:], ldc)
			checkClose(t, fmt.Sprintf("Gemm trans %v", tr), download(tc), want, 1e-5)
		}

		// Attention scores per head: att[b,h] = scale * q[b,:,h] @ k[b,:,h]^T
		// read in place from qkv (B,T,3C), one strided batch over heads per b.
		const B, T, NH, hs = 2, 5, 3, 4
		const C = NH * hs
		qkv := randF32(r, B*T*3*C, 1)
		tqkv := upload(t, d, qkv, B, T, 3*C)
		tatt := upload(t, d, randF32(r, B*NH*T*T, 1), B, NH, T, T)
		for b := 0; b < B; b++ {
			d.GemmStridedBatched(false, true, T, T, hs, 0.5, tqkv, b*T*3*C, 3*C, hs, tqkv, b*T*3*C+C, 3*C, hs, 0, tatt, b*NH*T*T, T, T*T, NH)
		}
		want := make([]float64, B*NH*T*T)
		for b := 0; b < B; b++ {
			for h := 0; h < NH; h++ {
				base := b * T * 3 * C
				naiveGemm(false, true, T, T, hs, 0.5, qkv[base+h*hs:], 3*C, qkv[base+C+h*hs:], 3*C, 0, want[(b*NH+h)*T*T:], T)
			}
		}
		checkClose(t, "GemmStridedBatched attention", download(tatt), want, 1e-5)
	})
}

func TestLinear(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(21, 22))
		const n, c, oc = 7, 5, 9
		x, w, b := randF32(r, n*c, 1), randF32(r, oc*c, 1), randF32(r, oc, 1)
		tx, tw, tb := upload(t, d, x, n, c), upload(t, d, w, oc, c), upload(t, d, b, oc)
		tout := upload(t, d, randF32(r, n*oc, 1), n, oc)
		LinearForward(tout, tx, tw, tb)
		want := make([]float64, n*oc)
		naiveGemm(false, true, n, oc, c, 1, x, c, w, c, 0, want, oc)
		for i := range want {
			want[i] += float64(b[i%oc])
		}
		checkClose(t, "LinearForward", download(tout), want, 1e-5)

		g := randF32(r, n*oc, 1)
		dx0, dw0, db0 := randF32(r, n*c, 1), randF32(r, oc*c, 1), randF32(r, oc, 1)
		tdx, tdw, tdb := upload(t, d, dx0, n, c), upload(t, d, dw0, oc, c), upload(t, d, db0, oc)
		LinearBackward(tdx, tdw, tdb, upload(t, d, g, n, oc), tx, tw)
		wdx, wdw, wdb := to64(dx0), to64(dw0), to64(db0)
		naiveGemm(false, false, n, c, oc, 1, g, oc, w, c, 1, wdx, c)
		naiveGemm(true, false, oc, c, n, 1, g, oc, x, c, 1, wdw, c)
		for i, v := range g {
			wdb[i%oc] += float64(v)
		}
		checkClose(t, "LinearBackward dinp", download(tdx), wdx, 1e-5)
		checkClose(t, "LinearBackward dweight", download(tdw), wdw, 1e-5)
		checkClose(t, "LinearBackward dbias", download(tdb), wdb, 1e-5)
	})
}

func TestTensorViews(t *testing.T) {
	d := NewCPU()
	x, err := d.Alloc(4, 6)
	if err != nil {
		t.Fatal(err)
	}
	if x.Len() != 24 || x.Rank() != 2 || x.Dim(-1) != 6 || x.Rows() != 4 || x.Cols() != 6 || x.Bytes() != 96 {
		t.Fatalf("Alloc(4,6) = %v len %d", x, x.Len())
	}
	d.CopyFromHost(x, toF32(func() []float64 {
		s := make([]float64, 24)
		for i := range s {
			s[i] = float64(i)
		}
		return s
	}()))
	v := x.View(6, 2, 3)
	if got := v.Host(); got[0] != 6 || got[5] != 11 || len(got) != 6 || cap(got) != 6 {
		t.Fatalf("View(6,2,3).Host() = %v (cap %d)", got, cap(got))
	}
	if v.Offset() != 6 || v.Buffer() != x.Buffer() || v.Device() != Device(d) {
		t.Fatalf("View shares the buffer at offset 6: got offset %d", v.Offset())
	}
	vv := v.View(3, 3).Reshape(1, 3)
	if got := vv.Host(); got[0] != 9 || vv.Offset() != 9 || vv.String() != "Tensor(1,3) on cpu" {
		t.Fatalf("nested view = %v %v", got, vv)
	}
	if x.Ptr() != 0 {
		t.Fatalf("cpu Ptr = %#x, want 0", x.Ptr())
	}

	mustPanic(t, "View outside", "outside", func() { x.View(20, 5) })
	mustPanic(t, "Reshape", "elements", func() { x.Reshape(5, 5) })
	mustPanic(t, "Dim", "dimension", func() { x.Dim(2) })
	if _, err := d.Alloc(3, -1); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("Alloc(3,-1) error = %v", err)
	}
}

func TestMemoryAccounting(t *testing.T) {
	d := NewCPU()
	a, _ := d.Alloc(10, 10)
	b, _ := d.Alloc(25)
	if s := d.MemStats(); s.Current != 500 || s.Peak != 500 {
		t.Fatalf("after two allocs: %+v, want 500/500", s)
	}
	d.Free(a.View(0, 5)) // freeing through a view frees the buffer
	d.Free(a)            // a second free does nothing
	if s := d.MemStats(); s.Current != 100 || s.Peak != 500 {
		t.Fatalf("after free: %+v, want 100/500", s)
	}
	d.ResetPeak()
	if s := d.MemStats(); s.Peak != 100 {
		t.Fatalf("after ResetPeak: %+v, want peak 100", s)
	}
	c, _ := d.Alloc(50)
	d.Free(c)
	if s := d.MemStats(); s.Current != 100 || s.Peak != 300 {
		t.Fatalf("after alloc+free of 200 bytes: %+v, want 100/300", s)
	}
	mustPanic(t, "Host after Free", "freed", func() { a.Host() })
	mustPanic(t, "kernel after Free", "freed", func() { d.Zero(a) })
	other := NewCPU()
	mustPanic(t, "other device", "not on this cpu device", func() { other.Zero(b) })
	if Default() != Default() {
		t.Fatal("Default() returns different devices")
	}
}

func mustPanic(t *testing.T, what, substr string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		p := recover()
		if p == nil {
			t.Fatalf("%s: no panic", what)
		}
		if msg := fmt.Sprint(p); !strings.Contains(msg, substr) || strings.Contains(msg, "\n") {
			t.Fatalf("%s: panic %q, want one line containing %q", what, msg, substr)
		}
	}()
	f()
}

func TestBadShapes(t *testing.T) {
	d := NewCPU()
	a := func(shape ...int) *Tensor {
		x, err := d.Alloc(shape...)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	x23, x32, x6, x3, x2 := a(2, 3), a(3, 2), a(6), a(3), a(2)
	cases := []struct {
		name, want string
		f          func()
	}{
		{"Add", "tensor.Add: b", func() { d.Add(x23, x23, x3) }},
		{"AddBias", "not a multiple of 2", func() { d.AddBias(x3, x2) }},
		{"LayerNorm", "tensor.LayerNormForward: mean", func() { d.LayerNormForward(x23, x3, x2, x23, x3, x3, 1e-5) }},
		{"Embedding ids", "len(ids)=1", func() { d.EmbeddingForward(x23, []int32{0}, x32, 0) }},
		{"Softmax keyValid", "keyValid", func() { d.SoftmaxForward(x23, x23, 1, false, []int32{1, 1, 1}) }},
		{"Softmax rank", "at least (Tq,Tk)", func() { d.SoftmaxForward(x6, x6, 1, false, nil) }},
		{"CE targets", "len(targets)=1", func() { d.CrossEntropyBackward(x23, x23, x2, x2, []int32{1}, 0, 1) }},
		{"Activation", "tensor.ActivationForward: unknown activation 9", func() { d.ActivationForward(9, x6, x6) }},
		{"AdamW step", "counts from 1", func() { d.AdamW(x6, x6, x6, x6, nil, AdamWParams{}, nil) }},
		{"AdamW scale", "tensor.AdamW: scale", func() { d.AdamW(x6, x6, x6, x6, nil, AdamWParams{Step: 1}, x6.View(0, 0)) }},
		{"CopyFromHost", "len(src)=2", func() { d.CopyFromHost(x6, []float32{1, 2}) }},
		{"Gemm offset", "offset 7", func() { d.Gemm(false, false, 1, 1, 1, 1, x6, 7, 1, x6, 0, 1, 0, x6, 0, 1) }},
		{"Gemm short", "tensor.Sgemm", func() { d.Gemm(false, false, 2, 3, 3, 1, x6, 0, 3, x6, 0, 3, 0, x6, 0, 3) }},
		{"MatMul", "tensor.MatMul", func() { MatMul(x23, x23, x23, false, false, 1, 0) }},
	}
	for _, tc := range cases {
		mustPanic(t, tc.name, tc.want, tc.f)
	}
}

// TestNoAllocs checks that kernels in steady state allocate nothing, split
// over workers or not.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		const n, c, v = 6, 8, 10
		a := func(shape ...int) *Tensor {
			x, err := d.Alloc(shape...)
			if err != nil {
				t.Fatal(err)
			}
			return x
		}
		x, y, z, w, b := a(n, c), a(n, c), a(n, c), a(c), a(c)
		mean, rstd, logits, dlogits, att := a(n), a(n), a(n, v), a(n, v), a(2, 3, 4, 4)
		sumExp, tlogit := a(n), a(n)
		ids := make([]int32, n)
		keyValid := []int32{1, 1, 1, 0, 1, 1, 1, 1}
		d.Fill(y, 1)
		d.Fill(rstd, 1)
		d.Fill(logits, 0.5)
		hp := AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Step: 1}
		scale := b.View(0, 1)
		ts, sq := []*Tensor{x, nil, y}, a(6)
		kernels := map[string]func(){
			"Fill":       func() { d.Fill(x, 1) },
			"Add":        func() { d.Add(z, x, y) },
			"Axpy":       func() { d.Axpy(z, 2, x) },
			"Scale":      func() { d.Scale(z, 0.5) },
			"Copy":       func() { d.Copy(z, x) },
			"Copy2D":     func() { d.Copy2D(z, 1, c, x, 2, c, n-1, c-2) },
			"Axpy2D":     func() { d.Axpy2D(z, 1, c, 2, x, 2, c, n-1, c-2) },
			"AddBias":    func() { d.AddBias(z, b) },
			"BiasBack":   func() { d.BiasBackward(b, z) },
			"Embed":      func() { d.EmbeddingForward(x, ids, z, 0) },
			"EmbedBack":  func() { d.EmbeddingBackward(z, x, ids, 0) },
			"LayerNorm":  func() { d.LayerNormForward(z, mean, rstd, x, w, b, 1e-5) },
			"LNBack":     func() { d.LayerNormBackward(z, w, b, y, x, w, mean, rstd) },
			"AddLN":      func() { d.AddLayerNormForward(z, y, mean, rstd, x, x, w, b, 1e-5) },
			"AddRMS":     func() { d.AddRMSNormForward(z, y, rstd, x, x, w, 1e-5) },
			"GELU":       func() { d.ActivationForward(GELU, z, x) },
			"GELUBack":   func() { d.ActivationBackward(GELU, z, x, y) },
			"Tanh":       func() { d.ActivationForward(Tanh, z, x) },
			"TanhBack":   func() { d.ActivationBackward(Tanh, z, x, y) },
			"Softmax":    func() { d.SoftmaxForward(att, att, 0.5, true, keyValid) },
			"SoftmaxBck": func() { d.SoftmaxBackward(att, att, att, 0.5) },
			"CE": func() {
				d.CrossEntropyRowMax(rstd, logits)
				d.CrossEntropySumExp(sumExp, logits, rstd)
				d.CrossEntropyTargetLogit(tlogit, logits, ids, 0)
				d.CrossEntropyLoss(mean, rstd, sumExp, tlogit, ids)
			},
			"CEFused":    func() { d.CrossEntropyForward(mean, rstd, sumExp, logits, ids) },
			"CEBack":     func() { d.CrossEntropyBackward(dlogits, logits, rstd, rstd, ids, 0, 0.1) },
			"CEInPlace":  func() { d.CrossEntropyBackwardInPlace(dlogits, rstd, rstd, ids, 0, dlogits.Cols()-1, 0.1) },
			"AdamW":      func() { d.AdamW(x, y, z, y, nil, hp, nil) },
			"AdamWScale": func() { d.AdamW(x, y, z, y, nil, hp, scale) },
			"SumSquares": func() { d.SumSquaresEach(sq, ts...) },
			"Gemm":       func() { d.Gemm(false, true, n, n, c, 1, x, 0, c, y, 0, c, 0, att, 0, n) },
		}
		// The kernels' bfloat16 paths, which widen and round in tiles.
		half := func(shape ...int) *Tensor {
			x, err := d.AllocAs(BFloat16, shape...)
			if err != nil {
				t.Fatal(err)
			}
			return x
		}
		h, hc, g2, sq, d2 := half(n, c), half(n, c), half(n, 2*c), a(c, c), a(n, 2*c)
		kernels["GELU bf16"] = func() { d.ActivationForward(GELU, hc, h) }
		kernels["GELUBack bf16"] = func() { d.ActivationBackward(GELU, z, h, y) }
		kernels["AddBias bf16"] = func() { d.AddBias(hc, b) }
		kernels["Gemm bf16"] = func() { d.Gemm(false, true, n, c, c, 1, h, 0, c, sq, 0, c, 0, hc, 0, c) }
		kernels["SwiGLU bf16"] = func() { d.SwiGLUForward(hc, g2) }
		kernels["SwiGLUBack bf16"] = func() { d.SwiGLUBackward(d2, g2, y) }
		dg2 := half(n, 2*c)
		kernels["SwiGLUBack bf16 grads"] = func() { d.SwiGLUBackward(dg2, g2, hc) }
		attH := half(att.Shape()...)
		kernels["SoftmaxBck bf16"] = func() { d.SoftmaxBackward(attH, att, attH, 0.5) }
		kernels["BiasGELU"] = func() { d.BiasActivationForward(GELU, z, x, b) }
		kernels["BiasGELU bf16"] = func() { d.BiasActivationForward(GELU, hc, h, b) }
		kernels["GELUBackInPlace"] = func() { d.ActivationBackwardInPlace(GELU, z, x) }
		kernels["GELUBackInPlace bf16"] = func() { d.ActivationBackwardInPlace(GELU, z, h) }
		kernels["GELUBackInPlace bf16 dout"] = func() { d.ActivationBackwardInPlace(GELU, hc, h) }
		kernels["BiasBack bf16"] = func() { d.BiasBackward(b, hc) }
		for name, f := range kernels {
			f() // warm scratch
			if allocs := testing.AllocsPerRun(20, f); allocs != 0 {
				t.Errorf("%s: %v allocations per call", name, allocs)
			}
		}
	})
}

// refAttention is AttentionForward in float64. qkv is (B,T,3C).
func refAttention(qkv []float64, b, t, nh, hs int, causal bool, keyValid []int32) []float64 {
	c := nh * hs
	out := make([]float64, b*t*c)
	scores := make([]float64, t*t)
	for i := 0; i < b; i++ {
		for h := 0; h < nh; h++ {
			at := func(tok, part, j int) float64 { return qkv[(i*t+tok)*3*c+part*c+h*hs+j] }
			for q := 0; q < t; q++ {
				for k := 0; k < t; k++ {
					var s float64
					for j := 0; j < hs; j++ {
						s += at(q, 0, j) * at(k, 1, j)
					}
					scores[q*t+k] = s
				}
			}
			var kv []int32
			if keyValid != nil {
				kv = keyValid[i*t : (i+1)*t]
			}
			att := refSoftmax(scores, 1, t, t, 1/math.Sqrt(float64(hs)), causal, kv)
			for q := 0; q < t; q++ {
				for j := 0; j < hs; j++ {
					var s float64
					for k := 0; k < t; k++ {
						s += att[q*t+k] * at(k, 2, j)
					}
					out[(i*t+q)*c+h*hs+j] = s
				}
			}
		}
	}
	return out
}

func TestAttention(t *testing.T) {
	// The shapes cover both loop orders of headGemms (B < NH, B > NH) and
	// the single-call cases (B = 1, NH = 1).
	shapes := []struct{ b, t, nh, hs int }{{2, 5, 3, 2}, {3, 4, 2, 3}, {1, 4, 3, 2}, {3, 3, 1, 4}}
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(23, 24))
		for _, sh := range shapes {
			b, tt, nh, hs := sh.b, sh.t, sh.nh, sh.hs
			c := nh * hs
			keyValid := make([]int32, b*tt)
			for i := range keyValid {
				if i%tt < tt-1-i/tt%2 { // pad the last key of every other item
					keyValid[i] = 1
				}
			}
			for _, causal := range []bool{false, true} {
				for _, kv := range [][]int32{nil, keyValid} {
					name := fmt.Sprintf("B=%d T=%d NH=%d hs=%d causal=%v padded=%v", b, tt, nh, hs, causal, kv != nil)
					qkv := randF32(r, b*tt*3*c, 1)
					tqkv := upload(t, d, qkv, b, tt, 3*c)
					att := upload(t, d, make([]float32, b*nh*tt*tt), b, nh, tt, tt)
					out := upload(t, d, randF32(r, b*tt*c, 1), b, tt, c)
					AttentionForward(out, att, nil, tqkv, nh, causal, kv)
					q64 := to64(qkv)
					checkClose(t, "AttentionForward "+name, download(out), refAttention(q64, b, tt, nh, hs, causal, kv), 1e-5)

					g := randF32(r, b*tt*c, 1)
					g64 := to64(g)
					loss := func() float64 { return dot64(refAttention(q64, b, tt, nh, hs, causal, kv), g64) }
					dq0 := randF32(r, len(qkv), 1)
					dqkv := upload(t, d, dq0, b, tt, 3*c)
					scratch := func() *Tensor { return upload(t, d, randF32(r, att.Len(), 1), b, nh, tt, tt) }
					AttentionBackward(dqkv, scratch(), scratch(), upload(t, d, g, b, tt, c), tqkv, att, nh)
					checkGrad(t, "AttentionBackward "+name, download(dqkv), plus(dq0, numGrad(q64, loss)), 1e-5)
				}
			}
		}
	})
}

// TestAttentionBF16Probabilities runs the unfused attention with bfloat16
// probabilities (the scores in float32 scratch first): they are the
// float32 path's rounded, to the bit; the output and the gradients are
// the float32 path's on the widened probabilities, to the bit (the
// products widen bfloat16 operands as they pack them); and the output
// stays within bfloat16's rounding of the definition's. With a bfloat16
// gradient of the scores too, that gradient is the float32 one rounded,
// to the bit, and the gradient of qkv within bfloat16 of the float32
// path's. Grouped-query heads likewise.
func TestAttentionBF16Probabilities(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(27, 28))
		for _, sh := range []struct{ b, t, nh, nkv, hs int }{{2, 5, 3, 3, 2}, {3, 7, 2, 2, 4}, {2, 6, 4, 2, 2}} {
			b, tt, nh, nkv, hs := sh.b, sh.t, sh.nh, sh.nkv, sh.hs
			name := fmt.Sprintf("B=%d T=%d NH=%d KV=%d hs=%d", b, tt, nh, nkv, hs)
			width := (nh + 2*nkv) * hs
			qkv := upload(t, d, randF32(r, b*tt*width, 1), b, tt, width)
			att32 := upload(t, d, make([]float32, b*nh*tt*tt), b, nh, tt, tt)
			att16, err := d.AllocAs(BFloat16, b, nh, tt, tt)
			if err != nil {
				t.Fatal(err)
			}
			scores := upload(t, d, make([]float32, att32.Len()), att32.Len())
			out32, out16, outW := upload(t, d, make([]float32, b*tt*nh*hs), b, tt, nh*hs), upload(t, d, make([]float32, b*tt*nh*hs), b, tt, nh*hs), upload(t, d, make([]float32, b*tt*nh*hs), b, tt, nh*hs)
			forward := func(out, att, scores *Tensor) {
				if nkv == nh {
					AttentionForward(out, att, scores, qkv, nh, true, nil)
				} else {
					GroupedAttentionForward(out, att, scores, qkv, nh, nkv, true, nil)
				}
			}
			// backward returns the gradient of qkv, stored as grads as the
			// gradient of the output is (values bf16 rounds to themselves),
			// and the scores' (dpre, stored as dpre).
			doutVals := randF32(rand.New(rand.NewPCG(1, 2)), out32.Len(), 1)
			for i, v := range doutVals {
				doutVals[i] = Float32FromBF16(BF16FromFloat32(v))
			}
			backwardAs := func(att *Tensor, dpre, grads DType) ([]float32, *Tensor) {
				alloc := func(dt DType, shape ...int) *Tensor {
					x, err := d.AllocAs(dt, shape...)
					if err != nil {
						t.Fatal(err)
					}
					return x
				}
				dq, pre := alloc(grads, b, tt, width), alloc(dpre, b, nh, tt, tt)
				datt := upload(t, d, make([]float32, att.Len()), b, nh, tt, tt)
				dout := alloc(grads, b, tt, nh*hs)
				d.CopyFromHost(dout, doutVals)
				if nkv == nh {
					AttentionBackward(dq, datt, pre, dout, qkv, att, nh)
				} else {
					GroupedAttentionBackward(dq, datt, pre, dout, qkv, att, nh, nkv)
				}
				return download(dq), pre
			}
			backward := func(att *Tensor) []float32 {
				dq, _ := backwardAs(att, Float32, Float32)
				return dq
			}
			forward(out32, att32, nil)
			forward(out16, att16, scores)
			for i, v := range download(att32) {
				if att16.HostBF16()[i] != BF16FromFloat32(v) {
					t.Fatalf("%s: probability %d is %#x, want %g rounded", name, i, att16.HostBF16()[i], v)
				}
			}
			attW := upload(t, d, download(att16), b, nh, tt, tt) // the probabilities widened
			if nkv == nh {
				c := nh * hs
				_, _, v := qkvHeads(qkv, tt, c, hs)
				headGemms(d, false, false, tt, hs, tt, ttHeads(attW, tt, nh), v, 0, rowHeads(outW, tt, c, hs), b, nh)
			} else {
				for g := 0; g < nh/nkv; g++ {
					_, _, v, a, o := groupHeads(qkv, attW, outW, tt, nh, nkv, hs, g)
					headGemms(d, false, false, tt, hs, tt, a, v, 0, o, b, nkv)
				}
			}
			if !bitsEqual(download(out16), download(outW)) {
				t.Errorf("%s: the output from bfloat16 probabilities is not the float32 product's of the widened ones", name)
			}
			checkClose(t, name+" output", download(out16), to64(download(out32)), 1.0/64)
			if !bitsEqual(backward(att16), backward(attW)) {
				t.Errorf("%s: the gradient from bfloat16 probabilities is not the float32 path's from the widened ones", name)
			}
			// A bfloat16 gradient of the scores: the float32 one rounded,
			// and a gradient of qkv within bfloat16 of the float32 path's.
			dq32, pre32 := backwardAs(att16, Float32, Float32)
			dq16, pre16 := backwardAs(att16, BFloat16, Float32)
			for i, v := range download(pre32) {
				if pre16.HostBF16()[i] != BF16FromFloat32(v) {
					t.Fatalf("%s: the scores' gradient %d is %#x, want %g rounded", name, i, pre16.HostBF16()[i], v)
				}
			}
			checkClose(t, name+" qkv gradient from a bfloat16 dpre", dq16, to64(dq32), 1.0/64)
			// bfloat16 gradients of the output and of qkv (each element
			// of qkv's one product's sum, but a group's keys and values):
			// the float32 gradient rounded.
			if nkv == nh {
				half, _ := backwardAs(att16, BFloat16, BFloat16)
				for i, v := range dq16 {
					if w := Float32FromBF16(BF16FromFloat32(v)); math.Float32bits(half[i]) != math.Float32bits(w) {
						t.Fatalf("%s: the bfloat16 qkv gradient %d is %g, want %g rounded, %g", name, i, half[i], v, w)
					}
				}
			}
		}
	})
}

// TestConcurrentDevices runs kernels from several goroutines at once, on
// separate devices and on one shared device, through the shared worker pool
// (run it with -race).
func TestConcurrentDevices(t *testing.T) {
	shared := NewCPU()
	shared.minWork = 1
	devs := []*CPUDevice{shared, shared, NewCPU(), NewCPU()}
	for _, d := range devs {
		d.minWork = 1
	}
	const n, c = 33, 17
	r := rand.New(rand.NewPCG(25, 26))
	x, w, b := randF32(r, n*c, 1), randF32(r, c, 1), randF32(r, c, 1)
	want, _, _ := refLayerNorm(to64(x), to64(w), to64(b), c, 1e-5)
	errs := make(chan error, len(devs))
	for i, d := range devs {
		go func() {
			errs <- func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("device %d: %v", i, p)
					}
				}()
				a := func(data []float32, shape ...int) *Tensor {
					x, _ := d.Alloc(shape...)
					d.CopyFromHost(x, data)
					return x
				}
				tx, tw, tb := a(x, n, c), a(w, c), a(b, c)
				out, mean, rstd := a(make([]float32, n*c), n, c), a(make([]float32, n), n), a(make([]float32, n), n)
				for rep := 0; rep < 50; rep++ {
					d.LayerNormForward(out, mean, rstd, tx, tw, tb, 1e-5)
					got := download(out)
					for j, v := range want {
						if math.Abs(float64(got[j])-v) > 1e-5*(1+math.Abs(v)) {
							return fmt.Errorf("device %d rep %d: out[%d] = %v, want %v", i, rep, j, got[j], v)
						}
					}
				}
				return nil
			}()
		}()
	}
	for range devs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// refActivation is f(x) and f'(x) from the definitions, in float64: GELU's
// tanh approximation and tanh.
func refActivation(f Activation, x float64) (y, dy float64) {
	if f == Tanh {
		y = math.Tanh(x)
		return y, 1 - y*y
	}
	const s, a = 0.7978845608028654, 0.044715
	t := math.Tanh(s * (x + a*x*x*x))
	return 0.5 * x * (1 + t), 0.5*(1+t) + 0.5*x*(1-t*t)*s*(1+3*a*x*x)
}

// TestBiasActivation checks the fused bias and activation against the
// definitions in float64, with pre and out in either dtype (pre's stored
// sums exact: the float32 sum, rounded when bfloat16; out within 5e-7 of
// |x|+|f(x)|, plus the bfloat16 rounding when out is), rows wider
// than a tile; and ActivationBackwardInPlace against ActivationBackward
// into zeros, bit for bit, from either dtype of its input.
func TestBiasActivation(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(21, 22))
		for _, tc := range []struct{ n, oc int }{{5, 13}, {3, 600}, {7, 1030}} {
			for _, f := range []Activation{GELU, Tanh} {
				for _, dts := range [][2]DType{{Float32, Float32}, {BFloat16, Float32}, {Float32, BFloat16}, {BFloat16, BFloat16}} {
					name := fmt.Sprintf("%dx%d f%d pre %v out %v", tc.n, tc.oc, f, dts[0], dts[1])
					x, bias := randF32(r, tc.n*tc.oc, 3), randF32(r, tc.oc, 1)
					pre, _ := d.AllocAs(dts[0], tc.n, tc.oc)
					out, _ := d.AllocAs(dts[1], tc.n, tc.oc)
					tb := upload(t, d, bias, tc.oc)
					d.CopyFromHost(pre, x)
					x = make([]float32, len(x))
					d.CopyToHost(x, pre) // as stored
					d.BiasActivationForward(f, out, pre, tb)
					gotPre, gotOut := make([]float32, len(x)), make([]float32, len(x))
					d.CopyToHost(gotPre, pre)
					d.CopyToHost(gotOut, out)
					for i := range x {
						want := x[i] + bias[i%tc.oc]
						if dts[0] == BFloat16 {
							want = Float32FromBF16(BF16FromFloat32(want))
						}
						if gotPre[i] != want {
							t.Fatalf("%s: pre[%d] = %g, want %g", name, i, gotPre[i], want)
						}
						y, _ := refActivation(f, float64(want))
						// GELU as x - x/(e+1) cancels for negative x: the
						// float32 error is relative to |x|.
						tol := 5e-7 * (math.Abs(y) + math.Abs(float64(want)))
						if dts[1] == BFloat16 {
							tol += math.Abs(y) / 256
						}
						if e := math.Abs(float64(gotOut[i]) - y); e > tol {
							t.Fatalf("%s: out[%d] = %g, want %g (f of %g)", name, i, gotOut[i], y, want)
						}
					}
					// The backward from the stored pre, in place and not.
					g := randF32(r, len(x), 1)
					dx := upload(t, d, make([]float32, len(x)), tc.n, tc.oc)
					dg := upload(t, d, g, tc.n, tc.oc)
					d.ActivationBackward(f, dx, pre, dg)
					d.ActivationBackwardInPlace(f, dg, pre)
					if got, want := download(dg), download(dx); !bitsEqual(got, want) {
						t.Fatalf("%s: ActivationBackwardInPlace differs from ActivationBackward into zeros", name)
					}
					for i, v := range download(dg) {
						_, dy := refActivation(f, float64(gotPre[i]))
						if w := dy * float64(g[i]); math.Abs(float64(v)-w) > 1e-6*math.Abs(float64(g[i]))*(1+math.Abs(float64(gotPre[i]))) {
							t.Fatalf("%s: backward [%d] = %g, want %g", name, i, v, w)
						}
					}
					// A bfloat16 gradient in place: the float32 kernel's
					// result on the widened gradient, rounded; and its
					// column sums, as BiasBackward's of the widened values.
					gh, _ := d.AllocAs(BFloat16, tc.n, tc.oc)
					d.CopyFromHost(gh, g)
					gw := make([]float32, len(g))
					d.CopyToHost(gw, gh)
					dw := upload(t, d, gw, tc.n, tc.oc)
					d.ActivationBackwardInPlace(f, dw, pre)
					d.ActivationBackwardInPlace(f, gh, pre)
					for i, v := range download(dw) {
						if got := gh.HostBF16()[i]; got != BF16FromFloat32(v) {
							t.Fatalf("%s: bfloat16 dout [%d] = %#x, want %g rounded, %#x", name, i, got, v, BF16FromFloat32(v))
						}
					}
					sums := make([]float64, tc.oc)
					for i, v := range gh.HostBF16() {
						sums[i%tc.oc] += float64(Float32FromBF16(v))
					}
					db := upload(t, d, make([]float32, tc.oc), tc.oc)
					d.BiasBackward(db, gh)
					checkClose(t, name+": BiasBackward of a bfloat16 dout", download(db), sums, 1e-5)
					for _, x := range []*Tensor{gh, dw, db} {
						d.Free(x)
					}
				}
			}
		}
	})
}

// TestAddNorm: the residual add fused into the layer norm or RMSNorm after
// it gives Add's sum and the norm's outputs to the bit, into float32 or
// bfloat16, the sum written apart or over an addend.
func TestAddNorm(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(23, 24))
		for _, sh := range []struct{ n, c int }{{3, 1}, {9, 771}} {
			w, bias := upload(t, d, randF32(r, sh.c, 1), sh.c), upload(t, d, randF32(r, sh.c, 1), sh.c)
			for _, dt := range []DType{Float32, BFloat16} {
				for _, inPlace := range []bool{false, true} {
					name := fmt.Sprintf("%dx%d %v in place %v", sh.n, sh.c, dt, inPlace)
					vec := func() *Tensor { return upload(t, d, make([]float32, sh.n), sh.n) }
					a, b := upload(t, d, randF32(r, sh.n*sh.c, 2), sh.n, sh.c), upload(t, d, randF32(r, sh.n*sh.c, 2), sh.n, sh.c)
					want := upload(t, d, make([]float32, sh.n*sh.c), sh.n, sh.c)
					d.Add(want, a, b)
					sum := upload(t, d, make([]float32, sh.n*sh.c), sh.n, sh.c)
					if inPlace {
						sum = b
					}
					out, _ := d.AllocAs(dt, sh.n, sh.c)
					out2, _ := d.AllocAs(dt, sh.n, sh.c)
					m, rs, m2, rs2 := vec(), vec(), vec(), vec()
					d.LayerNormForward(out2, m2, rs2, want, w, bias, 1e-5)
					d.AddLayerNormForward(sum, out, m, rs, a, b, w, bias, 1e-5)
					same := func(what string, got, want *Tensor) {
						t.Helper()
						g, wv := make([]float32, got.Len()), make([]float32, want.Len())
						d.CopyToHost(g, got)
						d.CopyToHost(wv, want)
						if !bitsEqual(g, wv) {
							t.Fatalf("%s %s: not the unfused kernels' bits", name, what)
						}
					}
					same("AddLayerNormForward sum", sum, want)
					same("AddLayerNormForward out", out, out2)
					same("AddLayerNormForward mean", m, m2)
					same("AddLayerNormForward rstd", rs, rs2)

					a = upload(t, d, randF32(r, sh.n*sh.c, 2), sh.n, sh.c)
					if inPlace {
						sum = a
						b = upload(t, d, randF32(r, sh.n*sh.c, 2), sh.n, sh.c)
					}
					d.Add(want, a, b)
					d.RMSNormForward(out2, rs2, want, w, 1e-5)
					d.AddRMSNormForward(sum, out, rs, a, b, w, 1e-5)
					same("AddRMSNormForward sum", sum, want)
					same("AddRMSNormForward out", out, out2)
					same("AddRMSNormForward rstd", rs, rs2)
				}
			}
		}
	})
}
