package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
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
