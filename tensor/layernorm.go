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
	out, mean, rstd, weight, bias []float32
	half                          []uint16 // the bfloat16 output instead of out
	eps                           float64
	rows                          normRows
}

func (k *lnK) run(lo, hi, chunk int) {
	c := len(k.weight)
	for i := lo; i < hi; i++ {
		x := k.rows.row(i, chunk, c)
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
// results rounded; a bfloat16 inp is widened.
func (d *CPUDevice) LayerNormForward(out, mean, rstd, inp, weight, bias *Tensor, eps float32) {
	d.ownAny("LayerNormForward", out, inp)
	d.own("LayerNormForward", mean, rstd, weight, bias)
	n := check.LayerNormForward(out, mean, rstd, inp, weight, bias)
	d.layerNorm(n, out, lnK{mean: mean.Host(), rstd: rstd.Host(), weight: weight.Host(), bias: bias.Host(), eps: float64(eps)}, newNormRows(inp, nil, nil))
}

// AddLayerNormForward is sum = a + b, then LayerNormForward of sum, a row
// at a time (the row normalised from the cache). A bfloat16 sum holds a +
// b rounded, which is what is normalised; a may be bfloat16 where sum is.
func (d *CPUDevice) AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias *Tensor, eps float32) {
	d.ownAny("AddLayerNormForward", out, sum, a)
	d.own("AddLayerNormForward", mean, rstd, b, weight, bias)
	n := check.AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias)
	check.ResidualSum("AddLayerNormForward", a.DType(), sum.DType(), BFloat16)
	d.layerNorm(n, out, lnK{mean: mean.Host(), rstd: rstd.Host(), weight: weight.Host(), bias: bias.Host(), eps: float64(eps)}, newNormRows(a, b, sum))
}

// layerNorm runs k over n rows of rows into out (float32 or bfloat16).
func (d *CPUDevice) layerNorm(n int, out *Tensor, k lnK, rows normRows) {
	k.out, k.half = hostAny(out, 0)
	c := len(k.weight)
	cost := 8 * c
	if rows.addend != nil {
		cost += c
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, cost)
	k.rows = rows.withScratch(d, nc, c)
	d.k.ln = k
	d.parallel(n, nc, &d.k.ln)
	d.k.ln = lnK{}
}

// normRows are the rows a norm kernel normalises: inp's, or, with an
// addend, sum = inp + addend, written and read back. A bfloat16 inp is
// widened, and a bfloat16 sum gets inp + addend rounded, into the chunk's
// row of wide, which the kernel reads: the float32 kernel's bits on the
// values the tensors hold.
type normRows struct {
	inp    []float32
	inpH   []uint16 // a bfloat16 inp instead
	addend []float32
	sum    []float32
	sumH   []uint16  // a bfloat16 sum instead
	wide   []float32 // (chunks, C) where inp or sum is bfloat16
}

// newNormRows are the rows of inp, or of sum = inp + addend.
func newNormRows(inp, addend, sum *Tensor) normRows {
	var r normRows
	r.inp, r.inpH = hostAny(inp, 0)
	if addend != nil {
		r.addend = addend.Host()
		r.sum, r.sumH = hostAny(sum, 0)
	}
	return r
}

// withScratch gives r the widened rows of nc chunks of c columns where it
// needs them. Called with d.mu held.
func (r normRows) withScratch(d *CPUDevice, nc, c int) normRows {
	if r.inpH != nil || r.sumH != nil {
		r.wide = d.scratch32(nc * c)
	}
	return r
}

// normBackScratch is the rows a norm's backward reads and adds into, for
// nc chunks of c columns: inp's and dout's (each widened into a chunk's
// row of scratch where bfloat16), dinp's gradRows, and per partial sums a
// column in each chunk (zeroed by the kernel), all in one scratch. Called
// with d.mu held.
func (d *CPUDevice) normBackScratch(nc, c, per int, inp, dout, dinp *Tensor) (x, g normRows, dx gradRows, part []float32) {
	x, g = newNormRows(inp, nil, nil), newNormRows(dout, nil, nil)
	dx.f, dx.h = hostAny(dinp, 0)
	n := nc * per * c
	rows := func(half bool) int {
		if half {
			return nc * c
		}
		return 0
	}
	wx, wg, wd := rows(x.inpH != nil), rows(g.inpH != nil), rows(dx.h != nil)
	s := d.scratch32(n + wx + wg + wd)
	part, s = s[:n], s[n:]
	x.wide, s = s[:wx], s[wx:]
	g.wide, s = s[:wg], s[wg:]
	dx.wide = s[:wd]
	return x, g, dx, part
}

// gradRows are the rows a norm's backward adds its input gradient into:
// dinp's, or, where dinp is bfloat16, the chunk's row of wide, widened
// from dinp before (row) and rounded into it after (store): the float32
// kernel's sums on the values dinp holds, rounded once.
type gradRows struct {
	f    []float32
	h    []uint16
	wide []float32 // (chunks, C) where dinp is bfloat16
}

// row is row i of dinp to add into, read by chunk.
func (g *gradRows) row(i, chunk, c int) []float32 {
	if g.h == nil {
		return g.f[i*c : (i+1)*c]
	}
	x := g.wide[chunk*c : (chunk+1)*c]
	WidenBF16(x, g.h[i*c:(i+1)*c])
	return x
}

// store rounds row i, added into by chunk, back into a bfloat16 dinp.
func (g *gradRows) store(i, chunk, c int) {
	if g.h != nil {
		RoundBF16(g.h[i*c:(i+1)*c], g.wide[chunk*c:(chunk+1)*c])
	}
}

// row is row i (of c columns) of the rows, read by chunk.
func (r *normRows) row(i, chunk, c int) []float32 {
	if r.addend == nil {
		if r.inpH == nil {
			return r.inp[i*c : (i+1)*c]
		}
		x := r.wide[chunk*c : (chunk+1)*c]
		WidenBF16(x, r.inpH[i*c:(i+1)*c])
		return x
	}
	y := r.addend[i*c : (i+1)*c]
	if r.sumH == nil {
		x, z := r.inp[i*c:(i+1)*c], r.sum[i*c:(i+1)*c]
		for j, v := range x {
			z[j] = v + y[j]
		}
		return z
	}
	x, z := r.wide[chunk*c:(chunk+1)*c], r.sumH[i*c:(i+1)*c]
	if r.inpH != nil {
		WidenBF16(x, r.inpH[i*c:(i+1)*c])
	} else {
		copy(x, r.inp[i*c:(i+1)*c])
	}
	for j := range x {
		x[j] += y[j]
	}
	RoundBF16(z, x)
	WidenBF16(x, z)
	return x
}

type lnBackK struct {
	weight, mean, rstd []float32
	dinp               gradRows
	inp, dout          normRows  // the forward's rows and their gradient (no addend)
	part               []float32 // (chunks,2,C): dweight then dbias partial sums
}

func (k *lnBackK) run(lo, hi, chunk int) {
	c := len(k.weight)
	dw := k.part[chunk*2*c : chunk*2*c+c]
	db := k.part[chunk*2*c+c : (chunk+1)*2*c]
	clear(dw)
	clear(db)
	w := k.weight[:c]
	for i := lo; i < hi; i++ {
		x, g := k.inp.row(i, chunk, c), k.dout.row(i, chunk, c)
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
		dx := k.dinp.row(i, chunk, c)
		for j, v := range x {
			norm := (v - m) * r
			dx[j] += (w[j]*g[j] - mdn - norm*mdnn) * r
		}
		k.dinp.store(i, chunk, c)
	}
}

// LayerNormBackward accumulates the layernorm gradients. dinp, dout, inp are
// (N,C); dweight, dbias, weight are (C); mean, rstd are (N). inp may be
// bfloat16 (widened), and dout (a norm output's bfloat16 gradient,
// widened); a bfloat16 dinp (a residual stream's gradient) gets the
// float32 sum of what it held and the row's gradient, rounded once.
func (d *CPUDevice) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd *Tensor) {
	d.ownAny("LayerNormBackward", inp, dinp, dout)
	d.own("LayerNormBackward", dweight, dbias, weight, mean, rstd)
	n := check.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd)
	c := weight.n
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, 12*c)
	rows, g, dx, part := d.normBackScratch(nc, c, 2, inp, dout, dinp)
	k := &d.k.lnB
	*k = lnBackK{dinp: dx, dout: g, inp: rows, weight: weight.Host(), mean: mean.Host(), rstd: rstd.Host(), part: part}
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
