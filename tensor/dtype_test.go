package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// nearestBF16 is round-to-nearest-even to bfloat16 from its definition:
// of the two bfloat16 values around v (v with its low 16 bits cut, and the
// next one away from zero), the nearer in float64, the one with an even
// last bit on a tie; past the largest finite value, infinity.
func nearestBF16(v float32) float32 {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return v
	}
	b := math.Float32bits(v)
	lo := b &^ 0xffff
	hi := lo + 0x10000
	hv := float64(math.Float32frombits(hi))
	if math.IsInf(hv, 0) { // past the largest finite: measured to 2^128, as IEEE 754 rounds
		hv = math.Copysign(math.Ldexp(1, 128), hv)
	}
	dl := math.Abs(float64(v) - float64(math.Float32frombits(lo)))
	dh := math.Abs(hv - float64(v))
	switch {
	case dl < dh, dl == dh && lo&0x10000 == 0:
		return math.Float32frombits(lo)
	}
	return math.Float32frombits(hi) // the exponent carries; from the largest finite, infinity
}

// TestBF16RoundsToNearestEven checks BF16FromFloat32 against nearestBF16
// on random values of every magnitude, ties, subnormals and the edges,
// and that NaNs stay NaNs.
func TestBF16RoundsToNearestEven(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vals := []float32{0, -0, 1, 1 + 1.0/256, 1 + 3.0/256, -(1 + 1.0/256), math.MaxFloat32, -math.MaxFloat32, 0x1p-130, 0x1p-149,
		math.Float32frombits(0x7f7f8000), float32(math.Inf(1)), float32(math.Inf(-1))}
	for range 100000 {
		vals = append(vals, math.Float32frombits(r.Uint32()&^0x7f800000|uint32(r.IntN(255))<<23))
	}
	for _, v := range vals {
		got, want := Float32FromBF16(BF16FromFloat32(v)), nearestBF16(v)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("bfloat16 of %g (%#x): %g (%#x), want %g (%#x)", v, math.Float32bits(v), got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff} {
		if got := Float32FromBF16(BF16FromFloat32(math.Float32frombits(bits))); !math.IsNaN(float64(got)) {
			t.Errorf("NaN %#x became %g", bits, got)
		}
	}
}

// TestCPUBF16Storage checks bfloat16 tensors on the CPU device: 2 bytes an
// element in the accounting, copies that round (from the host, between
// dtypes) and widen exactly, a GEMM that reads a bfloat16 operand as the
// float32 tensor of its widened values, AdamW that writes a parameter's
// bfloat16 copy, and the refusal of the other kernels.
func TestCPUBF16Storage(t *testing.T) {
	d := NewCPU()
	const n = 999
	h, err := d.AllocAs(BFloat16, n)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.MemStats().Current; got != 2*n || h.Bytes() != 2*n || !strings.Contains(h.String(), "bfloat16") {
		t.Errorf("%v: %d bytes allocated, Bytes %d; want %d", h, got, h.Bytes(), 2*n)
	}
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(r.NormFloat64())
	}
	d.CopyFromHost(h, src)
	got := make([]float32, n)
	d.CopyToHost(got, h)
	f, _ := d.Alloc(n)
	d.Copy(f, h)
	g, _ := d.AllocAs(BFloat16, n)
	d.Copy(g, f)
	for i, v := range src {
		want := nearestBF16(v)
		if got[i] != want || f.Host()[i] != want || Float32FromBF16(g.HostBF16()[i]) != want {
			t.Fatalf("element %d: %g rounds to %g (CopyToHost), %g (Copy to float32), %g (Copy back); want %g", i, v, got[i], f.Host()[i], Float32FromBF16(g.HostBF16()[i]), want)
		}
	}

	// C = A op(B): B a bfloat16 view at an odd offset, against its
	// widened float32 copy; batched too.
	const m, k, nn = 7, 33, 5
	a, _ := d.Alloc(m, k)
	for i := range a.Host() {
		a.Host()[i] = float32(r.NormFloat64())
	}
	bw, _ := d.Alloc(3*nn*k + 1)
	d.Copy(bw, h.View(1, 3*nn*k+1))
	c1, _ := d.Alloc(m, 3*nn)
	c2, _ := d.Alloc(m, 3*nn)
	d.Gemm(false, true, m, 3*nn, k, 1, a, 0, k, bw, 1, k, 0, c1, 0, 3*nn)
	d.Gemm(false, true, m, 3*nn, k, 1, a, 0, k, h, 2, k, 0, c2, 0, 3*nn)
	for i := range c1.Host() {
		if c1.Host()[i] != c2.Host()[i] {
			t.Fatalf("Gemm: element %d is %g from the bfloat16 operand, %g from its float32 widening", i, c2.Host()[i], c1.Host()[i])
		}
	}
	d.GemmStridedBatched(false, true, m, nn, k, 1, a, 0, k, 0, bw, 1, k, nn*k, 0, c1, 0, 3*nn, nn, 3)
	d.GemmStridedBatched(false, true, m, nn, k, 1, a, 0, k, 0, h, 2, k, nn*k, 0, c2, 0, 3*nn, nn, 3)
	for i := range c1.Host() {
		if c1.Host()[i] != c2.Host()[i] {
			t.Fatalf("GemmStridedBatched: element %d is %g from the bfloat16 operand, %g from its float32 widening", i, c2.Host()[i], c1.Host()[i])
		}
	}

	// Large enough for the threaded driver, B both ways round: the packing
	// widens it (packBHalf); A in bfloat16 too (an activation), either way
	// round, with B of either dtype (packAHalf). Depths past a multiple of
	// the packers' 16 and past a kc block (384 with AVX-512) too.
	for _, tc := range []struct {
		transB, halfA, transA bool
		k                     int
	}{{false, false, false, 96}, {true, false, false, 96}, {false, true, false, 96}, {true, true, false, 96}, {false, true, true, 96}, {true, true, true, 96},
		{false, true, false, 45}, {true, true, true, 45}, {true, true, false, 401}, {false, true, true, 401}} {
		transB, k := tc.transB, tc.k
		const m, n = 70, 130
		lda := k
		if tc.transA {
			lda = m
		}
		a, _ := d.Alloc(m, k)
		for i := range a.Host() {
			a.Host()[i] = nearestBF16(float32(r.NormFloat64()))
		}
		ah := a
		if tc.halfA {
			ah, _ = d.AllocAs(BFloat16, m, k)
			d.Copy(ah, a)
		}
		bh, _ := d.AllocAs(BFloat16, k*n)
		bf, _ := d.Alloc(k * n)
		vals := make([]float32, k*n)
		for i := range vals {
			vals[i] = float32(r.NormFloat64())
		}
		d.CopyFromHost(bh, vals)
		d.Copy(bf, bh)
		ldb := n
		if transB {
			ldb = k
		}
		c1, _ := d.Alloc(m, n)
		c2, _ := d.Alloc(m, n)
		for i := range c1.Host() {
			c1.Host()[i], c2.Host()[i] = 1, 1
		}
		d.Gemm(tc.transA, transB, m, n, k, 0.5, a, 0, lda, bf, 0, ldb, 2, c1, 0, n)
		d.Gemm(tc.transA, transB, m, n, k, 0.5, ah, 0, lda, bh, 0, ldb, 2, c2, 0, n)
		for i := range c1.Host() {
			if c1.Host()[i] != c2.Host()[i] {
				t.Fatalf("Gemm %+v: element %d is %g from the bfloat16 operands, %g from their float32 widening", tc, i, c2.Host()[i], c1.Host()[i])
			}
		}
		if tc.halfA {
			// And a bfloat16 A with a float32 B.
			d.Gemm(tc.transA, transB, m, n, k, 0.5, ah, 0, lda, bf, 0, ldb, 0, c2, 0, n)
			d.Gemm(tc.transA, transB, m, n, k, 0.5, a, 0, lda, bf, 0, ldb, 0, c1, 0, n)
			for i := range c1.Host() {
				if c1.Host()[i] != c2.Host()[i] {
					t.Fatalf("Gemm %+v, B float32: element %d is %g from the bfloat16 A, %g from its widening", tc, i, c2.Host()[i], c1.Host()[i])
				}
			}
			d.Free(ah)
		}
		for _, x := range []*Tensor{a, bh, bf, c1, c2} {
			d.Free(x)
		}
	}

	// An activation into a bfloat16 output: the float32 results rounded
	// (ties included: inputs on a grid whose GELU values land on them are
	// rare, so the check is against the float32 kernel's own output).
	for _, f := range []Activation{GELU, Tanh} {
		const n = 5000 // several tiles of roundedTo, and chunks on the workers
		x, _ := d.Alloc(n)
		for i := range x.Host() {
			x.Host()[i] = float32(r.NormFloat64() * 3)
		}
		full, _ := d.Alloc(n)
		half, _ := d.AllocAs(BFloat16, n)
		d.ActivationForward(f, full, x)
		d.ActivationForward(f, half, x)
		for i, v := range full.Host() {
			if got := half.HostBF16()[i]; got != BF16FromFloat32(v) {
				t.Fatalf("activation %d into bfloat16: element %d is %#x, want %g rounded, %#x", f, i, got, v, BF16FromFloat32(v))
			}
		}
		for _, t := range []*Tensor{x, full, half} {
			d.Free(t)
		}
	}
	// The norms likewise (their statistics stay float32).
	{
		const rows, c = 37, 96
		x, _ := d.Alloc(rows, c)
		w, _ := d.Alloc(c)
		bias, _ := d.Alloc(c)
		for _, t := range []*Tensor{x, w, bias} {
			for i := range t.Host() {
				t.Host()[i] = float32(r.NormFloat64())
			}
		}
		full, _ := d.Alloc(rows, c)
		half, _ := d.AllocAs(BFloat16, rows, c)
		mean, _ := d.Alloc(rows)
		rstd, _ := d.Alloc(rows)
		same := func(what string) {
			t.Helper()
			for i, v := range full.Host() {
				if got := half.HostBF16()[i]; got != BF16FromFloat32(v) {
					t.Fatalf("%s into bfloat16: element %d is %#x, want %g rounded, %#x", what, i, got, v, BF16FromFloat32(v))
				}
			}
		}
		d.LayerNormForward(full, mean, rstd, x, w, bias, 1e-5)
		d.LayerNormForward(half, mean, rstd, x, w, bias, 1e-5)
		same("LayerNormForward")
		d.RMSNormForward(full, rstd, x, w, 1e-5)
		d.RMSNormForward(half, rstd, x, w, 1e-5)
		same("RMSNormForward")
		for _, t := range []*Tensor{x, w, bias, full, half, mean, rstd} {
			d.Free(t)
		}
	}
	// SwiGLU likewise, rows wider than roundedTo's tile.
	{
		const rows, f = 9, 700
		x, _ := d.Alloc(rows, 2*f)
		for i := range x.Host() {
			x.Host()[i] = float32(r.NormFloat64() * 3)
		}
		full, _ := d.Alloc(rows, f)
		half, _ := d.AllocAs(BFloat16, rows, f)
		d.SwiGLUForward(full, x)
		d.SwiGLUForward(half, x)
		for i, v := range full.Host() {
			if got := half.HostBF16()[i]; got != BF16FromFloat32(v) {
				t.Fatalf("SwiGLU into bfloat16: element %d is %#x, want %g rounded, %#x", i, got, v, BF16FromFloat32(v))
			}
		}
		for _, t := range []*Tensor{x, full, half} {
			d.Free(t)
		}
	}

	// AdamW rounds the updated values into the bfloat16 copy.
	{
		const n = 1 << 16 // past minParallelWork: chunks on the workers
		ts := make([]*Tensor, 4)
		for i := range ts {
			ts[i], _ = d.Alloc(n)
			for j := range ts[i].Host() {
				ts[i].Host()[j] = float32(r.NormFloat64())
			}
		}
		clear(ts[3].Host()) // v >= 0
		half, _ := d.AllocAs(BFloat16, n)
		d.AdamW(ts[0], ts[1], ts[2], ts[3], half, AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}, nil)
		for j, p := range ts[0].Host() {
			if got := half.HostBF16()[j]; got != BF16FromFloat32(p) {
				t.Fatalf("AdamW's bfloat16 copy[%d] = %#x, want the new value %g rounded, %#x", j, got, p, BF16FromFloat32(p))
			}
		}
		for _, x := range append(ts, half) {
			d.Free(x)
		}
	}

	refused := func(what string, f func()) {
		t.Helper()
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "bfloat16") {
				t.Errorf("%s: recovered %v, want a panic that names bfloat16", what, r)
			}
		}()
		f()
	}
	refused("Add on a bfloat16 tensor", func() { d.Add(h, h, h) })
	refused("Host of a bfloat16 tensor", func() { h.Host() })
	for _, x := range []*Tensor{h, f, g, a, bw, c1, c2} {
		d.Free(x)
	}
	if got := d.MemStats().Current; got != 0 {
		t.Errorf("%d bytes left after freeing everything", got)
	}
}

// TestCPUBF16Inputs checks the kernels that read a bfloat16 activation
// (the MLP's pre-activation) or write one through a product: each equals
// its float32 kernel on the widened input, exactly, and a bfloat16 result
// is that kernel's float32 result rounded to nearest even.
func TestCPUBF16Inputs(t *testing.T) {
	d := NewCPU()
	d.minWork = 64 // chunks on the workers
	r := rand.New(rand.NewPCG(7, 8))
	// pair is a bfloat16 tensor of random values of std sd and a float32
	// one of the same values, widened.
	pair := func(sd float64, shape ...int) (half, wide *Tensor) {
		half, _ = d.AllocAs(BFloat16, shape...)
		wide, _ = d.Alloc(shape...)
		for i := range wide.Host() {
			half.HostBF16()[i] = BF16FromFloat32(float32(r.NormFloat64() * sd))
			wide.Host()[i] = Float32FromBF16(half.HostBF16()[i])
		}
		return half, wide
	}
	random := func(shape ...int) *Tensor {
		x, _ := d.Alloc(shape...)
		for i := range x.Host() {
			x.Host()[i] = float32(r.NormFloat64())
		}
		return x
	}
	same := func(what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d is %g, want %g (the float32 kernel on the widened input)", what, i, got[i], want[i])
			}
		}
	}
	rounded := func(what string, got []uint16, want []float32) {
		t.Helper()
		for i, v := range want {
			if got[i] != BF16FromFloat32(v) {
				t.Fatalf("%s: element %d is %#x, want %g rounded, %#x", what, i, got[i], v, BF16FromFloat32(v))
			}
		}
	}

	for _, f := range []Activation{GELU, Tanh} {
		const n = 1500 // several tiles
		xh, xw := pair(3, n)
		want, got := random(n), random(n)
		outH, _ := d.AllocAs(BFloat16, n)
		d.ActivationForward(f, want, xw)
		d.ActivationForward(f, got, xh)
		same(fmt.Sprintf("activation %d from bfloat16", f), got.Host(), want.Host())
		d.ActivationForward(f, outH, xh)
		rounded(fmt.Sprintf("activation %d bfloat16 to bfloat16", f), outH.HostBF16(), want.Host())
		dout := random(n)
		d.Copy(got, want) // the same starting dinp: the backward accumulates
		d.ActivationBackward(f, want, xw, dout)
		d.ActivationBackward(f, got, xh, dout)
		same(fmt.Sprintf("activation %d backward from bfloat16", f), got.Host(), want.Host())
		for _, x := range []*Tensor{xh, xw, want, got, outH, dout} {
			d.Free(x)
		}
	}

	{
		const rows, f = 5, 700 // rows wider than a tile
		xh, xw := pair(3, rows, 2*f)
		want, got := random(rows, f), random(rows, f)
		outH, _ := d.AllocAs(BFloat16, rows, f)
		d.SwiGLUForward(want, xw)
		d.SwiGLUForward(got, xh)
		same("SwiGLU from bfloat16", got.Host(), want.Host())
		d.SwiGLUForward(outH, xh)
		rounded("SwiGLU bfloat16 to bfloat16", outH.HostBF16(), want.Host())
		dout := random(rows, f)
		dWant, dGot := random(rows, 2*f), random(rows, 2*f)
		d.Copy(dGot, dWant)
		d.SwiGLUBackward(dWant, xw, dout)
		d.SwiGLUBackward(dGot, xh, dout)
		same("SwiGLU backward from bfloat16", dGot.Host(), dWant.Host())
		// bfloat16 gradients: the float32 sums on the widened values,
		// rounded into dinp, from either dtype of inp.
		for _, x := range []*Tensor{xw, xh} {
			doH, doW := pair(1, rows, f)
			diH, diW := pair(1, rows, 2*f)
			d.SwiGLUBackward(diW, x, doW)
			d.SwiGLUBackward(diH, x, doH)
			rounded(fmt.Sprintf("SwiGLU backward into bfloat16 from %v", x.DType()), diH.HostBF16(), diW.Host())
			for _, x := range []*Tensor{doH, doW, diH, diW} {
				d.Free(x)
			}
		}
		for _, x := range []*Tensor{xh, xw, want, got, outH, dout, dWant, dGot} {
			d.Free(x)
		}
	}

	{
		// A bfloat16 softmax gradient: the float32 kernel's sums on the
		// widened values, rounded, from either dtype of the probabilities.
		const rows, tk = 6, 700
		outH, outW := pair(0.1, rows, tk)
		dout := random(rows, tk)
		for _, out := range []*Tensor{outW, outH} {
			diH, diW := pair(1, rows, tk)
			d.SoftmaxBackward(diW, dout, out, 0.3)
			d.SoftmaxBackward(diH, dout, out, 0.3)
			rounded(fmt.Sprintf("softmax backward into bfloat16 from %v", out.DType()), diH.HostBF16(), diW.Host())
			d.Free(diH)
			d.Free(diW)
		}
		for _, x := range []*Tensor{outH, outW, dout} {
			d.Free(x)
		}
	}

	{
		const rows, oc = 33, 70
		outH, outW := pair(2, rows, oc)
		bias := random(oc)
		d.AddBias(outW, bias)
		d.AddBias(outH, bias)
		rounded("AddBias on bfloat16", outH.HostBF16(), outW.Host())
		for _, x := range []*Tensor{outH, outW, bias} {
			d.Free(x)
		}
	}

	// RoPE on a bfloat16 x (a Llama's qkv): widened, rotated and rounded
	// again, both ways; and a bfloat16 block copied as is.
	{
		const rows, seq, hd, heads = 12, 6, 8, 5 // period 5, 4 rotated: the value head not
		xh, xw := pair(1, rows, heads*hd)
		table := random(seq, hd)
		for _, sign := range []float32{1, -1} {
			if sign > 0 {
				d.RoPEForward(xw, table, seq, heads, heads-1)
				d.RoPEForward(xh, table, seq, heads, heads-1)
			} else {
				d.RoPEBackward(xw, table, seq, heads, heads-1)
				d.RoPEBackward(xh, table, seq, heads, heads-1)
			}
			rounded(fmt.Sprintf("RoPE %v on bfloat16", sign), xh.HostBF16(), xw.Host())
			WidenBF16(xw.Host(), xh.HostBF16())
		}
		dst, _ := d.AllocAs(BFloat16, rows, 2*hd)
		d.Copy2D(dst, 1, 2*hd, xh, 3, heads*hd, rows, hd+2)
		for i := range rows {
			for j := range 2 * hd {
				want := uint16(0)
				if j >= 1 && j < hd+3 {
					want = xh.HostBF16()[i*heads*hd+3+j-1]
				}
				if got := dst.HostBF16()[i*2*hd+j]; got != want {
					t.Fatalf("Copy2D of bfloat16: (%d,%d) is %#x, want %#x", i, j, got, want)
				}
			}
		}
		for _, x := range []*Tensor{xh, xw, table, dst} {
			d.Free(x)
		}
	}

	// A product into a bfloat16 C: the float32 product rounded once, C
	// read (widened) where beta is not 0, columns past n untouched; whole,
	// and in pieces of a few rows (or a few of a batch's products) when the
	// scratch limit is lowered.
	defer func(l int) { wideLimit = l }(wideLimit)
	for _, limit := range []int{wideLimit, 100, 60} {
		wideLimit = limit
		productsIntoHalf(t, d, pair, random)
	}
	if got := d.MemStats().Current; got != 0 {
		t.Errorf("%d bytes left after freeing everything", got)
	}
}

// productsIntoHalf is TestCPUBF16Inputs's products into a bfloat16 C.
func productsIntoHalf(t *testing.T, d *CPUDevice, pair func(float64, ...int) (*Tensor, *Tensor), random func(...int) *Tensor) {
	t.Helper()
	for _, tc := range []struct {
		transA, transB, halfA bool
		beta                  float32
		m, n, ldc             int
	}{{false, true, true, 0, 37, 29, 31}, {true, false, false, 0, 37, 29, 31}, {false, false, true, 0.5, 37, 29, 31}, {true, true, false, -1, 37, 29, 31},
		// Wider than tall (an LM head's logits): pieces of whole columns
		// under a lowered limit.
		{false, true, true, 0, 5, 61, 64}, {true, false, false, 0.5, 5, 61, 64}} {
		m, n, ldc := tc.m, tc.n, tc.ldc
		const k = 300
		ah, aw := pair(1, m*k)
		a := aw
		if tc.halfA {
			a = ah
		}
		bh, bw := pair(1, k*n)
		ch, cw := pair(1, m*ldc)
		lda, ldb := k, n
		if tc.transA {
			lda = m
		}
		if tc.transB {
			ldb = k
		}
		d.Gemm(tc.transA, tc.transB, m, n, k, 0.75, a, 0, lda, bh, 0, ldb, tc.beta, cw, 0, ldc)
		before := append([]uint16(nil), ch.HostBF16()...)
		d.Gemm(tc.transA, tc.transB, m, n, k, 0.75, a, 0, lda, bh, 0, ldb, tc.beta, ch, 0, ldc)
		for i := range m {
			for j := range ldc {
				at := i*ldc + j
				want := BF16FromFloat32(cw.Host()[at])
				if j >= n {
					want = before[at]
				}
				if got := ch.HostBF16()[at]; got != want {
					t.Fatalf("Gemm %+v into bfloat16 C: (%d,%d) is %#x, want %#x", tc, i, j, got, want)
				}
			}
		}
		for _, x := range []*Tensor{ah, aw, bh, bw, ch, cw} {
			d.Free(x)
		}
	}
	// Batched (the attention's output through its per-head products): the
	// same, the elements between the matrices untouched; small products
	// one after another, larger ones a product a thread.
	for _, sh := range []struct{ m, n, k, ldc, strideC, batch int }{{5, 6, 40, 9, 50, 3}, {48, 40, 64, 41, 48*41 + 3, 3}} {
		m, n, k, ldc, strideC, batch := sh.m, sh.n, sh.k, sh.ldc, sh.strideC, sh.batch
		ah, aw := pair(1, batch*m*k)
		bh, bw := pair(1, batch*k*n)
		ch, cw := pair(1, batch*strideC)
		before := append([]uint16(nil), ch.HostBF16()...)
		for _, beta := range []float32{0, 1} {
			copy(before, ch.HostBF16())
			WidenBF16(cw.Host(), ch.HostBF16())
			// The reference: float32 operands of the same values.
			d.GemmStridedBatched(false, false, m, n, k, 1, aw, 0, k, m*k, bw, 0, n, k*n, beta, cw, 0, ldc, strideC, batch)
			bop := bh // bfloat16 A and B, then A alone
			if beta != 0 {
				bop = bw
			}
			d.GemmStridedBatched(false, false, m, n, k, 1, ah, 0, k, m*k, bop, 0, n, k*n, beta, ch, 0, ldc, strideC, batch)
			for at := range batch * strideC {
				q, i, j := at/strideC, at%strideC/ldc, at%strideC%ldc
				want := BF16FromFloat32(cw.Host()[at])
				if i >= m || j >= n || q >= batch {
					want = before[at]
				}
				if got := ch.HostBF16()[at]; got != want {
					t.Fatalf("batched Gemm into bfloat16 C, beta %g: element %d (matrix %d, %d, %d) is %#x, want %#x", beta, at, q, i, j, got, want)
				}
			}
		}
		for _, x := range []*Tensor{ah, aw, bh, bw, ch, cw} {
			d.Free(x)
		}
	}
}

// TestBF16SlicesMatchScalar checks RoundBF16 and WidenBF16 (the AVX2
// loops where the CPU has them, their Go tails) against the scalar
// conversions, on lengths that leave tails and on the edge values.
func TestBF16SlicesMatchScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 7, 8, 9, 64, 1003} {
		src := make([]float32, n)
		for i := range src {
			src[i] = math.Float32frombits(r.Uint32())
		}
		edges := []float32{1 + 1.0/256, 1 + 3.0/256, float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00001),
			float32(math.Inf(-1)), math.MaxFloat32, -0, 0x1p-149}
		copy(src, edges)
		half := make([]uint16, n)
		RoundBF16(half, src)
		wide := make([]float32, n)
		WidenBF16(wide, half)
		for i, v := range src {
			if half[i] != BF16FromFloat32(v) {
				t.Fatalf("n %d: RoundBF16 of %g (%#x) is %#x, BF16FromFloat32's %#x", n, v, math.Float32bits(v), half[i], BF16FromFloat32(v))
			}
			if math.Float32bits(wide[i]) != math.Float32bits(Float32FromBF16(half[i])) {
				t.Fatalf("n %d: WidenBF16 of %#x is %#x", n, half[i], math.Float32bits(wide[i]))
			}
		}
	}
}
