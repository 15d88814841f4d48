package cuda

import (
	"math"
	"strconv"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

// fusedTol bounds the fused attention's difference from the CPU's unfused
// attention on the same bf16-rounded inputs, relative to the largest
// magnitude: the fused kernels round the probabilities (and in the
// backward the score gradients) to bf16 for their products, 2^-9
// relative each (measured: 1.5e-3 at most).
const fusedTol = 5e-3

// The fused attention equals the CPU device's unfused attention on the
// same inputs rounded to bf16, within bf16's rounding of the
// probabilities: forward, log-sum-exp (against float64 sums) and
// backward, at sequence lengths around the 64-row tiles, with key masks
// (a batch item with no key left), without the causal mask, and with
// grouped-query heads; the backward gives the same bits twice.
func TestGPUFusedAttention(t *testing.T) {
	b := newBench(t)
	if b.gpu.ccMajor < 8 {
		t.Skipf("%s has no bf16 tensor cores", b.gpu.Describe())
	}
	for _, tt := range []struct {
		bsz, t, nh, nkv, hs int
		packed, causal      bool
		mask                bool
	}{
		{2, 1, 2, 2, 32, true, true, false},
		{2, 63, 2, 2, 32, true, true, false},
		{1, 64, 2, 2, 64, true, true, false},
		{2, 65, 2, 2, 32, true, true, true},
		{1, 130, 2, 2, 32, true, true, false},
		{2, 70, 2, 2, 32, true, false, true}, // BERT: padding masks only
		{1, 63, 2, 2, 32, true, false, false},
		{2, 65, 4, 2, 32, false, true, false}, // GQA, two query heads a group
		{2, 80, 4, 1, 64, false, true, true},
		{1, 66, 2, 1, 128, false, true, false},
	} {
		var l tensor.HeadLayout
		if tt.packed {
			l = tensor.PackedHeads(tt.nh, tt.hs)
		} else {
			l = tensor.GroupedHeads(tt.nh, tt.nkv, tt.hs)
		}
		B, T, hs := tt.bsz, tt.t, tt.hs
		qkv := b.rand("qkv", 2, B, T, l.Row)
		roundBF16(qkv.c.Host())
		b.gpu.CopyFromHost(qkv.g, qkv.c.Host())
		var valid []int32
		if tt.mask {
			valid = ids(b.r, B*T, 0, 2)
			for j := 0; j < T; j++ { // item 0's keys: only its last is left
				valid[j] = 0
			}
			valid[T-1] = 1
		}
		out, att := b.zeros("out", B, T, tt.nh*hs), b.zeros("att", B, tt.nh, T, T)
		lse := b.zeros("lse", B, tt.nh, T)
		if tt.packed {
			tensor.AttentionForward(out.c, att.c, nil, qkv.c, tt.nh, tt.causal, valid)
		} else {
			tensor.GroupedAttentionForward(out.c, att.c, nil, qkv.c, tt.nh, tt.nkv, tt.causal, valid)
		}
		b.gpu.FusedAttentionForward(out.g, lse.g, qkv.g, l, tt.causal, valid)
		what := func(s string) string {
			return s + " " + shapeName(tt.bsz, tt.t, tt.nh, tt.nkv, tt.hs, tt.causal, tt.mask)
		}
		b.check(what("FusedAttentionForward"), fusedTol, out)
		checkLSE(t, b, lse, qkv.c.Host(), l, B, T, tt.causal, valid, what("lse"))

		dout := b.rand("dout", 1, B, T, tt.nh*hs)
		roundBF16(dout.c.Host())
		b.gpu.CopyFromHost(dout.g, dout.c.Host())
		dqkv := b.rand("dqkv", 1, B, T, l.Row) // the backward adds to it
		roundBF16(dqkv.c.Host())
		b.gpu.CopyFromHost(dqkv.g, dqkv.c.Host())
		datt, dpre, delta := b.zeros("datt", B, tt.nh, T, T), b.zeros("dpre", B, tt.nh, T, T), b.zeros("delta", B, tt.nh, T)
		before := make([]float32, dqkv.g.Len())
		b.gpu.CopyToHost(before, dqkv.g)
		if tt.packed {
			tensor.AttentionBackward(dqkv.c, datt.c, dpre.c, dout.c, qkv.c, att.c, tt.nh)
		} else {
			tensor.GroupedAttentionBackward(dqkv.c, datt.c, dpre.c, dout.c, qkv.c, att.c, tt.nh, tt.nkv)
		}
		b.gpu.FusedAttentionBackward(dqkv.g, delta.g, dout.g, out.g, lse.g, qkv.g, l, tt.causal, valid)
		b.check(what("FusedAttentionBackward"), fusedTol, dqkv)
		first := make([]float32, dqkv.g.Len())
		b.gpu.CopyToHost(first, dqkv.g)
		b.gpu.CopyFromHost(dqkv.g, before)
		b.gpu.FusedAttentionBackward(dqkv.g, delta.g, dout.g, out.g, lse.g, qkv.g, l, tt.causal, valid)
		again := make([]float32, dqkv.g.Len())
		b.gpu.CopyToHost(again, dqkv.g)
		for i := range first {
			if math.Float32bits(first[i]) != math.Float32bits(again[i]) {
				t.Errorf("%s: element %d is %g, then %g: not deterministic", what("FusedAttentionBackward"), i, first[i], again[i])
				break
			}
		}

		// qkv, the output, its gradient and dqkv stored as bfloat16 (qkv's,
		// dout's and dqkv's values are bf16 already): the _bf16 kernels
		// stage the same tiles, so the same log-sum-exp, the same output
		// rounded; the backward from that output within its rounding
		// (delta reads it), and dqkv the float32 one's rounded.
		qh, oh, doh, dqh := b.bf16(B, T, l.Row), b.bf16(B, T, tt.nh*hs), b.bf16(B, T, tt.nh*hs), b.bf16(B, T, l.Row)
		b.gpu.Copy(qh, qkv.g)
		lse2, ow := b.zeros("lse2", B, tt.nh, T), b.zeros("ow", B, T, tt.nh*hs)
		b.gpu.FusedAttentionForward(oh, lse2.g, qh, l, tt.causal, valid)
		sameGPUBits(t, b.gpu, what("lse from bfloat16 qkv"), lse2.g, lse.g)
		b.gpu.Copy(ow.g, oh)
		o32, o16 := make([]float32, out.g.Len()), make([]float32, out.g.Len())
		b.gpu.CopyToHost(o32, out.g)
		b.gpu.CopyToHost(o16, ow.g)
		for i, v := range o32 {
			if w := math.Float32frombits(uint32(bf16Reference(v)) << 16); math.Float32bits(o16[i]) != math.Float32bits(w) {
				t.Fatalf("%s: element %d is %g, want %g rounded, %g", what("FusedAttentionForward into bfloat16"), i, o16[i], v, w)
			}
		}
		b.gpu.Copy(doh, dout.g)
		b.gpu.CopyFromHost(dqh, before)
		b.gpu.FusedAttentionBackward(dqh, delta.g, doh, oh, lse.g, qh, l, tt.causal, valid)
		ref := b.rand("dqkv from the rounded output", 0, B, T, l.Row)
		b.gpu.CopyFromHost(ref.g, before)
		b.gpu.FusedAttentionBackward(ref.g, delta.g, dout.g, ow.g, lse.g, qkv.g, l, tt.causal, valid)
		r32, d16 := make([]float32, ref.g.Len()), make([]float32, ref.g.Len())
		b.gpu.CopyToHost(r32, ref.g)
		b.gpu.CopyToHost(d16, dqh)
		for i, v := range r32 {
			if w := math.Float32frombits(uint32(bf16Reference(v)) << 16); math.Float32bits(d16[i]) != math.Float32bits(w) {
				t.Fatalf("%s: element %d is %g, want %g rounded, %g", what("FusedAttentionBackward into bfloat16"), i, d16[i], v, w)
			}
		}
	}
}

// sameGPUBits fails unless the float32 tensors got and want hold the same
// bits.
func sameGPUBits(t *testing.T, d *Device, what string, got, want *tensor.Tensor) {
	t.Helper()
	g, w := make([]float32, got.Len()), make([]float32, want.Len())
	d.CopyToHost(g, got)
	d.CopyToHost(w, want)
	for i := range w {
		if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			t.Errorf("%s: element %d is %g, want %g", what, i, g[i], w[i])
			return
		}
	}
}

// shapeName names a fused attention case in messages.
func shapeName(b, t, nh, nkv, hs int, causal, mask bool) string {
	s := "B" + itoa(b) + " T" + itoa(t) + " nh" + itoa(nh) + " nkv" + itoa(nkv) + " hs" + itoa(hs)
	if causal {
		s += " causal"
	}
	if mask {
		s += " masked"
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }

// roundBF16 rounds x to bfloat16 values in place.
func roundBF16(x []float32) {
	for i, f := range x {
		x[i] = math.Float32frombits(uint32(bf16Reference(f)) << 16)
	}
}

// checkLSE compares the fused forward's log-sum-exp with float64 sums
// over the visible keys of the (bf16) qkv, by the definition.
func checkLSE(t *testing.T, b *bench, lse twin, qkv []float32, l tensor.HeadLayout, B, T int, causal bool, valid []int32, what string) {
	t.Helper()
	got := make([]float32, lse.g.Len())
	b.gpu.CopyToHost(got, lse.g)
	g, hs := l.Heads/l.KVHeads, l.HeadSize
	scale := 1 / math.Sqrt(float64(hs))
	for bi := 0; bi < B; bi++ {
		for h := 0; h < l.Heads; h++ {
			kv := h / g
			qc, kc := kv*l.KVStride+l.Q+(h%g)*hs, kv*l.KVStride+l.K
			for i := 0; i < T; i++ {
				var s []float64
				mx := math.Inf(-1)
				for j := 0; j < T; j++ {
					if (causal && j > i) || (valid != nil && valid[bi*T+j] == 0) {
						continue
					}
					dot := 0.0
					for d := 0; d < hs; d++ {
						dot += float64(qkv[(bi*T+i)*l.Row+qc+d]) * float64(qkv[(bi*T+j)*l.Row+kc+d])
					}
					s = append(s, dot*scale)
					mx = math.Max(mx, dot*scale)
				}
				want := math.Inf(1)
				if len(s) > 0 {
					sum := 0.0
					for _, x := range s {
						sum += math.Exp(x - mx)
					}
					want = mx + math.Log(sum)
				}
				have := float64(got[(bi*l.Heads+h)*T+i])
				if math.IsInf(want, 1) != math.IsInf(have, 1) || (!math.IsInf(want, 1) && math.Abs(have-want) > 1e-4*math.Max(1, math.Abs(want))) {
					t.Errorf("%s: item %d head %d row %d: %g, want %g", what, bi, h, i, have, want)
					return
				}
			}
		}
	}
}

// AdamWMany updates tensors of many sizes (one of none, one past a grid's
// blocks) with their own weight decays, in one launch, to the bits of
// AdamW on each in turn; every other tensor's bfloat16 copy gets its new
// values rounded, by both.
func TestGPUAdamWMany(t *testing.T) {
	b := newBench(t)
	sizes := []int{5, 0, 300, 1, b.gpu.sms*32*elemThreads + 77, 1000}
	var one, many [4][]*tensor.Tensor
	var hyper []tensor.AdamWParams
	for i, n := range sizes {
		for k, scale := range []float32{1, 1, 0.1, 0.1} {
			x := b.rand("x", scale, max(n, 1))
			if k == 3 {
				b.gpu.Scale(x.g, 0) // second moments are not negative
			}
			y, err := b.gpu.Alloc(max(n, 1))
			if err != nil {
				t.Fatal(err)
			}
			b.all = append(b.all, twin{"copy", y, y})
			b.gpu.Copy(y, x.g)
			if n == 0 {
				x.g, y = x.g.View(0, 0), y.View(0, 0)
			}
			one[k], many[k] = append(one[k], x.g), append(many[k], y)
		}
		hyper = append(hyper, tensor.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: float32(i%3) * 0.05, Step: 3})
	}
	// Every other tensor has a bfloat16 copy, which both write.
	oneHalf, manyHalf := make([]*tensor.Tensor, len(sizes)), make([]*tensor.Tensor, len(sizes))
	for i, n := range sizes {
		if i%2 == 1 {
			continue
		}
		for _, h := range []**tensor.Tensor{&oneHalf[i], &manyHalf[i]} {
			x, err := b.gpu.AllocAs(tensor.BFloat16, n)
			if err != nil {
				t.Fatal(err)
			}
			b.all = append(b.all, twin{"half", x, x})
			*h = x
		}
	}
	s := b.zeros("scale", 1)
	b.gpu.Fill(s.g, 0.5)
	for i := range sizes {
		b.gpu.AdamW(one[0][i], one[1][i], one[2][i], one[3][i], oneHalf[i], hyper[i], s.g)
	}
	b.gpu.AdamWMany(many[0], many[1], many[2], many[3], manyHalf, hyper, s.g)
	for i := range sizes {
		if oneHalf[i] == nil {
			continue
		}
		param, h1, h2 := make([]float32, one[0][i].Len()), make([]float32, one[0][i].Len()), make([]float32, one[0][i].Len())
		b.gpu.CopyToHost(param, one[0][i])
		b.gpu.CopyToHost(h1, oneHalf[i])
		b.gpu.CopyToHost(h2, manyHalf[i])
		for j, p := range param {
			want := tensor.Float32FromBF16(tensor.BF16FromFloat32(p))
			if h1[j] != want || h2[j] != want {
				t.Fatalf("tensor %d's bfloat16 copy[%d]: AdamW %g, AdamWMany %g; want the new value %g rounded, %g", i, j, h1[j], h2[j], p, want)
			}
		}
	}
	for k, what := range []string{"param", "grad", "m", "v"} {
		for i := range sizes {
			want, got := make([]float32, one[k][i].Len()), make([]float32, many[k][i].Len())
			b.gpu.CopyToHost(want, one[k][i])
			b.gpu.CopyToHost(got, many[k][i])
			for j := range want {
				if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
					t.Fatalf("AdamWMany: tensor %d's %s[%d] = %g, AdamW's %g", i, what, j, got[j], want[j])
				}
			}
		}
	}
}
