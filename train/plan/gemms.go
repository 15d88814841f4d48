package plan

import (
	"fmt"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/spec"
)

// GemmCount is a matrix product a step runs Count times.
type GemmCount struct {
	tensor.GemmShape
	Count int `json:"count"`
	// aHalf and bHalf say that op(A) and op(B) are stored as bfloat16
	// (at bf16: a weight's copy, an activation the spec stores so), which
	// a GPU's bf16 products read in place: the others it converts.
	aHalf, bHalf bool
}

// half says whether a tensor stored as dt is bfloat16.
func half(dt tensor.DType) bool { return dt == tensor.BFloat16 }

// linear is a weight product of a rank: In inputs to Out outputs per
// token.
type linear spec.Linear

// products are a linear's three GEMMs over n tokens, as the engine calls
// them: y = x W^T, dx = dy W, dW = dy^T x.
func (l linear) products(n int) []GemmCount {
	x, w, dy := half(l.Input), half(l.Weight), half(l.Grad)
	return []GemmCount{
		{GemmShape: tensor.GemmShape{M: n, N: l.Out, K: l.In, TransB: true}, Count: 1, aHalf: x, bHalf: w},
		{GemmShape: tensor.GemmShape{M: n, N: l.In, K: l.Out}, Count: 1, aHalf: dy, bHalf: w},
		{GemmShape: tensor.GemmShape{M: l.Out, N: l.In, K: n, TransA: true}, Count: 1, aHalf: dy, bHalf: x},
	}
}

// forward is the first of a linear's products: y = x W^T.
func (l linear) forward(n int) GemmCount { return l.products(n)[0] }

// attention are one block's attention products for one micro-batch, per
// sequence of it, batched over this rank's heads (the engine batches over
// the sequences instead where they outnumber the heads: the same FLOPs):
// forward S = Q K^T and O = P V, backward dP = dO V^T, dQ = dS K, dK = dS^T
// Q and dV = P^T dO. fwdOnly keeps the forward's two. Q, K and V are
// stored as the fused projection's output (spec.Compute), and so are P (a
// bf16 P from float32 scores), dS (the softmax's backward rounding its
// float32 sums) and dO (c_proj's input gradient); dP float32.
func (s shapes) attention(fwdOnly bool) []GemmCount {
	if s.fusedAttn {
		return nil // fusedAttentionFlops
	}
	T, B := int(s.T), int(s.B)
	h := s.cfg.Heads / int(s.tp)
	hd := int(s.C) / s.cfg.Heads
	qkv := half(spec.Compute(s.cfg))
	scores := tensor.GemmShape{M: T, N: T, K: hd, Batch: h, TransB: true}
	byRows := tensor.GemmShape{M: T, N: hd, K: T, Batch: h}
	g := []GemmCount{
		{GemmShape: scores, Count: B, aHalf: qkv, bHalf: qkv}, // S = Q K^T
		{GemmShape: byRows, Count: B, aHalf: qkv, bHalf: qkv}, // O = P V
	}
	if fwdOnly {
		return g
	}
	byCols := tensor.GemmShape{M: T, N: hd, K: T, Batch: h, TransA: true}
	return append(g,
		GemmCount{GemmShape: scores, Count: B, aHalf: qkv, bHalf: qkv}, // dP = dO V^T
		GemmCount{GemmShape: byRows, Count: B, aHalf: qkv, bHalf: qkv}, // dQ = dS K
		GemmCount{GemmShape: byCols, Count: B, aHalf: qkv, bHalf: qkv}, // dK = dS^T Q
		GemmCount{GemmShape: byCols, Count: B, aHalf: qkv, bHalf: qkv}) // dV = P^T dO
}

// fusedAttentionFlops are the fused attention kernels' products of one
// micro-batch (0 unfused): per block the forward's two (S = Q K^T, O = P
// V), the backward's seven (S and dP again in both of its kernels, dV, dK
// and dQ), the forward's two again under full recomputation, each of 2 x
// T x T x hd a head, over the 64 x 64 tiles a causal mask leaves.
func (s shapes) fusedAttentionFlops() float64 {
	if !s.fusedAttn {
		return 0
	}
	products := 9.0
	if s.recompute == parallel.RecomputeFull {
		products += 2
	}
	share := 1.0
	if s.gpt {
		tiles := float64((s.T + 63) / 64)
		share = (tiles + 1) / (2 * tiles)
	}
	heads := float64(s.cfg.Heads) / float64(s.tp)
	hd := float64(s.C) / float64(s.cfg.Heads)
	return float64(s.L) * products * share * 2 * float64(s.B) * heads * float64(s.T) * float64(s.T) * hd
}

// gemms are the matrix products of one micro-batch on a rank of the
// stage: its blocks' forward and backward (and what recomputation runs
// again), and on the last stage the head's.
func (s shapes) gemms() []GemmCount {
	n := int(s.N)
	var block []GemmCount
	for _, l := range s.linears {
		block = append(block, linear(l).products(n)...)
	}
	block = append(block, s.attention(false)...)
	switch s.recompute {
	case parallel.RecomputeSelective:
		block = append(block, s.attention(true)...)
	case parallel.RecomputeFull:
		for _, l := range s.linears {
			block = append(block, linear(l).forward(n))
		}
		block = append(block, s.attention(true)...)
	}
	var out []GemmCount
	for _, g := range block {
		g.Count *= int(s.L)
		out = append(out, g)
	}
	switch {
	case !s.last:
	case s.gpt:
		out = append(out, linear{In: int(s.C), Out: int(s.vl), Input: s.lnfOut(), Weight: spec.Compute(s.cfg), Grad: spec.Logits(s.cfg)}.products(n)...)
	default:
		// BERT's head: the pooled mean over the sequence (forward and
		// backward, as products of B x C by the tokens) and cls.fc1's.
		B, C := int(s.B), int(s.C)
		out = append(out, GemmCount{GemmShape: tensor.GemmShape{M: B, N: C, K: n}, Count: 2})
		out = append(out, linear{In: C, Out: int(s.cl), Input: tensor.Float32, Weight: spec.Compute(s.cfg)}.products(B)...)
	}
	return out
}

// gemmFlops is the FLOPs of gs.
func gemmFlops(gs []GemmCount) float64 {
	var f float64
	for _, g := range gs {
		f += g.Flops() * float64(g.Count)
	}
	return f
}

// StepGemms are the matrix products of one micro-batch on a rank of a run
// of cfg (the first stage's with a pipeline) with a vocabulary of vocab:
// what hpcrun bench gemm measures and the plan prices.
func StepGemms(cfg config.Config, vocab int) ([]GemmCount, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	vp, err := parallel.PadVocab(vocab, cfg.TP)
	if err != nil {
		return nil, err
	}
	split, err := stageSplit(cfg)
	if err != nil {
		return nil, err
	}
	s, err := newShapes(cfg, vp, 0, split[0], cfg.NTasks, false)
	if err != nil {
		return nil, err
	}
	return s.gemms(), nil
}

// CalibrateElementwise is the bandwidth, in GB/s, that the elementwise
// kernels of a step of cfg on one rank (tp 1, one micro-batch, vocabulary
// vocab) reached when the step took stepS seconds on threads threads: the
// step less its GEMMs (each at its shape's rate in r) and the optimizer
// (at r's AdamW bandwidth), over the activation bytes the plan counts for
// those kernels and the gradient it zeroes, as the plan charges them. 0
// when the GEMMs and the optimizer take the whole step.
func CalibrateElementwise(cfg config.Config, vocab int, stepS float64, r *CPURates, threads int) (float64, error) {
	cfg.NTasks, cfg.TP, cfg.PP, cfg.GradAccum, cfg.SP, cfg.Zero, cfg.ZeroGroup = 1, 1, 0, 1, false, 0, ""
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	vp, err := parallel.PadVocab(vocab, 1)
	if err != nil {
		return 0, err
	}
	s, err := newShapes(cfg, vp, 0, cfg.Layers, cfg.NTasks, false)
	if err != nil {
		return 0, err
	}
	dev := Device{Rates: r, Threads: threads, Cores: float64(threads)}
	measured := false
	for _, x := range r.Stream {
		measured = measured || x.Threads == threads
	}
	_, adam := r.StreamBandwidth(threads, float64(threads))
	if !measured || adam <= 0 {
		return 0, fmt.Errorf("calibrate elementwise: no bandwidth measured at %d threads", threads)
	}
	p := float64(s.paramElems) * f32
	left := stepS - dev.gemmSeconds(s.gemms()) - 7*p/adam
	if left <= 0 {
		return 0, nil
	}
	// The plan charges the gradient's zeroing at this bandwidth too.
	return (activationTouches*float64(s.activationBytes()) + p) / left / 1e9, nil
}

// operandElems is the elements of the operands of gs's products, each
// time one runs: what a GPU's bf16 GEMMs convert.
func operandElems(gs []GemmCount) int64 {
	var n int64
	for _, g := range gs {
		n += int64(g.Count) * int64(max(g.Batch, 1)) * (int64(g.M)*int64(g.K) + int64(g.K)*int64(g.N))
	}
	return n
}

// storedBF16OperandElems is the elements of the products' operands that
// are stored as bfloat16 at bf16 (GemmCount's aHalf and bHalf: the
// weights' copies, the activations spec.Compute stores so), which no GEMM
// converts.
func (s shapes) storedBF16OperandElems() int64 {
	var n int64
	for _, g := range s.gemms() {
		times := int64(g.Count) * int64(max(g.Batch, 1))
		if g.aHalf {
			n += times * int64(g.M) * int64(g.K)
		}
		if g.bHalf {
			n += times * int64(g.K) * int64(g.N)
		}
	}
	return n
}

// roundedGradElems are the elements a micro-batch's products read of
// output gradients their layers round to bfloat16 themselves (the output
// projections' float32 gradient in BERT's post-norm layers,
// spec.Linear.GradRounded), once each:
// under sequence parallelism this rank's positions, before the gather.
func (s shapes) roundedGradElems() int64 {
	var n int64
	for _, l := range s.linears {
		if l.GradRounded && half(l.Grad) {
			n += s.N * int64(l.Out)
		}
	}
	if s.sp {
		n /= s.tp
	}
	return s.L * n
}

// bf16Operands is the scratch a GPU's bf16 GEMMs convert their float32
// operands into: one buffer for the largest A operand of the step's
// products that is not stored as bfloat16 and one for the largest such B,
// two bytes an element. The device grows each by doubling, so it may hold
// somewhat more (an estimate, not exact).
func (s shapes) bf16Operands() int64 {
	var a, b int64
	add := func(g GemmCount, batch int) {
		if !g.aHalf {
			a = max(a, int64(g.M)*int64(g.K)*int64(batch))
		}
		if !g.bHalf {
			b = max(b, int64(g.K)*int64(g.N)*int64(batch))
		}
	}
	for _, g := range s.gemms() {
		add(g, max(g.Batch, 1))
	}
	// The engine batches attention's products over the sequences where
	// they outnumber the heads (tensor's headGemms).
	for _, g := range s.attention(false) {
		add(g, max(g.Batch, int(s.B)))
	}
	return 2 * (a + b)
}
