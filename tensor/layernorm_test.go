package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refLayerNorm is layernorm in float64. x is (N,C), w and b are (C).
func refLayerNorm(x, w, b []float64, c int, eps float64) (out, mean, rstd []float64) {
	n := len(x) / c
	out, mean, rstd = make([]float64, len(x)), make([]float64, n), make([]float64, n)
	for i := 0; i < n; i++ {
		row := x[i*c : (i+1)*c]
		var m, v float64
		for _, xv := range row {
			m += xv
		}
		m /= float64(c)
		for _, xv := range row {
			v += (xv - m) * (xv - m)
		}
		rs := 1 / math.Sqrt(v/float64(c)+eps)
		for j, xv := range row {
			out[i*c+j] = (xv-m)*rs*w[j] + b[j]
		}
		mean[i], rstd[i] = m, rs
	}
	return out, mean, rstd
}

func TestLayerNorm(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(7, 8))
		for _, sz := range rowSizes {
			n, c := sz[0], sz[1]
			const eps = 1e-5
			x, w, b := randF32(r, n*c, 2), randF32(r, c, 1), randF32(r, c, 1)
			for i := range x {
				x[i] += 0.5 // a nonzero mean
			}
			tx, tw, tb := upload(t, d, x, n, c), upload(t, d, w, c), upload(t, d, b, c)
			tout, tmean, trstd := upload(t, d, make([]float32, n*c), n, c), upload(t, d, make([]float32, n), n), upload(t, d, make([]float32, n), n)
			d.LayerNormForward(tout, tmean, trstd, tx, tw, tb, eps)
			x64, w64, b64 := to64(x), to64(w), to64(b)
			out, mean, rstd := refLayerNorm(x64, w64, b64, c, eps)
			name := fmt.Sprintf("%dx%d", n, c)
			checkClose(t, "LayerNormForward out "+name, download(tout), out, 1e-5)
			checkClose(t, "LayerNormForward mean "+name, download(tmean), mean, 1e-6)
			checkClose(t, "LayerNormForward rstd "+name, download(trstd), rstd, 1e-5)

			g := randF32(r, n*c, 1)
			g64 := to64(g)
			loss := func() float64 {
				o, _, _ := refLayerNorm(x64, w64, b64, c, eps)
				return dot64(o, g64)
			}
			dx0, dw0, db0 := randF32(r, n*c, 1), randF32(r, c, 1), randF32(r, c, 1)
			tdx, tdw, tdb := upload(t, d, dx0, n, c), upload(t, d, dw0, c), upload(t, d, db0, c)
			d.LayerNormBackward(tdx, tdw, tdb, upload(t, d, g, n, c), tx, tw, tmean, trstd)
			checkGrad(t, "LayerNormBackward dinp "+name, download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)
			checkGrad(t, "LayerNormBackward dweight "+name, download(tdw), plus(dw0, numGrad(w64, loss)), 1e-5)
			checkGrad(t, "LayerNormBackward dbias "+name, download(tdb), plus(db0, numGrad(b64, loss)), 1e-5)
		}
	})
}

// A residual stream stored as bfloat16 on the CPU: the norms reading a
// bfloat16 input (forward and backward) give the float32 kernels' bits on
// the widened input; a residual add into a bfloat16 sum (from a float32 or
// a bfloat16 a, fused into a norm or Add alone) stores a + b rounded to
// nearest even, from the definition, and the fused norm normalises that
// rounded sum; a bfloat16 a with a float32 sum is refused.
func TestNormsOfBF16Residual(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(31, 32))
		for _, sh := range [][2]int{{3, 1}, {7, 37}, {65, 64}} {
			n, c := sh[0], sh[1]
			name := fmt.Sprintf("%dx%d", n, c)
			half := func(v []float32) *Tensor { return uploadHalf(t, d, v, n, c) }
			widened := func(h *Tensor) []float32 { return download(h) }
			w, bias := upload(t, d, randF32(r, c, 1), c), upload(t, d, randF32(r, c, 1), c)
			xh := half(randF32(r, n*c, 3))
			x := upload(t, d, widened(xh), n, c)
			stats := func() (*Tensor, *Tensor) {
				return upload(t, d, make([]float32, n), n), upload(t, d, make([]float32, n), n)
			}
			for _, outDT := range []DType{Float32, BFloat16} {
				alloc := func() *Tensor {
					o, err := d.AllocAs(outDT, n, c)
					if err != nil {
						t.Fatal(err)
					}
					return o
				}
				o1, o2 := alloc(), alloc()
				m1, r1 := stats()
				m2, r2 := stats()
				d.LayerNormForward(o1, m1, r1, xh, w, bias, 1e-5)
				d.LayerNormForward(o2, m2, r2, x, w, bias, 1e-5)
				if !bitsEqual(download(o1), download(o2)) || !bitsEqual(download(m1), download(m2)) || !bitsEqual(download(r1), download(r2)) {
					t.Errorf("%s out %v: LayerNormForward of a bfloat16 inp is not the float32 kernel's on the widened one", name, outDT)
				}
				d.RMSNormForward(o1, r1, xh, w, 1e-5)
				d.RMSNormForward(o2, r2, x, w, 1e-5)
				if !bitsEqual(download(o1), download(o2)) || !bitsEqual(download(r1), download(r2)) {
					t.Errorf("%s out %v: RMSNormForward of a bfloat16 inp is not the float32 kernel's on the widened one", name, outDT)
				}
				yv := randF32(r, n*c, 2)
				y := upload(t, d, yv, n, c)
				for _, aHalf := range []bool{false, true} {
					av := randF32(r, n*c, 2)
					a := upload(t, d, av, n, c)
					if aHalf {
						a = half(av)
						av = widened(a)
					}
					want := make([]float32, n*c) // a + b rounded, by the definition
					for i := range want {
						want[i] = Float32FromBF16(BF16FromFloat32(av[i] + yv[i]))
					}
					what := fmt.Sprintf("%s out %v a bfloat16 %v", name, outDT, aHalf)
					if aHalf {
						sum := half(make([]float32, n*c))
						d.Add(sum, a, y)
						if !bitsEqual(download(sum), want) {
							t.Errorf("%s: Add into a bfloat16 sum is not a + b rounded", what)
						}
					}
					sumW := upload(t, d, want, n, c)
					for _, norm := range []string{"layer", "rms"} {
						sum := half(make([]float32, n*c))
						if norm == "layer" {
							d.AddLayerNormForward(sum, o1, m1, r1, a, y, w, bias, 1e-5)
							d.LayerNormForward(o2, m2, r2, sumW, w, bias, 1e-5)
						} else {
							d.AddRMSNormForward(sum, o1, r1, a, y, w, 1e-5)
							d.RMSNormForward(o2, r2, sumW, w, 1e-5)
						}
						if !bitsEqual(download(sum), want) {
							t.Errorf("%s: the %s norm's bfloat16 sum is not a + b rounded", what, norm)
						}
						sameMean := norm == "rms" || bitsEqual(download(m1), download(m2)) // RMSNorm keeps no mean
						if !bitsEqual(download(o1), download(o2)) || !sameMean || !bitsEqual(download(r1), download(r2)) {
							t.Errorf("%s: the %s norm of a bfloat16 sum does not normalise the rounded sum", what, norm)
						}
					}
				}
			}
			// The backward of a bfloat16 inp.
			m, rs := stats()
			d.LayerNormForward(upload(t, d, make([]float32, n*c), n, c), m, rs, x, w, bias, 1e-5)
			dout := upload(t, d, randF32(r, n*c, 1), n, c)
			grads := func() []*Tensor {
				return []*Tensor{upload(t, d, make([]float32, n*c), n, c), upload(t, d, make([]float32, c), c), upload(t, d, make([]float32, c), c)}
			}
			g1, g2 := grads(), grads()
			d.LayerNormBackward(g1[0], g1[1], g1[2], dout, xh, w, m, rs)
			d.LayerNormBackward(g2[0], g2[1], g2[2], dout, x, w, m, rs)
			for i := range g1 {
				if !bitsEqual(download(g1[i]), download(g2[i])) {
					t.Errorf("%s: LayerNormBackward of a bfloat16 inp is not the float32 kernel's on the widened one (gradient %d)", name, i)
				}
			}
			d.RMSNormForward(upload(t, d, make([]float32, n*c), n, c), rs, x, w, 1e-5)
			g1, g2 = grads(), grads()
			d.RMSNormBackward(g1[0], g1[1], dout, xh, w, rs)
			d.RMSNormBackward(g2[0], g2[1], dout, x, w, rs)
			for i := range 2 {
				if !bitsEqual(download(g1[i]), download(g2[i])) {
					t.Errorf("%s: RMSNormBackward of a bfloat16 inp is not the float32 kernel's on the widened one (gradient %d)", name, i)
				}
			}
			func() {
				defer func() {
					if e := recover(); e == nil || !strings.Contains(fmt.Sprint(e), "needs a bfloat16 sum") {
						t.Errorf("a bfloat16 a into a float32 sum: %v, want a refusal", e)
					}
				}()
				m, rs := stats()
				d.AddLayerNormForward(x, upload(t, d, make([]float32, n*c), n, c), m, rs, xh, x, w, bias, 1e-5)
			}()
		}
	})
}

// TestResidualGradBF16: the kernels that read or write a residual
// stream's bfloat16 gradient. Axpy is y + alpha*x in float32 on the
// widened values, rounded once into a bfloat16 y (from the definition);
// the norms' backward into a bfloat16 dinp or from a bfloat16 dout (a
// norm output's gradient) is the float32 kernel's on the widened values,
// rounded once into dinp, with the same weight gradients;
// EmbeddingBackward of a bfloat16 dout the float32 kernel's on the
// widened dout; and the embeddings' forward into the stream (the looked
// up rows, Add of float32 a and b) rounds once.
func TestResidualGradBF16(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(41, 42))
		for _, sh := range [][2]int{{3, 1}, {7, 37}, {65, 640}} {
			n, c := sh[0], sh[1]
			name := fmt.Sprintf("%dx%d", n, c)
			half := func(v []float32) *Tensor { return uploadHalf(t, d, v, n, c) }
			rounded := func(v []float32) []float32 {
				out := make([]float32, len(v))
				for i, x := range v {
					out[i] = Float32FromBF16(BF16FromFloat32(x))
				}
				return out
			}
			xh, yh := half(randF32(r, n*c, 2)), half(randF32(r, n*c, 2))
			xv, yv := download(xh), download(yh)
			for _, dts := range [][2]DType{{Float32, BFloat16}, {BFloat16, Float32}, {BFloat16, BFloat16}} {
				y, x := upload(t, d, yv, n, c), upload(t, d, xv, n, c)
				if dts[0] == BFloat16 {
					y = half(yv)
				}
				if dts[1] == BFloat16 {
					x = xh
				}
				want := make([]float32, n*c)
				for i := range want {
					want[i] = yv[i] + -0.75*xv[i]
				}
				if dts[0] == BFloat16 {
					want = rounded(want)
				}
				d.Axpy(y, -0.75, x)
				if got := download(y); !bitsEqual(got, want) {
					t.Errorf("%s: Axpy of y %v, x %v is not y - 0.75x (rounded where y is bfloat16)", name, dts[0], dts[1])
				}
			}

			w, bias := upload(t, d, randF32(r, c, 1), c), upload(t, d, randF32(r, c, 1), c)
			gv := download(half(randF32(r, n*c, 1)))
			for _, inp := range []*Tensor{upload(t, d, xv, n, c), xh} {
				m, rs := upload(t, d, make([]float32, n), n), upload(t, d, make([]float32, n), n)
				dv := download(half(randF32(r, n*c, 1)))
				for _, dts := range [][2]DType{{BFloat16, Float32}, {Float32, BFloat16}, {BFloat16, BFloat16}} {
					what := fmt.Sprintf("%s inp %v dinp %v dout %v", name, inp.DType(), dts[0], dts[1])
					grads := func() (dinp, dout *Tensor) {
						dinp, dout = upload(t, d, dv, n, c), upload(t, d, gv, n, c)
						if dts[0] == BFloat16 {
							dinp = half(dv)
						}
						if dts[1] == BFloat16 {
							dout = half(gv)
						}
						return dinp, dout
					}
					zeros := func() []*Tensor {
						return []*Tensor{upload(t, d, make([]float32, c), c), upload(t, d, make([]float32, c), c)}
					}
					want := func(d32 *Tensor) []float32 {
						if dts[0] == BFloat16 {
							return rounded(download(d32))
						}
						return download(d32)
					}
					d.LayerNormForward(upload(t, d, make([]float32, n*c), n, c), m, rs, inp, w, bias, 1e-5)
					dinp, dout := grads()
					d32, g1, g2 := upload(t, d, dv, n, c), zeros(), zeros()
					d.LayerNormBackward(dinp, g1[0], g1[1], dout, inp, w, m, rs)
					d.LayerNormBackward(d32, g2[0], g2[1], upload(t, d, gv, n, c), inp, w, m, rs)
					if !bitsEqual(download(dinp), want(d32)) || !bitsEqual(download(g1[0]), download(g2[0])) || !bitsEqual(download(g1[1]), download(g2[1])) {
						t.Errorf("%s: LayerNormBackward is not the float32 kernel's on the widened values, rounded once into a bfloat16 dinp", what)
					}
					d.RMSNormForward(upload(t, d, make([]float32, n*c), n, c), rs, inp, w, 1e-5)
					dinp, dout = grads()
					d32, g1, g2 = upload(t, d, dv, n, c), zeros(), zeros()
					d.RMSNormBackward(dinp, g1[0], dout, inp, w, rs)
					d.RMSNormBackward(d32, g2[0], upload(t, d, gv, n, c), inp, w, rs)
					if !bitsEqual(download(dinp), want(d32)) || !bitsEqual(download(g1[0]), download(g2[0])) {
						t.Errorf("%s: RMSNormBackward is not the float32 kernel's on the widened values, rounded once into a bfloat16 dinp", what)
					}
				}
			}

			ids := make([]int32, n)
			for i := range ids {
				ids[i] = int32(r.IntN(9)) + 3 // repeated, some outside [5, 12)
			}
			tv := randF32(r, 7*c, 1)
			t1, t2 := upload(t, d, tv, 7, c), upload(t, d, tv, 7, c)
			d.EmbeddingBackward(t1, xh, ids, 5)
			d.EmbeddingBackward(t2, upload(t, d, xv, n, c), ids, 5)
			if !bitsEqual(download(t1), download(t2)) {
				t.Errorf("%s: EmbeddingBackward of a bfloat16 dout is not the float32 kernel's on the widened one", name)
			}

			// The embeddings' forward into a bfloat16 stream: the rows
			// rounded (zeros outside the slice), and a float32 a + b
			// rounded once.
			out := half(randF32(r, n*c, 1)) // rows outside the slice must be zeroed
			d.EmbeddingForward(out, ids, t1, 5)
			want := make([]float32, n*c)
			tw := download(t1)
			for i, id := range ids {
				if id >= 5 && id < 12 {
					copy(want[i*c:(i+1)*c], rounded(tw[(int(id)-5)*c:(int(id)-4)*c]))
				}
			}
			if !bitsEqual(download(out), want) {
				t.Errorf("%s: EmbeddingForward into a bfloat16 out is not the rows rounded", name)
			}
			av, bv := randF32(r, n*c, 2), randF32(r, n*c, 2)
			for i := range want {
				want[i] = av[i] + bv[i]
			}
			d.Add(out, upload(t, d, av, n, c), upload(t, d, bv, n, c))
			if !bitsEqual(download(out), rounded(want)) {
				t.Errorf("%s: Add of float32 a and b into a bfloat16 out is not a + b rounded once", name)
			}
		}
	})
}
