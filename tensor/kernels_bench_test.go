package tensor

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkKernels runs the row and elementwise kernels at GPT-2 small
// widths (B*T = 1024 tokens, C = 768, 12 heads of T = 256) on 1 and 2
// threads, with the AVX2 loops (vec) and without (go) where the CPU has
// them. The peer is "copy": a memmove of the same bytes, the memory bound
// every streaming kernel is measured against (compare MB/s).
func BenchmarkKernels(b *testing.B) {
	const n, c, nh, t, v = 1024, 768, 12, 256, 8192
	r := rand.New(rand.NewPCG(1, 1))
	for _, threads := range []int{1, 2} {
		d := NewCPU()
		d.SetThreads(threads)
		a := func(shape ...int) *Tensor {
			x, err := d.Alloc(shape...)
			if err != nil {
				b.Fatal(err)
			}
			d.CopyFromHost(x, randF32(r, x.Len(), 1))
			return x
		}
		x, y, z := a(n, c), a(n, c), a(n, c)
		h, dh, dh2, hb, dx := a(n, 4*c), a(n, 4*c), a(n, 4*c), a(4*c), a(n, c)
		d.Scale(hb, 1e-3) // h stays in GELU's range over the rounds
		w, bias, mean, rstd := a(c), a(c), a(n), a(n)
		att, datt := a(n/t, nh, t, t), a(n/t, nh, t, t)
		logits, dlogits := a(n/2, v), a(n/2, v)
		rowMax, sumExp, tl, losses := a(n/2), a(n/2), a(n/2), a(n/2)
		ids := make([]int32, n)
		targets := make([]int32, n/2)
		for i := range ids {
			ids[i] = int32(r.IntN(n))
		}
		for i := range targets {
			targets[i] = int32(r.IntN(v))
		}
		table := a(n, c)
		hp := AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
		hx, hz := x.Host(), z.Host()
		sq := a(n, c) // second moments must be positive
		sumsq := a(2)
		d.Fill(sq, 1e-2)
		kernels := []struct {
			name  string
			bytes int // memory streamed per call
			f     func()
		}{
			{"copy", 8 * n * c, func() { copy(hz, hx) }},
			{"Add", 12 * n * c, func() { d.Add(z, x, y) }},
			{"AddBias", 8 * n * c, func() { d.AddBias(z, w) }},
			{"BiasBackward", 4 * n * c, func() { d.BiasBackward(bias, x) }},
			{"Embedding", 8 * n * c, func() { d.EmbeddingForward(z, ids, table, 0) }},
			{"EmbeddingBackward", 12 * n * c, func() { d.EmbeddingBackward(table, x, ids, 0) }},
			{"LayerNorm", 8 * n * c, func() { d.LayerNormForward(z, mean, rstd, x, w, bias, 1e-5) }},
			{"LayerNormBackward", 16 * n * c, func() { d.LayerNormBackward(z, w, bias, y, x, w, mean, rstd) }},
			{"GELU", 32 * n * c, func() { d.ActivationForward(GELU, dh, h) }},
			// The MLP's bias and GELU unfused (as before the fusion) and
			// fused; the backward into a zeroed gradient and in place;
			// the residual add and the layer norm after it, unfused and
			// fused. The pairs move the same model bytes (SetBytes).
			{"AddBias+GELU", 32 * n * c, func() { d.AddBias(h, hb); d.ActivationForward(GELU, dh, h) }},
			{"BiasGELU", 32 * n * c, func() { d.BiasActivationForward(GELU, dh, h, hb) }},
			{"Zero+GELUBackward", 48 * n * c, func() { d.Zero(dh); d.ActivationBackward(GELU, dh, h, dh2) }},
			{"GELUBackwardInPlace", 48 * n * c, func() { d.ActivationBackwardInPlace(GELU, dh2, h) }},
			{"Add+LayerNorm", 12 * n * c, func() { d.Add(z, x, y); d.LayerNormForward(dx, mean, rstd, z, w, bias, 1e-5) }},
			{"AddLayerNorm", 12 * n * c, func() { d.AddLayerNormForward(z, dx, mean, rstd, x, y, w, bias, 1e-5) }},
			{"GELUBackward", 48 * n * c, func() { d.ActivationBackward(GELU, dh, h, h) }},
			{"Softmax", 8 * att.Len(), func() { d.SoftmaxForward(datt, att, 0.125, true, nil) }},
			{"SoftmaxBackward", 16 * att.Len(), func() { d.SoftmaxBackward(att, datt, datt, 0.125) }},
			{"CrossEntropy", 4 * logits.Len(), func() {
				d.CrossEntropyRowMax(rowMax, logits)
				d.CrossEntropySumExp(sumExp, logits, rowMax)
				d.CrossEntropyTargetLogit(tl, logits, targets, 0)
				d.CrossEntropyLoss(losses, rowMax, sumExp, tl, targets)
			}},
			{"CrossEntropyForward", 4 * logits.Len(), func() { d.CrossEntropyForward(losses, rowMax, sumExp, logits, targets) }},
			{"CrossEntropyBackward", 12 * logits.Len(), func() {
				d.CrossEntropyBackward(dlogits, logits, rowMax, sumExp, targets, 0, 1e-3)
			}},
			// The unfused backward as a step runs it (a zeroed gradient
			// buffer first) against the fused one over the logits (which
			// it overwrites: later rounds run on gradients, at the same cost).
			{"CrossEntropyZeroBackward", 16 * logits.Len(), func() {
				d.Zero(dlogits)
				d.CrossEntropyBackward(dlogits, logits, rowMax, sumExp, targets, 0, 1e-3)
			}},
			{"CrossEntropyBackwardInPlace", 8 * logits.Len(), func() {
				d.CrossEntropyBackwardInPlace(dlogits, rowMax, sumExp, targets, 0, v, 1e-3)
			}},
			{"AdamW", 20 * n * c, func() { d.AdamW(x, y, z, sq, nil, hp, nil) }},
			{"SumSquaresEach", 4 * n * c, func() { d.SumSquaresEach(sumsq, x) }},
		}
		paths := []bool{false}
		if useVecAsm {
			paths = []bool{true, false}
		}
		for _, k := range kernels {
			for _, vec := range paths {
				path := "go"
				if vec {
					path = "vec"
				}
				b.Run(fmt.Sprintf("%s/threads=%d/%s", k.name, threads, path), func(b *testing.B) {
					defer func(v bool) { useVecAsm = v }(useVecAsm)
					useVecAsm = vec
					b.SetBytes(int64(k.bytes))
					b.ReportAllocs()
					for b.Loop() {
						k.f()
					}
				})
			}
		}
	}
}
