package tensor

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// cpuKernels holds one argument block per kernel. A kernel call fills its
// block under the device mutex and hands a pointer to it to the workers, so
// no call allocates.
type cpuKernels struct {
	fill  fillK
	block blockK
	add   addK
	axpy  axpyK
	scale scaleK
	bias  biasK
	biasB biasBackK
	emb   embK
	embB  embBackK
	ln    lnK
	lnB   lnBackK
	act   activationK
	actB  activationBackK
	bact  biasActivationK
	actIn activationInPlaceK
	sm    softmaxK
	smB   softmaxBackK
	ce    ceK
	adam  adamK
	sumsq sumSqK

	rms     rmsK
	rmsB    rmsBackK
	rope    ropeK
	swiglu  swigluK
	swigluB swigluBackK
	conv    convertK
	halves  halfRowsK
}

// convertK rounds f into h (toBF16) or widens h into f, elementwise.
type convertK struct {
	f      []float32
	h      []uint16
	toBF16 bool
}

func (k *convertK) run(lo, hi, _ int) {
	if k.toBF16 {
		RoundBF16(k.h[lo:hi], k.f[lo:hi])
		return
	}
	WidenBF16(k.f[lo:hi], k.h[lo:hi])
}

// halfRowsK converts rows [lo,hi) of a product's piece (toHalfC) between
// its float32 scratch s (rows of n, packed) and the bfloat16 C: widening
// before the product, rounding after.
type halfRowsK struct {
	s                             []float32
	hc                            []uint16
	n, rows, q0, i0, ldc, strideC int
	toBF16                        bool
}

func (k *halfRowsK) run(lo, hi, _ int) {
	for r := lo; r < hi; r++ {
		q, i := r/k.rows, r%k.rows
		at := (k.q0+q)*k.strideC + (k.i0+i)*k.ldc
		s, h := k.s[r*k.n:(r+1)*k.n], k.hc[at:at+k.n]
		if k.toBF16 {
			RoundBF16(h, s)
		} else {
			WidenBF16(s, h)
		}
	}
}

// convert is RoundBF16(h, f) (toBF16) or WidenBF16(f, h) over the
// device's threads.
func (d *CPUDevice) convert(f []float32, h []uint16, toBF16 bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.conv
	*k = convertK{f: f, h: h, toBF16: toBF16}
	d.parallel(len(f), d.chunks(len(f), 1), k)
	*k = convertK{}
}

// --- Fill, Zero, Add, Axpy, Scale ---

type fillK struct {
	x []float32
	h []uint16 // a bfloat16 tensor's, x nil
	v float32
}

func (k *fillK) run(lo, hi, _ int) {
	if k.h != nil {
		fillWith(k.h[lo:hi], BF16FromFloat32(k.v))
		return
	}
	fillWith(k.x[lo:hi], k.v)
}

// fillWith sets every element of x to v.
func fillWith[E uint16 | float32](x []E, v E) {
	if v == 0 {
		clear(x)
		return
	}
	for i := range x {
		x[i] = v
	}
}

// Zero sets every element of t to 0.
func (d *CPUDevice) Zero(t *Tensor) { d.Fill(t, 0) }

// Fill sets every element of t to v (rounded once for a bfloat16 t).
func (d *CPUDevice) Fill(t *Tensor, v float32) {
	d.ownAny("Fill", t)
	x, h := hostAny(t, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.fill
	*k = fillK{x: x, h: h, v: v}
	d.parallel(t.n, d.chunks(t.n, 1), k)
	*k = fillK{}
}

type addK struct {
	out, a, b []float32
	outH, aH  []uint16 // a bfloat16 out and a instead
}

func (k *addK) run(lo, hi, _ int) {
	if k.outH != nil {
		// A piece at a time through float32, so that widening and
		// rounding run vectorised.
		var w [512]float32
		for at := lo; at < hi; at += len(w) {
			n := min(len(w), hi-at)
			x := w[:n]
			if k.aH != nil {
				WidenBF16(x, k.aH[at:at+n])
			} else {
				copy(x, k.a[at:at+n])
			}
			for i, v := range k.b[at : at+n] {
				x[i] += v
			}
			RoundBF16(k.outH[at:at+n], x)
		}
		return
	}
	out, a, b := k.out[lo:hi], k.a[lo:hi], k.b[lo:hi]
	for i := range out {
		out[i] = a[i] + b[i]
	}
}

// Add is out = a + b elementwise; out may be bfloat16 (the float32 sum
// rounded once), and a where out is (widened).
func (d *CPUDevice) Add(out, a, b *Tensor) {
	d.ownAny("Add", out, a)
	d.own("Add", b)
	check.Add(out, a, b)
	check.ResidualSum("Add", a.DType(), out.DType(), BFloat16)
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.add
	*k = addK{b: b.Host()}
	k.out, k.outH = hostAny(out, 0)
	k.a, k.aH = hostAny(a, 0)
	d.parallel(out.n, d.chunks(out.n, 1), k)
	*k = addK{}
}

type axpyK struct {
	y, x   []float32
	yH, xH []uint16 // a bfloat16 y or x instead
	alpha  float32
}

func (k *axpyK) run(lo, hi, _ int) {
	if k.yH == nil && k.xH == nil {
		y, x, alpha := k.y[lo:hi], k.x[lo:hi], k.alpha
		for i := range y {
			y[i] += alpha * x[i]
		}
		return
	}
	// A piece at a time through float32, as addK.
	var wy, wx [512]float32
	for at := lo; at < hi; at += len(wy) {
		n := min(len(wy), hi-at)
		y, x := wy[:n], wx[:n]
		if k.yH != nil {
			WidenBF16(y, k.yH[at:at+n])
		} else {
			y = k.y[at : at+n]
		}
		if k.xH != nil {
			WidenBF16(x, k.xH[at:at+n])
		} else {
			x = k.x[at : at+n]
		}
		for i := range y {
			y[i] += k.alpha * x[i]
		}
		if k.yH != nil {
			RoundBF16(k.yH[at:at+n], y)
		}
	}
}

// Axpy is y += alpha*x elementwise. Either may be bfloat16: x is widened,
// a bfloat16 y gets the float32 result rounded once.
func (d *CPUDevice) Axpy(y *Tensor, alpha float32, x *Tensor) {
	d.ownAny("Axpy", y, x)
	check.Axpy(y, x)
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.axpy
	*k = axpyK{alpha: alpha}
	k.y, k.yH = hostAny(y, 0)
	k.x, k.xH = hostAny(x, 0)
	d.parallel(y.n, d.chunks(y.n, 1), k)
	*k = axpyK{}
}

type scaleK struct {
	x     []float32
	alpha float32
}

func (k *scaleK) run(lo, hi, _ int) {
	x, alpha := k.x[lo:hi], k.alpha
	for i := range x {
		x[i] *= alpha
	}
}

// Scale is x *= alpha elementwise.
func (d *CPUDevice) Scale(x *Tensor, alpha float32) {
	d.own("Scale", x)
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.scale
	*k = scaleK{x: x.Host(), alpha: alpha}
	d.parallel(x.n, d.chunks(x.n, 1), k)
	*k = scaleK{}
}

// --- 2-D blocks ---

type blockK struct {
	dst, src     []float32
	ldDst, ldSrc int
	cols         int
	alpha        float32
	accumulate   bool
}

func (k *blockK) run(lo, hi, _ int) {
	for i := lo; i < hi; i++ {
		d, s := k.dst[i*k.ldDst:i*k.ldDst+k.cols], k.src[i*k.ldSrc:i*k.ldSrc+k.cols]
		if !k.accumulate {
			copy(d, s)
			continue
		}
		for j, v := range s {
			d[j] += k.alpha * v
		}
	}
}

func (d *CPUDevice) block2D(fn string, dst *Tensor, dstOff, ldDst int, alpha float32, src *Tensor, srcOff, ldSrc, rows, cols int, accumulate bool) {
	d.own(fn, dst, src)
	if check.Block2D(fn, dst, dstOff, ldDst, src, srcOff, ldSrc, rows, cols) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.block
	*k = blockK{dst: dst.Host()[dstOff:], src: src.Host()[srcOff:], ldDst: ldDst, ldSrc: ldSrc, cols: cols, alpha: alpha, accumulate: accumulate}
	d.parallel(rows, d.chunks(rows, cols), k)
	*k = blockK{}
}

// Copy2D copies a (rows,cols) block: dst[dstOff+i*ldDst+j] = src[srcOff+i*ldSrc+j].
// dst and src may both be bfloat16.
func (d *CPUDevice) Copy2D(dst *Tensor, dstOff, ldDst int, src *Tensor, srcOff, ldSrc, rows, cols int) {
	if dst.DType() == Float32 && src.DType() == Float32 {
		d.block2D("Copy2D", dst, dstOff, ldDst, 1, src, srcOff, ldSrc, rows, cols, false)
		return
	}
	d.ownAny("Copy2D", dst, src)
	if check.Copy2DHalf(dst, dst.DType(), dstOff, ldDst, src, src.DType(), srcOff, ldSrc, rows, cols) {
		return
	}
	hd, hs := dst.HostBF16()[dstOff:], src.HostBF16()[srcOff:]
	for i := range rows {
		copy(hd[i*ldDst:i*ldDst+cols], hs[i*ldSrc:i*ldSrc+cols])
	}
}

// Axpy2D accumulates a (rows,cols) block: dst[dstOff+i*ldDst+j] += alpha*src[srcOff+i*ldSrc+j].
func (d *CPUDevice) Axpy2D(dst *Tensor, dstOff, ldDst int, alpha float32, src *Tensor, srcOff, ldSrc, rows, cols int) {
	d.block2D("Axpy2D", dst, dstOff, ldDst, alpha, src, srcOff, ldSrc, rows, cols, true)
}

// --- bias ---

type biasK struct {
	out, bias []float32 // out is (N,OC), bias is (OC)
	half      []uint16  // a bfloat16 out instead of out
	scratch   []float32 // a tile a chunk (CPUDevice.tiles), with half
}

func (k *biasK) run(lo, hi, chunk int) {
	oc := len(k.bias)
	for i := lo; i < hi; i++ {
		if k.half != nil {
			row, x := k.half[i*oc:(i+1)*oc], chunkTiles(k.scratch, chunk, 1)
			for j0 := 0; j0 < oc; j0 += tileLen {
				j1 := min(j0+tileLen, oc)
				WidenBF16(x, row[j0:j1])
				for j, b := range k.bias[j0:j1] {
					x[j] += b
				}
				RoundBF16(row[j0:j1], x[:j1-j0])
			}
			continue
		}
		row := k.out[i*oc : (i+1)*oc]
		for j, b := range k.bias {
			row[j] += b
		}
	}
}

// AddBias is out[i] += bias for every row. out is (N,OC), bias is (OC); a
// bfloat16 out is widened, added to and rounded again.
func (d *CPUDevice) AddBias(out, bias *Tensor) {
	d.ownAny("AddBias", out)
	d.own("AddBias", bias)
	n := check.AddBias(out, bias)
	full, half := hostAny(out, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, bias.n)
	k := &d.k.bias
	*k = biasK{out: full, bias: bias.Host(), half: half}
	if half != nil {
		k.scratch = d.tiles(nc, 1)
	}
	d.parallel(n, nc, k)
	*k = biasK{}
}

type biasBackK struct {
	dbias, dout []float32 // dbias is (OC), dout is (N,OC)
	doutHalf    []uint16  // a bfloat16 dout's (dout nil)
	scratch     []float32 // a tile a chunk: a bfloat16 row's columns widened
}

// run sums the columns [lo,hi) over every row, so that chunks never share
// an output.
func (k *biasBackK) run(lo, hi, chunk int) {
	oc := len(k.dbias)
	n := max(len(k.dout), len(k.doutHalf))
	var tile []float32
	step := max(hi-lo, 1) // float32: every row's columns at once
	if k.doutHalf != nil {
		tile, step = chunkTiles(k.scratch, chunk, 1), tileLen
	}
	for c0 := lo; c0 < hi; c0 += step {
		c1 := min(c0+step, hi)
		db := k.dbias[c0:c1]
		for r := 0; r+oc <= n; r += oc {
			for j, g := range tileOf(k.dout, k.doutHalf, r+c0, r+c1, tile) {
				db[j] += g
			}
		}
	}
}

// BiasBackward is dbias += column sums of dout. dbias is (OC), dout is
// (N,OC), float32 or bfloat16 (widened; the sums in float32).
func (d *CPUDevice) BiasBackward(dbias, dout *Tensor) {
	d.own("BiasBackward", dbias)
	d.ownAny("BiasBackward", dout)
	n := check.BiasBackward(dbias, dout)
	g, gHalf := hostAny(dout, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(dbias.n, n)
	k := &d.k.biasB
	*k = biasBackK{dbias: dbias.Host(), dout: g, doutHalf: gHalf}
	if gHalf != nil {
		k.scratch = d.tiles(nc, 1)
	}
	d.parallel(dbias.n, nc, k)
	*k = biasBackK{}
}

// --- embedding ---

type embK struct {
	out, table []float32 // out is (N,C), table is (V,C)
	outH       []uint16  // a bfloat16 out instead
	ids        []int32   // (N)
	c, start   int
}

func (k *embK) run(lo, hi, _ int) {
	c, v := k.c, len(k.table)/max(k.c, 1)
	for i := lo; i < hi; i++ {
		id := int(k.ids[i]) - k.start
		in := id >= 0 && id < v
		switch {
		case k.outH != nil && in:
			RoundBF16(k.outH[i*c:(i+1)*c], k.table[id*c:(id+1)*c])
		case k.outH != nil:
			clear(k.outH[i*c : (i+1)*c])
		case in:
			copy(k.out[i*c:(i+1)*c], k.table[id*c:(id+1)*c])
		default:
			clear(k.out[i*c : (i+1)*c])
		}
	}
}

// EmbeddingForward is out[i] = table[ids[i]-vocabStart], zeros for ids
// outside the table's slice. out is (N,C), ids is (N), table is (V,C); a
// bfloat16 out gets the rows rounded.
func (d *CPUDevice) EmbeddingForward(out *Tensor, ids []int32, table *Tensor, vocabStart int) {
	d.own("EmbeddingForward", table)
	d.ownAny("EmbeddingForward", out)
	n := check.EmbeddingForward(out, ids, table)
	c := table.Cols()
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.emb
	*k = embK{table: table.Host(), ids: ids, c: c, start: vocabStart}
	k.out, k.outH = hostAny(out, 0)
	d.parallel(n, d.chunks(n, c), k)
	*k = embK{}
}

type embBackK struct {
	dtable, dout []float32 // dtable is (V,C), dout is (N,C)
	doutH        []uint16  // a bfloat16 dout instead
	ids          []int32   // (N)
	c, start     int
}

// run scatters the columns [lo,hi) of every row: repeated ids add into the
// same table row, so chunks split columns, not rows.
func (k *embBackK) run(lo, hi, _ int) {
	c, v := k.c, len(k.dtable)/max(k.c, 1)
	var w [512]float32
	for i, id := range k.ids {
		id := int(id) - k.start
		if id < 0 || id >= v {
			continue
		}
		if k.doutH == nil {
			addTo(k.dtable[id*c+lo:id*c+hi], k.dout[i*c+lo:i*c+hi])
			continue
		}
		for at := lo; at < hi; at += len(w) {
			n := min(len(w), hi-at)
			WidenBF16(w[:n], k.doutH[i*c+at:i*c+at+n])
			addTo(k.dtable[id*c+at:id*c+at+n], w[:n])
		}
	}
}

// addTo is dst += src elementwise.
func addTo(dst, src []float32) {
	for j, g := range src {
		dst[j] += g
	}
}

// EmbeddingBackward is dtable[ids[i]-vocabStart] += dout[i] for the ids in
// the table's slice. dtable is (V,C), dout is (N,C), ids is (N); a
// bfloat16 dout is widened.
func (d *CPUDevice) EmbeddingBackward(dtable, dout *Tensor, ids []int32, vocabStart int) {
	d.own("EmbeddingBackward", dtable)
	d.ownAny("EmbeddingBackward", dout)
	n := check.EmbeddingBackward(dtable, dout, ids)
	c := dtable.Cols()
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.embB
	*k = embBackK{dtable: dtable.Host(), ids: ids, c: c, start: vocabStart}
	k.dout, k.doutH = hostAny(dout, 0)
	d.parallel(c, d.chunks(c, n), k)
	*k = embBackK{}
}

// --- activations: GELU (tanh approximation) and tanh ---

const (
	geluS = 0.7978845608028654 // sqrt(2/pi)
	geluA = 0.044715
)

// activationK is an elementwise forward f (gelu, tanh) over inp into out:
// either may be bfloat16 (inpHalf, outHalf), computed in float32 a tile at
// a time in the chunk's tiles of scratch (overTiles), as a GPU kernel
// loads, computes and stores.
type activationK struct {
	out, inp         []float32
	outHalf, inpHalf []uint16
	scratch          []float32 // 2 tiles a chunk (tiles), with a bfloat16 operand
	f                func(out, inp []float32)
}

func (k *activationK) run(lo, hi, chunk int) {
	if k.scratch == nil {
		k.f(k.out[lo:hi], k.inp[lo:hi])
		return
	}
	s := chunkTiles(k.scratch, chunk, 2)
	res := s[tileLen:]
	overTiles(lo, hi, k.inp, k.inpHalf, s[:tileLen], func(a, b int, x []float32) {
		if k.outHalf == nil {
			k.f(k.out[a:b], x)
			return
		}
		k.f(res[:b-a], x)
		RoundBF16(k.outHalf[a:b], res[:b-a])
	})
}

// tileLen is the elements an elementwise kernel widens or rounds at a
// time.
const tileLen = 512

// tiles is n tiles for each of nc chunks, from the device's scratch (d.mu
// held): where a kernel with a bfloat16 operand widens and rounds,
// without allocating.
func (d *CPUDevice) tiles(nc, n int) []float32 { return d.scratch32(max(nc, 1) * n * tileLen) }

// chunkTiles is chunk's n tiles of s (CPUDevice.tiles).
func chunkTiles(s []float32, chunk, n int) []float32 {
	return s[chunk*n*tileLen : (chunk+1)*n*tileLen]
}

// overTiles calls body on [lo,hi) tileLen elements at a time with inp's
// elements there as float32: its own, or a bfloat16 inp's (half) widened
// into tile.
func overTiles(lo, hi int, inp []float32, half []uint16, tile []float32, body func(a, b int, x []float32)) {
	for a := lo; a < hi; a += tileLen {
		b := min(a+tileLen, hi)
		body(a, b, tileOf(inp, half, a, b, tile))
	}
}

// tileOf is elements [a,b) of inp as float32: its own, or half's widened
// into tile.
func tileOf(inp []float32, half []uint16, a, b int, tile []float32) []float32 {
	if half == nil {
		return inp[a:b]
	}
	WidenBF16(tile[:b-a], half[a:b])
	return tile[:b-a]
}

// gelu(x) = 0.5*x*(1+tanh(u)) with u = geluS*(x+geluA*x^3); with
// e = exp(2u), tanh(u) = 1-2/(e+1), so gelu(x) = x - x/(e+1).
func gelu(out, inp []float32) {
	for i := geluFwdVec(out, inp); i < len(inp); i++ {
		x := inp[i]
		e := exp32(2 * geluS * (x + geluA*x*x*x))
		out[i] = x - x/(e+1)
	}
}

// activationBackK is an elementwise backward f (geluBackward,
// tanhBackward): dinp += f'(inp)*dout, inp float32 or bfloat16 (inpHalf).
type activationBackK struct {
	dinp, inp, dout []float32
	inpHalf         []uint16
	scratch         []float32 // a tile a chunk, with a bfloat16 inp
	f               func(dinp, inp, dout []float32)
}

func (k *activationBackK) run(lo, hi, chunk int) {
	if k.inpHalf == nil {
		k.f(k.dinp[lo:hi], k.inp[lo:hi], k.dout[lo:hi])
		return
	}
	overTiles(lo, hi, k.inp, k.inpHalf, chunkTiles(k.scratch, chunk, 1), func(a, b int, x []float32) {
		k.f(k.dinp[a:b], x, k.dout[a:b])
	})
}

// gelu'(x) = 0.5*(1+t) + 0.5*x*(1-t^2)*du with t = tanh(u), du = du/dx;
// with w = 1/(exp(2u)+1), t = 1-2w and this is (1-w)*(1+2*x*w*du).
func geluBackward(dinp, inp, dout []float32) {
	for i := geluBwdVec(dinp, inp, dout); i < len(inp); i++ {
		x := inp[i]
		w := 1 / (exp32(2*geluS*(x+geluA*x*x*x)) + 1)
		du := geluS * (1 + 3*geluA*x*x)
		dinp[i] += (1 - w) * (1 + 2*x*w*du) * dout[i]
	}
}

// tanh in float64, rounded once: 1-2/(exp(2x)+1) in float32 would lose
// the relative precision of small x.
func tanh(out, inp []float32) {
	for i, x := range inp {
		out[i] = float32(math.Tanh(float64(x)))
	}
}

// tanh'(x) = 1 - y^2 with y = tanh(x) as the forward rounds it.
func tanhBackward(dinp, inp, dout []float32) {
	for i, x := range inp {
		y := float32(math.Tanh(float64(x)))
		dinp[i] += dout[i] * (1 - y*y)
	}
}

// ActivationForward is out = f(inp) elementwise; either may be bfloat16
// (a bfloat16 out holds the float32 results rounded).
func (d *CPUDevice) ActivationForward(f Activation, out, inp *Tensor) {
	d.ownAny("ActivationForward", out, inp)
	check.ActivationForward(out, inp)
	a := activation("ActivationForward", f)
	full, half := hostAny(out, 0)
	x, xHalf := hostAny(inp, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(out.n, a.fwdCost)
	k := &d.k.act
	*k = activationK{out: full, inp: x, outHalf: half, inpHalf: xHalf, f: a.fwd}
	if half != nil || xHalf != nil {
		k.scratch = d.tiles(nc, 2)
	}
	d.parallel(out.n, nc, k)
	*k = activationK{}
}

// ActivationBackward is dinp += f'(inp)*dout; inp may be bfloat16.
func (d *CPUDevice) ActivationBackward(f Activation, dinp, inp, dout *Tensor) {
	d.own("ActivationBackward", dinp, dout)
	d.ownAny("ActivationBackward", inp)
	check.ActivationBackward(dinp, inp, dout)
	a := activation("ActivationBackward", f)
	x, xHalf := hostAny(inp, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(inp.n, a.bwdCost)
	k := &d.k.actB
	*k = activationBackK{dinp: dinp.Host(), inp: x, dout: dout.Host(), inpHalf: xHalf, f: a.bwd}
	if xHalf != nil {
		k.scratch = d.tiles(nc, 1)
	}
	d.parallel(inp.n, nc, k)
	*k = activationBackK{}
}

// activationFuncs is an Activation's forward and backward functions and
// their work an element (for d.chunks).
type activationFuncs struct {
	fwd              func(out, inp []float32)
	bwd              func(dinp, inp, dout []float32)
	fwdCost, bwdCost int
}

// activation is f's functions; fn names the kernel in the panic of an
// unknown f.
func activation(fn string, f Activation) activationFuncs {
	switch f {
	case GELU:
		return activationFuncs{gelu, geluBackward, 20, 30}
	case Tanh:
		return activationFuncs{tanh, tanhBackward, 40, 40}
	}
	panic(unknownActivation(fn, f))
}

// biasActivationK is BiasActivationForward over rows: a row's columns a
// tile at a time get the bias (rounded into a bfloat16 pre, and f then
// reads the rounded values), then f into out (rounded into a bfloat16
// out), so that pre is read from memory once.
type biasActivationK struct {
	pre, out, bias   []float32
	preHalf, outHalf []uint16
	scratch          []float32 // 2 tiles a chunk, with a bfloat16 operand
	f                func(out, inp []float32)
}

func (k *biasActivationK) run(lo, hi, chunk int) {
	oc := len(k.bias)
	var s []float32
	if k.scratch != nil {
		s = chunkTiles(k.scratch, chunk, 2)
	}
	for r := lo; r < hi; r++ {
		for c0 := 0; c0 < oc; c0 += tileLen {
			c1 := min(c0+tileLen, oc)
			a, b := r*oc+c0, r*oc+c1
			x := tileOf(k.pre, k.preHalf, a, b, s)
			for j, v := range k.bias[c0:c1] {
				x[j] += v
			}
			if k.preHalf != nil {
				RoundBF16(k.preHalf[a:b], x)
				WidenBF16(x, k.preHalf[a:b])
			}
			if k.outHalf == nil {
				k.f(k.out[a:b], x)
				continue
			}
			res := s[tileLen : tileLen+b-a]
			k.f(res, x)
			RoundBF16(k.outHalf[a:b], res)
		}
	}
}

// BiasActivationForward is pre += bias (each row), then out = f(pre), in
// one pass over pre; either may be bfloat16.
func (d *CPUDevice) BiasActivationForward(f Activation, out, pre, bias *Tensor) {
	d.ownAny("BiasActivationForward", out, pre)
	d.own("BiasActivationForward", bias)
	n := check.BiasActivationForward(out, pre, bias)
	a := activation("BiasActivationForward", f)
	o, oHalf := hostAny(out, 0)
	p, pHalf := hostAny(pre, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, (a.fwdCost+1)*bias.n)
	k := &d.k.bact
	*k = biasActivationK{pre: p, out: o, bias: bias.Host(), preHalf: pHalf, outHalf: oHalf, f: a.fwd}
	if pHalf != nil || oHalf != nil {
		k.scratch = d.tiles(nc, 2)
	}
	d.parallel(n, nc, k)
	*k = biasActivationK{}
}

// activationInPlaceK is ActivationBackwardInPlace: dout a tile at a time
// copied aside and zeroed, then f's accumulating backward into it, so the
// bits are those of ActivationBackward into zeros.
type activationInPlaceK struct {
	dout, inp []float32
	doutHalf  []uint16 // a bfloat16 dout's (dout nil)
	inpHalf   []uint16
	scratch   []float32 // 3 tiles a chunk: dout's copy, a bfloat16 inp widened, a bfloat16 dout's result
	f         func(dinp, inp, dout []float32)
}

func (k *activationInPlaceK) run(lo, hi, chunk int) {
	s := chunkTiles(k.scratch, chunk, 3)
	g, res := s[tileLen:2*tileLen], s[2*tileLen:]
	overTiles(lo, hi, k.inp, k.inpHalf, s[:tileLen], func(a, b int, x []float32) {
		if k.doutHalf == nil {
			d := k.dout[a:b]
			copy(g, d)
			clear(d)
			k.f(d, x, g[:b-a])
			return
		}
		// The float32 kernel's result on the widened gradient, rounded.
		WidenBF16(g[:b-a], k.doutHalf[a:b])
		d := res[:b-a]
		clear(d)
		k.f(d, x, g[:b-a])
		RoundBF16(k.doutHalf[a:b], d)
	})
}

// ActivationBackwardInPlace is dout = f'(inp)*dout; either may be
// bfloat16 (a bfloat16 dout widened, the product rounded into it).
func (d *CPUDevice) ActivationBackwardInPlace(f Activation, dout, inp *Tensor) {
	d.ownAny("ActivationBackwardInPlace", dout, inp)
	check.ActivationBackwardInPlace(dout, inp)
	a := activation("ActivationBackwardInPlace", f)
	x, xHalf := hostAny(inp, 0)
	g, gHalf := hostAny(dout, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(inp.n, a.bwdCost)
	k := &d.k.actIn
	*k = activationInPlaceK{dout: g, doutHalf: gHalf, inp: x, inpHalf: xHalf, scratch: d.tiles(nc, 3), f: a.bwd}
	d.parallel(inp.n, nc, k)
	*k = activationInPlaceK{}
}

// unknownActivation is the panic message of a kernel given an Activation
// that is not one of the constants.
func unknownActivation(fn string, f Activation) string {
	return fmt.Sprintf("tensor.%s: unknown activation %d", fn, int(f))
}

// --- softmax ---

type softmaxK struct {
	out, inp    []float32
	outHalf     []uint16 // a bfloat16 out's (out nil)
	scratch     []float32
	scale       float32
	tq, tk      int
	causal      bool
	keyValid    []int32 // (B,Tk) or nil
	rowsPerItem int     // rows per batch item, for keyValid
}

func (k *softmaxK) run(lo, hi, chunk int) {
	tk := k.tk
	for r := lo; r < hi; r++ {
		end := tk // keys [end,tk) are masked by causality
		if k.causal {
			end = min(tk, max(0, r%k.tq+1+tk-k.tq))
		}
		var valid []int32
		if k.keyValid != nil {
			b := r / k.rowsPerItem
			valid = k.keyValid[b*tk : (b+1)*tk]
		}
		var o []float32
		if k.outHalf != nil {
			o = k.scratch[chunk*tk : (chunk+1)*tk] // the row in float32, rounded after
		} else {
			o = k.out[r*tk : (r+1)*tk]
		}
		softmaxRow(o[:end], k.inp[r*tk:r*tk+end], valid, k.scale)
		clear(o[end:])
		if k.outHalf != nil {
			RoundBF16(k.outHalf[r*tk:], o)
		}
	}
}

// softmaxRow is o = softmax(scale*x) over the keys where valid is nonzero
// (all of them when valid is nil), 0 elsewhere and everywhere when no key
// is valid.
func softmaxRow(o, x []float32, valid []int32, scale float32) {
	j, mx := 0, float32(math.Inf(-1))
	if valid == nil {
		j, mx = maxVec(x)
	}
	for ; j < len(x); j++ {
		if (valid == nil || valid[j] != 0) && x[j] > mx {
			mx = x[j]
		}
	}
	if math.IsInf(float64(mx), -1) {
		clear(o)
		return
	}
	var sum float64
	j = 0
	if valid == nil {
		j, sum = expShiftVec(o, x, scale, mx)
	}
	for ; j < len(x); j++ {
		if valid != nil && valid[j] == 0 {
			o[j] = 0
			continue
		}
		e := exp32(scale * (x[j] - mx))
		o[j] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for j := range o {
		o[j] *= inv
	}
}

// SoftmaxForward is the masked row softmax of scale*inp. inp, out are
// (B,...,Tq,Tk), out float32 or bfloat16; keyValid is (B,Tk) or nil.
func (d *CPUDevice) SoftmaxForward(out, inp *Tensor, scale float32, causal bool, keyValid []int32) {
	d.own("SoftmaxForward", inp)
	d.ownAny("SoftmaxForward", out)
	rows, perItem := check.SoftmaxForward(out, inp, scale, keyValid)
	tk, tq := inp.Dim(-1), inp.Dim(-2)
	o, oHalf := hostAny(out, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(rows, 10*tk)
	k := &d.k.sm
	*k = softmaxK{out: o, outHalf: oHalf, inp: inp.Host(), scale: scale, tq: tq, tk: tk, causal: causal, keyValid: keyValid, rowsPerItem: perItem}
	if oHalf != nil {
		k.scratch = d.scratch32(nc * tk)
	}
	d.parallel(rows, nc, k)
	*k = softmaxK{}
}

type softmaxBackK struct {
	dinp, dout, out []float32
	outHalf         []uint16  // a bfloat16 out's (out nil), each row widened into scratch
	dinpHalf        []uint16  // a bfloat16 dinp's (dinp nil): each row widened, added to and rounded back
	scratch         []float32 // 2 rows a chunk, with a bfloat16 operand
	scale           float32
	tk              int
}

func (k *softmaxBackK) run(lo, hi, chunk int) {
	tk := k.tk
	var s []float32
	if k.scratch != nil {
		s = k.scratch[chunk*2*tk : (chunk+1)*2*tk]
	}
	for r := lo; r < hi; r++ {
		y := tileOf(k.out, k.outHalf, r*tk, (r+1)*tk, s[:min(len(s), tk)])
		dx := tileOf(k.dinp, k.dinpHalf, r*tk, (r+1)*tk, s[min(len(s), tk):])
		g := k.dout[r*tk : (r+1)*tk]
		var dot float64
		for j, v := range y {
			dot += float64(v * g[j])
		}
		d := float32(dot)
		for j, v := range y {
			dx[j] += k.scale * v * (g[j] - d)
		}
		if k.dinpHalf != nil {
			RoundBF16(k.dinpHalf[r*tk:(r+1)*tk], dx)
		}
	}
}

// SoftmaxBackward is dinp += scale*out*(dout - rowsum(dout*out)). All are
// (B,...,Tq,Tk); out may be bfloat16, and dinp (widened, added to and
// rounded).
func (d *CPUDevice) SoftmaxBackward(dinp, dout, out *Tensor, scale float32) {
	d.own("SoftmaxBackward", dout)
	d.ownAny("SoftmaxBackward", dinp, out)
	rows := check.SoftmaxBackward(dinp, dout, out)
	tk := out.Cols()
	y, yHalf := hostAny(out, 0)
	dx, dxHalf := hostAny(dinp, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(rows, 4*tk)
	k := &d.k.smB
	*k = softmaxBackK{dinp: dx, dout: dout.Host(), out: y, outHalf: yHalf, dinpHalf: dxHalf, scale: scale, tk: tk}
	if yHalf != nil || dxHalf != nil {
		k.scratch = d.scratch32(nc * 2 * tk)
	}
	d.parallel(rows, nc, k)
	*k = softmaxBackK{}
}

// --- cross-entropy ---

type ceOp int

const (
	ceRowMax ceOp = iota
	ceSumExp
	ceBackward
	ceForward         // rowMax, sumExp and the loss of a row, one pass
	ceBackwardInPlace // the gradient over the row's first cols logits
)

type ceK struct {
	op                     ceOp
	logits, dlogits        []float32 // (N,V)
	rowMax, sumExp, target []float32 // (N)
	losses                 []float32 // (N)
	targets                []int32
	v, start, cols         int
	dloss                  float32
	// half are bfloat16 logits (logits nil), each row widened into the
	// chunk's row of scratch (V floats a chunk) and worked on there: the
	// float32 kernel's bits on the widened values. The in-place backward
	// rounds its row back.
	half    []uint16
	scratch []float32
}

func (k *ceK) run(lo, hi, chunk int) {
	v := k.v
	for i := lo; i < hi; i++ {
		var x []float32
		if k.half != nil {
			x = k.scratch[chunk*v : (chunk+1)*v]
			n := v
			if k.op == ceBackwardInPlace {
				n = k.cols
			}
			WidenBF16(x[:n], k.half[i*v:i*v+n])
		} else {
			x = k.logits[i*v : (i+1)*v]
		}
		k.row(i, x)
		if k.half != nil && k.op == ceBackwardInPlace {
			RoundBF16(k.half[i*v:], x[:k.cols])
		}
	}
}

// row is the kernel's work on row i, whose logits are x.
func (k *ceK) row(i int, x []float32) {
	v := k.v
	switch k.op {
	case ceRowMax:
		k.rowMax[i] = rowMax(x)
	case ceSumExp:
		k.sumExp[i] = sumExp(x, k.rowMax[i])
	case ceForward:
		// The row is read twice, the second time from the cache.
		mx := rowMax(x)
		se := sumExp(x, mx)
		k.rowMax[i], k.sumExp[i], k.losses[i] = mx, se, 0
		if t := k.targets[i]; t >= 0 {
			var tl float32
			if int(t) < v {
				tl = x[t]
			}
			k.losses[i] = ceLoss(se, mx, tl)
		}
	case ceBackwardInPlace:
		x = x[:k.cols]
		t := k.targets[i]
		if t < 0 {
			clear(x)
			return
		}
		mx, c := k.rowMax[i], k.dloss/k.sumExp[i]
		for j := expScaleVec(x, mx, c); j < len(x); j++ {
			x[j] = c * exp32(x[j]-mx)
		}
		if j := int(t) - k.start; j >= 0 && j < len(x) {
			x[j] -= k.dloss
		}
	case ceBackward:
		t := k.targets[i]
		if t < 0 {
			return
		}
		mx, c := k.rowMax[i], k.dloss/k.sumExp[i]
		dx := k.dlogits[i*v : (i+1)*v]
		for j := expAxpyVec(dx, x, mx, c); j < v; j++ {
			dx[j] += c * exp32(x[j]-mx)
		}
		if j := int(t) - k.start; j >= 0 && j < v {
			dx[j] -= k.dloss
		}
	}
}

// rowMax is the largest of x (-Inf when x is empty).
func rowMax(x []float32) float32 {
	j, mx := maxVec(x)
	for ; j < len(x); j++ {
		if x[j] > mx {
			mx = x[j]
		}
	}
	return mx
}

// sumExp is the sum of exp(x-mx), accumulated in float64.
func sumExp(x []float32, mx float32) float32 {
	j, s := expSumVec(x, mx)
	for ; j < len(x); j++ {
		s += float64(exp32(x[j] - mx))
	}
	return float32(s)
}

// ceLoss is a row's loss, log(sumExp) + rowMax - targetLogit.
func ceLoss(sumExp, rowMax, targetLogit float32) float32 {
	return float32(math.Log(float64(sumExp)) + float64(rowMax) - float64(targetLogit))
}

// ceRun runs one row pass of the cross-entropy kernel over logits (N,V),
// float32 or bfloat16.
func (d *CPUDevice) ceRun(k ceK, logits *Tensor, n, cost int) {
	k.logits, k.half = hostAny(logits, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	nc := d.chunks(n, cost)
	if k.half != nil {
		k.scratch = d.scratch32(nc * k.v)
	}
	d.k.ce = k
	d.parallel(n, nc, &d.k.ce)
	d.k.ce = ceK{}
}

// CrossEntropyRowMax is rowMax[i] = max_j logits[i,j]. logits is (N,V),
// float32 or bfloat16; rowMax is (N).
func (d *CPUDevice) CrossEntropyRowMax(rowMax, logits *Tensor) {
	d.own("CrossEntropyRowMax", rowMax)
	d.ownAny("CrossEntropyRowMax", logits)
	n := check.CrossEntropyRowMax(rowMax, logits)
	d.ceRun(ceK{op: ceRowMax, rowMax: rowMax.Host(), v: logits.Cols()}, logits, n, logits.Cols())
}

// CrossEntropySumExp is sumExp[i] = sum_j exp(logits[i,j]-rowMax[i]).
// logits is (N,V), float32 or bfloat16; sumExp and rowMax are (N).
func (d *CPUDevice) CrossEntropySumExp(sumExp, logits, rowMax *Tensor) {
	d.own("CrossEntropySumExp", sumExp, rowMax)
	d.ownAny("CrossEntropySumExp", logits)
	n := check.CrossEntropySumExp(sumExp, logits, rowMax)
	d.ceRun(ceK{op: ceSumExp, rowMax: rowMax.Host(), sumExp: sumExp.Host(), v: logits.Cols()}, logits, n, 10*logits.Cols())
}

// CrossEntropyTargetLogit is out[i] = logits[i,targets[i]-vocabStart] for
// targets in the slice, else 0. logits is (N,V), float32 or bfloat16 (the
// logit widened); out and targets are (N).
func (d *CPUDevice) CrossEntropyTargetLogit(out, logits *Tensor, targets []int32, vocabStart int) {
	d.own("CrossEntropyTargetLogit", out)
	d.ownAny("CrossEntropyTargetLogit", logits)
	check.CrossEntropyTargetLogit(out, logits, targets)
	v := logits.Cols()
	o := out.Host()
	x, h := hostAny(logits, 0)
	for i, t := range targets {
		o[i] = 0
		if j := int(t) - vocabStart; t >= 0 && j >= 0 && j < v {
			if h != nil {
				o[i] = Float32FromBF16(h[i*v+j])
			} else {
				o[i] = x[i*v+j]
			}
		}
	}
}

// CrossEntropyLoss is losses[i] = log(sumExp[i]) + rowMax[i] - targetLogit[i],
// 0 where targets[i] < 0. All are (N).
func (d *CPUDevice) CrossEntropyLoss(losses, rowMax, sumExp, targetLogit *Tensor, targets []int32) {
	d.own("CrossEntropyLoss", losses, rowMax, sumExp, targetLogit)
	check.CrossEntropyLoss(losses, rowMax, sumExp, targetLogit, targets)
	l, mx, se, tl := losses.Host(), rowMax.Host(), sumExp.Host(), targetLogit.Host()
	for i, t := range targets {
		l[i] = 0
		if t >= 0 {
			l[i] = ceLoss(se[i], mx[i], tl[i])
		}
	}
}

// CrossEntropyForward is the unsharded cross-entropy in one pass a row:
// rowMax, sumExp and losses as the pieces give them. logits is (N,V);
// losses, rowMax, sumExp and targets are (N).
func (d *CPUDevice) CrossEntropyForward(losses, rowMax, sumExp, logits *Tensor, targets []int32) {
	d.own("CrossEntropyForward", losses, rowMax, sumExp)
	d.ownAny("CrossEntropyForward", logits)
	n := check.CrossEntropyForward(losses, rowMax, sumExp, logits, targets)
	d.ceRun(ceK{op: ceForward, rowMax: rowMax.Host(), sumExp: sumExp.Host(), losses: losses.Host(), targets: targets, v: logits.Cols()}, logits, n, 11*logits.Cols())
}

// CrossEntropyBackwardInPlace overwrites logits[:, :cols] with
// dloss*(softmax(logits) - onehot(targets)), 0 on rows without a target.
func (d *CPUDevice) CrossEntropyBackwardInPlace(logits, rowMax, sumExp *Tensor, targets []int32, vocabStart, cols int, dloss float32) {
	d.own("CrossEntropyBackwardInPlace", rowMax, sumExp)
	d.ownAny("CrossEntropyBackwardInPlace", logits)
	n := check.CrossEntropyBackwardInPlace(logits, rowMax, sumExp, targets, cols)
	d.ceRun(ceK{op: ceBackwardInPlace, rowMax: rowMax.Host(), sumExp: sumExp.Host(), targets: targets, v: logits.Cols(), start: vocabStart, cols: cols, dloss: dloss}, logits, n, 11*cols)
}

// CrossEntropyBackward is dlogits += dloss*(softmax(logits) - onehot(targets)).
// dlogits, logits are (N,V); rowMax, sumExp, targets are (N).
func (d *CPUDevice) CrossEntropyBackward(dlogits, logits, rowMax, sumExp *Tensor, targets []int32, vocabStart int, dloss float32) {
	d.own("CrossEntropyBackward", dlogits, logits, rowMax, sumExp)
	n := check.CrossEntropyBackward(dlogits, logits, rowMax, sumExp, targets)
	v := logits.Cols()
	d.ceRun(ceK{op: ceBackward, dlogits: dlogits.Host(), rowMax: rowMax.Host(), sumExp: sumExp.Host(), targets: targets, v: v, start: vocabStart, dloss: dloss}, logits, n, 12*v)
}

// --- optimizer and norms ---

type adamK struct {
	param, grad, m, v   []float32
	half                []uint16 // param's bfloat16 copy, or nil
	lr, b1, b2, eps, wd float32
	bc1, bc2, gradScale float32
}

// adamPiece is how many elements adamK updates before it rounds them into
// the bfloat16 copy: few enough to be still in cache then (a chunk of a
// large tensor is not).
const adamPiece = 4096

func (k *adamK) run(lo, hi, _ int) {
	for at := lo; at < hi; at += adamPiece {
		end := min(at+adamPiece, hi)
		k.update(at, end)
		if k.half != nil {
			RoundBF16(k.half[at:end], k.param[at:end])
		}
	}
}

// update is the AdamW step of elements lo to hi.
func (k *adamK) update(lo, hi int) {
	p, g, m, v := k.param[lo:hi], k.grad[lo:hi], k.m[lo:hi], k.v[lo:hi]
	done := adamwVec(k, p, g, m, v)
	p, g, m, v = p[done:], g[done:], m[done:], v[done:]
	for i := range p {
		gi := g[i] * k.gradScale
		mi := k.b1*m[i] + (1-k.b1)*gi
		vi := k.b2*v[i] + (1-k.b2)*gi*gi
		m[i], v[i] = mi, vi
		mhat, vhat := mi/k.bc1, vi/k.bc2
		p[i] -= k.lr * (mhat/(float32(math.Sqrt(float64(vhat)))+k.eps) + k.wd*p[i])
	}
}

// AdamW runs one AdamW step on param with its grad and moments m, v, the
// gradients scaled by scale[0] (1 when scale is nil), rounding the result
// into half when there is one.
func (d *CPUDevice) AdamW(param, grad, m, v, half *Tensor, p AdamWParams, scale *Tensor) {
	d.own("AdamW", param, grad, m, v)
	var h []uint16
	if half != nil {
		d.ownAny("AdamW", half)
		check.AdamW(param, grad, m, v, half, p.Step)
		h = half.HostBF16()
	} else {
		check.AdamW(param, grad, m, v, nil, p.Step)
	}
	gs := float32(1)
	if scale != nil {
		d.own("AdamW", scale)
		check.AdamWScale(scale)
		gs = scale.Host()[0]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.adam
	*k = adamK{param: param.Host(), grad: grad.Host(), m: m.Host(), v: v.Host(), half: h,
		lr: p.LR, b1: p.Beta1, b2: p.Beta2, eps: p.Eps, wd: p.WeightDecay,
		bc1:       float32(1 - math.Pow(float64(p.Beta1), float64(p.Step))),
		bc2:       float32(1 - math.Pow(float64(p.Beta2), float64(p.Step))),
		gradScale: gs}
	d.parallel(param.n, d.chunks(param.n, 20), k)
	*k = adamK{}
}

type sumSqK struct {
	x    []float32
	part []float64 // per chunk
}

func (k *sumSqK) run(lo, hi, chunk int) {
	var s float64
	for _, v := range k.x[lo:hi] {
		s += float64(v) * float64(v)
	}
	k.part[chunk] = s
}

// sumSquares is the sum of squares of t's elements, in float64, added
// chunk by chunk in order (SumSquaresEach's value).
func (d *CPUDevice) sumSquares(t *Tensor) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := &d.k.sumsq
	nc := d.chunks(t.n, 2)
	*k = sumSqK{x: t.Host(), part: d.scratch64(nc)}
	d.parallel(t.n, nc, k)
	var total float64
	for _, s := range k.part {
		total += s
	}
	*k = sumSqK{}
	return total
}
