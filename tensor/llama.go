package tensor

import (
	"math"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// The kernels of Llama-family decoders on the CPU device: RMSNorm, rotary
// position embeddings (RoPE) and the SwiGLU gate. Their contracts are in
// device.go, their argument checks in internal/check, their CUDA twins in
// cuda/kernels.cu; the layers that use them are in package parallel.

type rmsK struct {
	out, rstd, weight []float32
	half              []uint16 // the bfloat16 output instead of out
	eps               float64
	rows              normRows
}

func (k *rmsK) run(lo, hi, chunk int) {
	c := len(k.weight)
	w := k.weight[:c]
	for i := lo; i < hi; i++ {
		x := k.rows.row(i, chunk, c)
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		r := float32(1 / math.Sqrt(ss/float64(c)+k.eps))
		if k.half != nil {
			o := k.half[i*c : (i+1)*c]
			for j, v := range x {
				o[j] = BF16FromFloat32(v * r * w[j])
			}
		} else {
			o := k.out[i*c : (i+1)*c]
			for j, v := range x {
				o[j] = v * r * w[j]
			}
		}
		k.rstd[i] = r
	}
}

// RMSNormForward normalizes the rows of inp by their root mean square.
// out, inp are (N,C); rstd is (N); weight is (C). A bfloat16 out holds
// the float32 results rounded; a bfloat16 inp is widened.
func (d *CPUDevice) RMSNormForward(out, rstd, inp, weight *Tensor, eps float32) {
	d.ownAny("RMSNormForward", out, inp)
	d.own("RMSNormForward", rstd, weight)
	n := check.RMSNormForward(out, rstd, inp, weight)
	d.rmsNorm(n, out, rmsK{rstd: rstd.Host(), weight: weight.Host(), eps: float64(eps)}, newNormRows(inp, nil, nil))
}

// AddRMSNormForward is sum = a + b, then RMSNormForward of sum, a row at
// a time; sum and a as AddLayerNormForward's.
func (d *CPUDevice) AddRMSNormForward(sum, out, rstd, a, b, weight *Tensor, eps float32) {
	d.ownAny("AddRMSNormForward", out, sum, a)
	d.own("AddRMSNormForward", rstd, b, weight)
	n := check.AddRMSNormForward(sum, out, rstd, a, b, weight)
	check.ResidualSum("AddRMSNormForward", a.DType(), sum.DType(), BFloat16)
	d.rmsNorm(n, out, rmsK{rstd: rstd.Host(), weight: weight.Host(), eps: float64(eps)}, newNormRows(a, b, sum))
}

// rmsNorm runs k over n rows of rows into out (float32 or bfloat16).
func (d *CPUDevice) rmsNorm(n int, out *Tensor, k rmsK, rows normRows) {
	k.out, k.half = hostAny(out, 0)
	c := len(k.weight)
	cost := 6 * c
	if rows.addend != nil {
		cost += c
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, cost)
	k.rows = rows.withScratch(d, nc, c)
	d.k.rms = k
	d.parallel(n, nc, &d.k.rms)
	d.k.rms = rmsK{}
}

type rmsBackK struct {
	weight, rstd []float32
	dinp         gradRows
	inp, dout    normRows  // the forward's rows and their gradient (no addend)
	part         []float32 // (chunks,C): dweight partial sums
}

func (k *rmsBackK) run(lo, hi, chunk int) {
	c := len(k.weight)
	dw := k.part[chunk*c : (chunk+1)*c]
	clear(dw)
	w := k.weight[:c]
	for i := lo; i < hi; i++ {
		x, g := k.inp.row(i, chunk, c), k.dout.row(i, chunk, c)
		r := k.rstd[i]
		// norm = x*r, dn = w*dout; dx = r*(dn - norm*mean(dn*norm)).
		var sdnn float64
		for j, v := range x {
			norm := v * r
			sdnn += float64(w[j] * g[j] * norm)
			dw[j] += norm * g[j]
		}
		mdnn := float32(sdnn / float64(c))
		dx := k.dinp.row(i, chunk, c)
		for j, v := range x {
			dx[j] += (w[j]*g[j] - v*r*mdnn) * r
		}
		k.dinp.store(i, chunk, c)
	}
}

// RMSNormBackward accumulates the RMSNorm gradients. dinp, dout, inp are
// (N,C); dweight, weight are (C); rstd is (N). inp and dout may be
// bfloat16 (widened); a bfloat16 dinp is added into as
// LayerNormBackward's.
func (d *CPUDevice) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd *Tensor) {
	d.ownAny("RMSNormBackward", inp, dinp, dout)
	d.own("RMSNormBackward", dweight, weight, rstd)
	n := check.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd)
	c := weight.n
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, 10*c)
	rows, g, dx, part := d.normBackScratch(nc, c, 1, inp, dout, dinp)
	k := &d.k.rmsB
	*k = rmsBackK{dinp: dx, dout: g, inp: rows, weight: weight.Host(), rstd: rstd.Host(), part: part}
	d.parallel(n, nc, k)
	*k = rmsBackK{}
	dw := dweight.Host()
	for ch := 0; ch < nc; ch++ {
		for j, v := range part[ch*c : (ch+1)*c] {
			dw[j] += v
		}
	}
}

type ropeK struct {
	x, table                           []float32
	half                               []uint16 // a bfloat16 x instead of x
	seqLen, heads, hd, period, rotated int
	sign                               float32 // 1 forward, -1 the inverse rotation
}

func (k *ropeK) run(lo, hi, _ int) {
	h := k.hd / 2
	w := k.heads * k.hd
	for i := lo; i < hi; i++ {
		p := i % k.seqLen
		cos, sin := k.table[p*k.hd:p*k.hd+h], k.table[p*k.hd+h:(p+1)*k.hd]
		for hh := 0; hh < k.heads; hh++ {
			if hh%k.period >= k.rotated {
				continue
			}
			if k.half != nil {
				v := k.half[i*w+hh*k.hd : i*w+(hh+1)*k.hd]
				for j := 0; j < h; j++ {
					a, b, c, s := Float32FromBF16(v[j]), Float32FromBF16(v[j+h]), cos[j], k.sign*sin[j]
					v[j], v[j+h] = BF16FromFloat32(a*c-b*s), BF16FromFloat32(b*c+a*s)
				}
				continue
			}
			v := k.x[i*w+hh*k.hd : i*w+(hh+1)*k.hd]
			for j := 0; j < h; j++ {
				a, b, c, s := v[j], v[j+h], cos[j], k.sign*sin[j]
				v[j], v[j+h] = a*c-b*s, b*c+a*s
			}
		}
	}
}

func (d *CPUDevice) rope(fn string, x, table *Tensor, seqLen, period, rotated int, sign float32) {
	d.ownAny(fn, x)
	d.own(fn, table)
	rows, heads := check.RoPE(fn, x, table, seqLen, period, rotated)
	full, half := hostAny(x, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.rope
	*k = ropeK{x: full, half: half, table: table.Host(), seqLen: seqLen, heads: heads, hd: table.Cols(), period: period, rotated: rotated, sign: sign}
	d.parallel(rows, d.chunks(rows, 3*x.Cols()), k)
	*k = ropeK{}
}

// RoPEForward rotates the heads of x (N,W) in place by their positions'
// angles in table (positions,hd).
func (d *CPUDevice) RoPEForward(x, table *Tensor, seqLen, period, rotated int) {
	d.rope("RoPEForward", x, table, seqLen, period, rotated, 1)
}

// RoPEBackward rotates the gradient dx (N,W) back in place.
func (d *CPUDevice) RoPEBackward(dx, table *Tensor, seqLen, period, rotated int) {
	d.rope("RoPEBackward", dx, table, seqLen, period, rotated, -1)
}

type swigluK struct {
	out, inp []float32
	half     []uint16  // the bfloat16 output instead of out
	inpHalf  []uint16  // the bfloat16 input instead of inp
	scratch  []float32 // 3 tiles a chunk (CPUDevice.tiles), with a bfloat16 operand
	f        int
}

func (k *swigluK) run(lo, hi, chunk int) {
	f := k.f
	if k.scratch == nil {
		for i := lo; i < hi; i++ {
			swiglu(k.out[i*f:(i+1)*f], k.inp[2*i*f:(2*i+1)*f], k.inp[(2*i+1)*f:(2*i+2)*f])
		}
		return
	}
	s := chunkTiles(k.scratch, chunk, 3)
	gt, ut, res := s[:tileLen], s[tileLen:2*tileLen], s[2*tileLen:]
	for i := lo; i < hi; i++ {
		overTiles(2*i*f, (2*i+1)*f, k.inp, k.inpHalf, gt, func(a, b int, g []float32) {
			j0, j1 := a-2*i*f, b-2*i*f
			u := tileOf(k.inp, k.inpHalf, a+f, b+f, ut)
			if k.half == nil {
				swiglu(k.out[i*f+j0:i*f+j1], g, u)
				return
			}
			swiglu(res[:j1-j0], g, u)
			RoundBF16(k.half[i*f+j0:i*f+j1], res[:j1-j0])
		})
	}
}

// swiglu is out = silu(g)*u elementwise.
func swiglu(out, g, u []float32) {
	for j, x := range g {
		out[j] = x / (1 + exp32(-x)) * u[j]
	}
}

// SwiGLUForward is out = silu(gate)*up. out is (N,F), inp (N,2F) rows of
// [gate | up]; either may be bfloat16 (a bfloat16 out holds the float32
// results rounded).
func (d *CPUDevice) SwiGLUForward(out, inp *Tensor) {
	d.ownAny("SwiGLUForward", out, inp)
	n, f := check.SwiGLUForward(out, inp)
	full, half := hostAny(out, 0)
	x, xHalf := hostAny(inp, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, 20*f)
	k := &d.k.swiglu
	*k = swigluK{out: full, inp: x, half: half, inpHalf: xHalf, f: f}
	if half != nil || xHalf != nil {
		k.scratch = d.tiles(nc, 3)
	}
	d.parallel(n, nc, k)
	*k = swigluK{}
}

type swigluBackK struct {
	dinp, inp, dout    []float32
	inpHalf            []uint16  // the bfloat16 input instead of inp
	dinpHalf, doutHalf []uint16  // bfloat16 gradients instead of dinp, dout
	scratch            []float32 // 5 tiles a chunk (CPUDevice.tiles), with a bfloat16 operand
	f                  int
}

func (k *swigluBackK) run(lo, hi, chunk int) {
	f := k.f
	if k.scratch == nil {
		for i := lo; i < hi; i++ {
			swigluBackward(k.dinp[2*i*f:(2*i+1)*f], k.dinp[(2*i+1)*f:(2*i+2)*f], k.inp[2*i*f:(2*i+1)*f], k.inp[(2*i+1)*f:(2*i+2)*f], k.dout[i*f:(i+1)*f])
		}
		return
	}
	// A tile of a row's gate columns [a,b) at a time, its up columns f
	// further, each operand as float32 (a bfloat16 one widened); bfloat16
	// gradients get the float32 sums rounded.
	s := chunkTiles(k.scratch, chunk, 5)
	tile := func(i int) []float32 { return s[i*tileLen : (i+1)*tileLen] }
	for i := lo; i < hi; i++ {
		for a := 2 * i * f; a < (2*i+1)*f; a += tileLen {
			b := min(a+tileLen, (2*i+1)*f)
			g, u := tileOf(k.inp, k.inpHalf, a, b, tile(0)), tileOf(k.inp, k.inpHalf, a+f, b+f, tile(1))
			do := tileOf(k.dout, k.doutHalf, a-i*f, b-i*f, tile(2))
			dg, du := tileOf(k.dinp, k.dinpHalf, a, b, tile(3)), tileOf(k.dinp, k.dinpHalf, a+f, b+f, tile(4))
			swigluBackward(dg, du, g, u, do)
			if k.dinpHalf != nil {
				RoundBF16(k.dinpHalf[a:b], dg)
				RoundBF16(k.dinpHalf[a+f:b+f], du)
			}
		}
	}
}

// swigluBackward adds the gradients of silu(g)*u into dg and du from do.
// With s = sigmoid(g): d(g*s)/dg = s*(1+g*(1-s)).
func swigluBackward(dg, du, g, u, do []float32) {
	for j, x := range g {
		s := 1 / (1 + exp32(-x))
		dg[j] += do[j] * u[j] * s * (1 + x*(1-s))
		du[j] += do[j] * x * s
	}
}

// SwiGLUBackward accumulates [dgate | dup] into dinp (N,2F) from dout (N,F)
// and the forward's inp (N,2F); inp may be bfloat16, and dinp and dout
// both (widened, the sums rounded into dinp).
func (d *CPUDevice) SwiGLUBackward(dinp, inp, dout *Tensor) {
	d.ownAny("SwiGLUBackward", dinp, inp, dout)
	n, f := check.SwiGLUBackward(dinp, inp, dout)
	check.SameDType("SwiGLUBackward", "dinp", dinp.DType(), "dout", dout.DType())
	x, xHalf := hostAny(inp, 0)
	g, gHalf := hostAny(dout, 0)
	di, diHalf := hostAny(dinp, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, 30*f)
	k := &d.k.swigluB
	*k = swigluBackK{dinp: di, inp: x, dout: g, inpHalf: xHalf, dinpHalf: diHalf, doutHalf: gHalf, f: f}
	if xHalf != nil || gHalf != nil {
		k.scratch = d.tiles(nc, 5)
	}
	d.parallel(n, nc, k)
	*k = swigluBackK{}
}
