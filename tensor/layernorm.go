package tensor

import (
	"math"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// LayerNorm on the CPU device, llm.c's layernorm_forward/backward: each row
// of C channels is normalised to zero mean and unit variance, then scaled by
// weight and shifted by bias; the forward keeps each row's mean and 1/std
// for the backward. The rest of LayerNorm lives where its kind does: the
// Device methods' contract in device.go, the argument checks in
// internal/check, the CUDA kernels in cuda/kernels.cu, and the layer
// (parameters, replicated under tensor parallelism) in parallel/layernorm.go.

type lnK struct {
	out, mean, rstd, inp, weight, bias []float32
	half                               []uint16 // the bfloat16 output instead of out
	eps                                float64
	addend, sum                        []float32 // AddLayerNormForward: sum = inp + addend, normalised
}

func (k *lnK) run(lo, hi, _ int) {
	c := len(k.weight)
	for i := lo; i < hi; i++ {
		x := addRow(k.inp, k.addend, k.sum, i, c)
		var s float64
		for _, v := range x {
			s += float64(v)
		}
		m := s / float64(c)
		var ss float64
		for _, v := range x {
			dv := float64(v) - m
			ss += dv * dv
		}
		r := 1 / math.Sqrt(ss/float64(c)+k.eps)
		m32, r32 := float32(m), float32(r)
		w, b := k.weight[:c], k.bias[:c]
		if k.half != nil {
			o := k.half[i*c : (i+1)*c]
			for j, v := range x {
				o[j] = BF16FromFloat32((v-m32)*r32*w[j] + b[j])
			}
		} else {
			o := k.out[i*c : (i+1)*c]
			for j, v := range x {
				o[j] = (v-m32)*r32*w[j] + b[j]
			}
		}
		k.mean[i], k.rstd[i] = m32, r32
	}
}

// LayerNormForward normalizes the rows of inp. out, inp are (N,C); mean,
// rstd are (N); weight, bias are (C). A bfloat16 out holds the float32
// results rounded.
func (d *CPUDevice) LayerNormForward(out, mean, rstd, inp, weight, bias *Tensor, eps float32) {
	d.ownAny("LayerNormForward", out)
	d.own("LayerNormForward", mean, rstd, inp, weight, bias)
	n := check.LayerNormForward(out, mean, rstd, inp, weight, bias)
	d.layerNorm(n, out, lnK{mean: mean.Host(), rstd: rstd.Host(), inp: inp.Host(), weight: weight.Host(), bias: bias.Host(), eps: float64(eps)})
}

// AddLayerNormForward is sum = a + b, then LayerNormForward of sum, a row
// at a time (the row normalised from the cache).
func (d *CPUDevice) AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias *Tensor, eps float32) {
	d.ownAny("AddLayerNormForward", out)
	d.own("AddLayerNormForward", sum, mean, rstd, a, b, weight, bias)
	n := check.AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias)
	d.layerNorm(n, out, lnK{mean: mean.Host(), rstd: rstd.Host(), inp: a.Host(), addend: b.Host(), sum: sum.Host(), weight: weight.Host(), bias: bias.Host(), eps: float64(eps)})
}

// layerNorm runs k over n rows into out (float32 or bfloat16).
func (d *CPUDevice) layerNorm(n int, out *Tensor, k lnK) {
	k.out, k.half = hostAny(out, 0)
	cost := 8 * len(k.weight)
	if k.addend != nil {
		cost += len(k.weight)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.k.ln = k
	d.parallel(n, d.chunks(n, cost), &d.k.ln)
	d.k.ln = lnK{}
}

// addRow is row i of inp (rows of c), or, with an addend, that row plus
// addend's written into sum's row i and returned.
func addRow(inp, addend, sum []float32, i, c int) []float32 {
	x := inp[i*c : (i+1)*c]
	if addend == nil {
		return x
	}
	z, y := sum[i*c:(i+1)*c], addend[i*c:(i+1)*c]
	for j, v := range x {
		z[j] = v + y[j]
	}
	return z
}

type lnBackK struct {
	dinp, dout, inp, weight, mean, rstd []float32
	part                                []float32 // (chunks,2,C): dweight then dbias partial sums
}

func (k *lnBackK) run(lo, hi, chunk int) {
	c := len(k.weight)
	dw := k.part[chunk*2*c : chunk*2*c+c]
	db := k.part[chunk*2*c+c : (chunk+1)*2*c]
	clear(dw)
	clear(db)
	w := k.weight[:c]
	for i := lo; i < hi; i++ {
		x, g, dx := k.inp[i*c:(i+1)*c], k.dout[i*c:(i+1)*c], k.dinp[i*c:(i+1)*c]
		m, r := k.mean[i], k.rstd[i]
		// dnorm = w*dout; dx = r*(dnorm - mean(dnorm) - norm*mean(dnorm*norm)).
		var sdn, sdnn float64
		for j, v := range x {
			norm := (v - m) * r
			dn := w[j] * g[j]
			sdn += float64(dn)
			sdnn += float64(dn * norm)
			dw[j] += norm * g[j]
			db[j] += g[j]
		}
		mdn, mdnn := float32(sdn/float64(c)), float32(sdnn/float64(c))
		for j, v := range x {
			norm := (v - m) * r
			dx[j] += (w[j]*g[j] - mdn - norm*mdnn) * r
		}
	}
}

// LayerNormBackward accumulates the layernorm gradients. dinp, dout, inp are
// (N,C); dweight, dbias, weight are (C); mean, rstd are (N).
func (d *CPUDevice) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd *Tensor) {
	d.own("LayerNormBackward", dinp, dweight, dbias, dout, inp, weight, mean, rstd)
	n := check.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd)
	c := weight.n
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, 12*c)
	part := d.scratch32(nc * 2 * c)
	k := &d.k.lnB
	*k = lnBackK{dinp: dinp.Host(), dout: dout.Host(), inp: inp.Host(), weight: weight.Host(), mean: mean.Host(), rstd: rstd.Host(), part: part}
	d.parallel(n, nc, k)
	*k = lnBackK{}
	dw, db := dweight.Host(), dbias.Host()
	for ch := 0; ch < nc; ch++ {
		p := part[ch*2*c : (ch+1)*2*c]
		for j := 0; j < c; j++ {
			dw[j] += p[j]
			db[j] += p[c+j]
		}
	}
}
