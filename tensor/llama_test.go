package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refRMSNorm is RMSNorm in float64. x is (N,C), w is (C).
func refRMSNorm(x, w []float64, c int, eps float64) (out, rstd []float64) {
	n := len(x) / c
	out, rstd = make([]float64, len(x)), make([]float64, n)
	for i := 0; i < n; i++ {
		var ss float64
		for _, v := range x[i*c : (i+1)*c] {
			ss += v * v
		}
		r := 1 / math.Sqrt(ss/float64(c)+eps)
		for j := 0; j < c; j++ {
			out[i*c+j] = x[i*c+j] * r * w[j]
		}
		rstd[i] = r
	}
	return out, rstd
}

func TestRMSNorm(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(9, 8))
		for _, sz := range rowSizes {
			n, c := sz[0], sz[1]
			const eps = 1e-6
			x, w := randF32(r, n*c, 2), randF32(r, c, 1)
			tx, tw := upload(t, d, x, n, c), upload(t, d, w, c)
			tout, trstd := upload(t, d, make([]float32, n*c), n, c), upload(t, d, make([]float32, n), n)
			d.RMSNormForward(tout, trstd, tx, tw, eps)
			x64, w64 := to64(x), to64(w)
			out, rstd := refRMSNorm(x64, w64, c, eps)
			name := fmt.Sprintf("%dx%d", n, c)
			checkClose(t, "RMSNormForward out "+name, download(tout), out, 1e-5)
			checkClose(t, "RMSNormForward rstd "+name, download(trstd), rstd, 1e-5)

			g64 := to64(randF32(r, n*c, 1))
			loss := func() float64 {
				o, _ := refRMSNorm(x64, w64, c, eps)
				return dot64(o, g64)
			}
			dx0, dw0 := randF32(r, n*c, 1), randF32(r, c, 1)
			tdx, tdw := upload(t, d, dx0, n, c), upload(t, d, dw0, c)
			d.RMSNormBackward(tdx, tdw, upload(t, d, to32(g64), n, c), tx, tw, trstd)
			checkGrad(t, "RMSNormBackward dinp "+name, download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)
			checkGrad(t, "RMSNormBackward dweight "+name, download(tdw), plus(dw0, numGrad(w64, loss)), 1e-5)
		}
	})
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// refRoPE rotates x (N, heads*hd) as RoPEForward does, in float64, one
// head's pair at a time from the angles pos*freq.
func refRoPE(x []float64, freq []float64, seqLen, heads, hd, period, rotated int, sign float64) []float64 {
	out := append([]float64(nil), x...)
	h := hd / 2
	for i := 0; i < len(x)/(heads*hd); i++ {
		p := float64(i % seqLen)
		for hh := 0; hh < heads; hh++ {
			if hh%period >= rotated {
				continue
			}
			o := i*heads*hd + hh*hd
			for j := 0; j < h; j++ {
				c, s := math.Cos(p*freq[j]), sign*math.Sin(p*freq[j])
				a, b := x[o+j], x[o+j+h]
				out[o+j], out[o+j+h] = a*c-b*s, b*c+a*s
			}
		}
	}
	return out
}

func TestRoPE(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, tt := range []struct{ b, seq, heads, hd, period, rotated int }{
			{1, 1, 1, 2, 1, 1}, {2, 5, 3, 8, 1, 1}, {3, 7, 8, 4, 4, 3}, {2, 6, 6, 6, 3, 0},
		} {
			n := tt.b * tt.seq
			w := tt.heads * tt.hd
			freq := make([]float64, tt.hd/2)
			table := make([]float32, tt.seq*tt.hd)
			for j := range freq {
				freq[j] = math.Pow(10000, -2*float64(j)/float64(tt.hd))
				for p := 0; p < tt.seq; p++ {
					table[p*tt.hd+j] = float32(math.Cos(float64(p) * freq[j]))
					table[p*tt.hd+tt.hd/2+j] = float32(math.Sin(float64(p) * freq[j]))
				}
			}
			x := randF32(r, n*w, 1)
			tx, ttab := upload(t, d, x, n, w), upload(t, d, table, tt.seq, tt.hd)
			name := fmt.Sprintf("%+v", tt)
			d.RoPEForward(tx, ttab, tt.seq, tt.period, tt.rotated)
			checkClose(t, "RoPEForward "+name, download(tx), refRoPE(to64(x), freq, tt.seq, tt.heads, tt.hd, tt.period, tt.rotated, 1), 1e-6)
			// The backward is the transpose: <R x, g> = <x, R^T g>.
			g := randF32(r, n*w, 1)
			tg := upload(t, d, g, n, w)
			d.RoPEBackward(tg, ttab, tt.seq, tt.period, tt.rotated)
			checkClose(t, "RoPEBackward "+name, download(tg), refRoPE(to64(g), freq, tt.seq, tt.heads, tt.hd, tt.period, tt.rotated, -1), 1e-6)
			rx := refRoPE(to64(x), freq, tt.seq, tt.heads, tt.hd, tt.period, tt.rotated, 1)
			if a, b := dot64(rx, to64(g)), dot64(to64(x), to64(download(tg))); math.Abs(a-b) > 1e-4 {
				t.Errorf("%s: <Rx,g> = %g, <x,R^T g> = %g", name, a, b)
			}
		}
	})
}

// refSwiGLU is silu(gate)*up in float64; x is (N,2F) rows of [gate | up].
func refSwiGLU(x []float64, f int) []float64 {
	n := len(x) / (2 * f)
	out := make([]float64, n*f)
	for i := 0; i < n; i++ {
		for j := 0; j < f; j++ {
			g, u := x[2*i*f+j], x[(2*i+1)*f+j]
			out[i*f+j] = g / (1 + math.Exp(-g)) * u
		}
	}
	return out
}

func TestSwiGLU(t *testing.T) {
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, sz := range rowSizes {
			n, f := sz[0], sz[1]
			x := randF32(r, 2*n*f, 4)
			if n*f > 2 {
				x[0], x[1] = 100, -100 // exp's overflow on both sides
			}
			tx, tout := upload(t, d, x, n, 2*f), upload(t, d, make([]float32, n*f), n, f)
			d.SwiGLUForward(tout, tx)
			x64 := to64(x)
			name := fmt.Sprintf("%dx%d", n, f)
			checkClose(t, "SwiGLUForward "+name, download(tout), refSwiGLU(x64, f), 1e-5)
			g64 := to64(randF32(r, n*f, 1))
			loss := func() float64 { return dot64(refSwiGLU(x64, f), g64) }
			dx0 := randF32(r, 2*n*f, 1)
			tdx := upload(t, d, dx0, n, 2*f)
			d.SwiGLUBackward(tdx, tx, upload(t, d, to32(g64), n, f))
			checkGrad(t, "SwiGLUBackward "+name, download(tdx), plus(dx0, numGrad(x64, loss)), 1e-5)
		}
	})
}

// ungroup turns a grouped qkv (B,T,nkv*(g+2)*hs) into the [q | k | v]
// layout of AttentionForward with every key and value head repeated for
// its group's query heads.
func ungroup(x []float64, n, nh, nkv, hs int) []float64 {
	g, c := nh/nkv, nh*hs
	w := nkv * (g + 2) * hs
	out := make([]float64, n*3*c)
	for i := 0; i < n; i++ {
		for h := 0; h < nh; h++ {
			grp, r := h/g, h%g
			for j := 0; j < hs; j++ {
				base := i*w + grp*(g+2)*hs
				out[i*3*c+h*hs+j] = x[base+r*hs+j]
				out[i*3*c+c+h*hs+j] = x[base+g*hs+j]
				out[i*3*c+2*c+h*hs+j] = x[base+(g+1)*hs+j]
			}
		}
	}
	return out
}

func TestGroupedAttention(t *testing.T) {
	shapes := []struct{ b, t, nh, nkv, hs int }{{2, 5, 4, 2, 2}, {3, 4, 2, 1, 3}, {1, 4, 3, 3, 2}, {2, 3, 6, 2, 2}}
	eachDevice(t, func(t *testing.T, d *CPUDevice) {
		r := rand.New(rand.NewPCG(33, 34))
		for _, sh := range shapes {
			b, tt, nh, nkv, hs := sh.b, sh.t, sh.nh, sh.nkv, sh.hs
			w, c := nkv*(nh/nkv+2)*hs, nh*hs
			for _, causal := range []bool{false, true} {
				name := fmt.Sprintf("%+v causal=%v", sh, causal)
				qkv := randF32(r, b*tt*w, 1)
				tqkv := upload(t, d, qkv, b, tt, w)
				att := upload(t, d, make([]float32, b*nh*tt*tt), b, nh, tt, tt)
				out := upload(t, d, randF32(r, b*tt*c, 1), b, tt, c)
				GroupedAttentionForward(out, att, nil, tqkv, nh, nkv, causal, nil)
				q64 := to64(qkv)
				ref := func() []float64 { return refAttention(ungroup(q64, b*tt, nh, nkv, hs), b, tt, nh, hs, causal, nil) }
				checkClose(t, "GroupedAttentionForward "+name, download(out), ref(), 1e-5)

				g64 := to64(randF32(r, b*tt*c, 1))
				loss := func() float64 { return dot64(ref(), g64) }
				dq0 := randF32(r, len(qkv), 1)
				dqkv := upload(t, d, dq0, b, tt, w)
				scratch := func() *Tensor { return upload(t, d, randF32(r, att.Len(), 1), b, nh, tt, tt) }
				GroupedAttentionBackward(dqkv, scratch(), scratch(), upload(t, d, to32(g64), b, tt, c), tqkv, att, nh, nkv)
				checkGrad(t, "GroupedAttentionBackward "+name, download(dqkv), plus(dq0, numGrad(q64, loss)), 1e-5)
			}
		}
	})
}
