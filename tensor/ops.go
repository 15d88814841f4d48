package tensor

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/tensor/internal/check"
)

// Helpers built from Device calls: the same on every backend.

// MatMul computes c = alpha*op(a)*op(b) + beta*c on whole tensors seen as
// matrices (leading dimensions flattened into rows, the last dimension is the
// columns): op(a) is (m,k), op(b) is (k,n), c is (m,n).
func MatMul(c, a, b *Tensor, transA, transB bool, alpha, beta float32) {
	m, k := a.Rows(), a.Cols()
	if transA {
		m, k = k, m
	}
	kb, n := b.Rows(), b.Cols()
	if transB {
		kb, n = n, kb
	}
	if kb != k || c.Rows() != m || c.Cols() != n {
		panic(fmt.Sprintf("tensor.MatMul: op(a) is (%d,%d), op(b) is (%d,%d), c %v is (%d,%d)", m, k, kb, n, c, c.Rows(), c.Cols()))
	}
	c.Device().Gemm(transA, transB, m, n, k, alpha, a, 0, a.Cols(), b, 0, b.Cols(), beta, c, 0, c.Cols())
}

// LinearForward is out = inp @ weight^T + bias (bias may be nil), the layout
// of PyTorch's nn.Linear and llm.c's matmul_forward.
// out is (N,OC), inp is (N,C), weight is (OC,C), bias is (OC).
func LinearForward(out, inp, weight, bias *Tensor) {
	MatMul(out, inp, weight, false, true, 1, 0)
	if bias != nil {
		out.Device().AddBias(out, bias)
	}
}

// LinearBackward accumulates the gradients of LinearForward:
// dinp += dout @ weight, dweight += dout^T @ inp, dbias += column sums of
// dout. dinp and dbias may be nil when not needed.
// dout is (N,OC), inp and dinp are (N,C), weight and dweight are (OC,C).
func LinearBackward(dinp, dweight, dbias, dout, inp, weight *Tensor) {
	if dinp != nil {
		MatMul(dinp, dout, weight, false, false, 1, 1)
	}
	MatMul(dweight, dout, inp, true, false, 1, 1)
	if dbias != nil {
		dout.Device().BiasBackward(dbias, dout)
	}
}

// attentionDims checks the attention shapes and returns B, T, C and the
// head size.
func attentionDims(fn string, qkv, att *Tensor, nh int) (b, t, c, hs int) {
	if qkv.Rank() != 3 || qkv.Dim(2)%3 != 0 {
		panic(fmt.Sprintf("tensor.%s: qkv %v must be (B,T,3C)", fn, qkv))
	}
	b, t, c = qkv.Dim(0), qkv.Dim(1), qkv.Dim(2)/3
	if nh <= 0 || c%nh != 0 {
		panic(fmt.Sprintf("tensor.%s: %d heads do not divide C=%d", fn, nh, c))
	}
	if s := att.Shape(); len(s) != 4 || s[0] != b || s[1] != nh || s[2] != t || s[3] != t {
		panic(fmt.Sprintf("tensor.%s: att %v must be (B,NH,T,T) = (%d,%d,%d,%d)", fn, att, b, nh, t, t))
	}
	return b, t, c, c / nh
}

// AttentionForward is multi-head scaled dot-product attention on a packed
// qkv activation (llm.c's attention_forward): for each batch item b and
// head h, att[b,h] = softmax(q[b,h] k[b,h]^T / sqrt(hs)) with the causal
// and key-padding masks of SoftmaxForward, and out[b,:,h] = att[b,h] v[b,h].
// qkv is (B,T,3C), laid out [q | k | v] along the last dimension, each of
// them (NH,hs) heads with C = NH*hs (a rank's heads under tensor
// parallelism); att is (B,NH,T,T), kept for the backward; out is (B,T,C);
// keyValid is (B,T) or nil. Each product is min(B,NH) batched GEMM calls.
// att may be BFloat16 (the probabilities rounded, which the products and
// the backward read so): scores, (B,NH,T,T) float32 scratch, then holds
// the scores before the softmax; with a float32 att scores is nil (att
// holds them, the softmax runs in place).
func AttentionForward(out, att, scores, qkv *Tensor, nh int, causal bool, keyValid []int32) {
	d := qkv.Device()
	b, t, c, hs := attentionDims("AttentionForward", qkv, att, nh)
	check.Len("AttentionForward", "out", out, b*t*c)
	pre := scoresOf("AttentionForward", att, scores)
	q, k, v := qkvHeads(qkv, t, c, hs)
	pa := ttHeads(att, t, nh)
	// att_h = q_h k_h^T, (T,hs) x (T,hs)^T
	headGemms(d, false, true, t, t, hs, q, k, 0, ttHeads(pre, t, nh), b, nh)
	d.SoftmaxForward(att, pre, float32(1/math.Sqrt(float64(hs))), causal, keyValid)
	// out_h = att_h v_h; heads sit side by side in a row of out.
	headGemms(d, false, false, t, hs, t, pa, v, 0, rowHeads(out, t, c, hs), b, nh)
}

// AttentionBackward accumulates into dqkv (B,T,3C) the gradient of
// AttentionForward from dout (B,T,C), given the forward's qkv and att.
// datt and dpreatt are (B,NH,T,T) scratch, overwritten; dpreatt may be
// bfloat16 (the scores' gradient rounded, the A operand of the products
// of dQ and dK), and so may dout and dqkv (each element of dqkv one
// product's sum, rounded once onto a zeroed dqkv). Each product is
// min(B,NH) batched GEMM calls.
func AttentionBackward(dqkv, datt, dpreatt, dout, qkv, att *Tensor, nh int) {
	d := qkv.Device()
	b, t, c, hs := attentionDims("AttentionBackward", qkv, att, nh)
	check.Len("AttentionBackward", "dqkv", dqkv, qkv.Len())
	check.Len("AttentionBackward", "dout", dout, b*t*c)
	check.Len("AttentionBackward", "datt", datt, att.Len())
	check.Len("AttentionBackward", "dpreatt", dpreatt, att.Len())
	q, k, v := qkvHeads(qkv, t, c, hs)
	dq, dk, dv := qkvHeads(dqkv, t, c, hs)
	do, pa, pd := rowHeads(dout, t, c, hs), ttHeads(att, t, nh), ttHeads(dpreatt, t, nh)
	// datt_h = dout_h v_h^T; dv_h += att_h^T dout_h
	headGemms(d, false, true, t, t, hs, do, v, 0, ttHeads(datt, t, nh), b, nh)
	headGemms(d, true, false, t, hs, t, pa, do, 1, dv, b, nh)
	d.Zero(dpreatt)
	d.SoftmaxBackward(dpreatt, datt, att, float32(1/math.Sqrt(float64(hs))))
	// dq_h += dpreatt_h k_h; dk_h += dpreatt_h^T q_h
	headGemms(d, false, false, t, hs, t, pd, k, 1, dq, b, nh)
	headGemms(d, true, false, t, hs, t, pd, q, 1, dk, b, nh)
}

// headOperand locates the per-head matrices of one attention operand: the
// matrix of batch item i, head h starts at element off + i*item + h*head of
// t, with leading dimension ld.
type headOperand struct {
	t                   *Tensor
	off, ld, item, head int
}

// qkvHeads returns the q, k and v heads of a (B,T,3C) tensor: (T,hs)
// matrices hs apart within rows of 3C.
func qkvHeads(qkv *Tensor, t, c, hs int) (q, k, v headOperand) {
	q = headOperand{qkv, 0, 3 * c, t * 3 * c, hs}
	k, v = q, q
	k.off, v.off = c, 2*c
	return q, k, v
}

// rowHeads returns the heads of a (B,T,C) tensor: (T,hs) matrices hs apart
// within rows of C.
func rowHeads(x *Tensor, t, c, hs int) headOperand {
	return headOperand{x, 0, c, t * c, hs}
}

// ttHeads returns the (T,T) matrices of a contiguous (B,NH,T,T) tensor.
func ttHeads(x *Tensor, t, nh int) headOperand {
	return headOperand{x, 0, t, nh * t * t, t * t}
}

// headGemms computes C = op(A)*op(B) + beta*C for every (item, head) pair
// of items x heads. In the packed (B,T,3C) layout items and heads are not
// one uniform stride apart, so it issues min(items, heads)
// GemmStridedBatched calls, each batched over the other index (one call
// when B or NH is 1): few launches on a GPU, and a batch wide enough to
// spread over threads on the CPU.
func headGemms(d Device, transA, transB bool, m, n, k int, a, b headOperand, beta float32, c headOperand, items, heads int) {
	if items <= heads {
		for i := 0; i < items; i++ {
			d.GemmStridedBatched(transA, transB, m, n, k, 1,
				a.t, a.off+i*a.item, a.ld, a.head, b.t, b.off+i*b.item, b.ld, b.head,
				beta, c.t, c.off+i*c.item, c.ld, c.head, heads)
		}
		return
	}
	for h := 0; h < heads; h++ {
		d.GemmStridedBatched(transA, transB, m, n, k, 1,
			a.t, a.off+h*a.head, a.ld, a.item, b.t, b.off+h*b.head, b.ld, b.item,
			beta, c.t, c.off+h*c.head, c.ld, c.item, items)
	}
}

// groupedDims checks the grouped attention shapes and returns B, T and the
// head size.
func groupedDims(fn string, qkv, att *Tensor, nh, nkv int) (b, t, hs int) {
	if nh <= 0 || nkv <= 0 || nh%nkv != 0 {
		panic(fmt.Sprintf("tensor.%s: %d key/value heads do not divide %d heads", fn, nkv, nh))
	}
	per := nkv * (nh/nkv + 2)
	if qkv.Rank() != 3 || qkv.Dim(2)%per != 0 {
		panic(fmt.Sprintf("tensor.%s: qkv %v must be (B,T,%d*hs)", fn, qkv, per))
	}
	b, t, hs = qkv.Dim(0), qkv.Dim(1), qkv.Dim(2)/per
	if s := att.Shape(); len(s) != 4 || s[0] != b || s[1] != nh || s[2] != t || s[3] != t {
		panic(fmt.Sprintf("tensor.%s: att %v must be (B,NH,T,T) = (%d,%d,%d,%d)", fn, att, b, nh, t, t))
	}
	return b, t, hs
}

// scoresOf is where the attention's scores go before the softmax: att
// itself (float32, scores nil), or the float32 scores scratch of a
// BFloat16 att.
func scoresOf(fn string, att, scores *Tensor) *Tensor {
	if att.DType() == Float32 && scores == nil {
		return att
	}
	if att.DType() != BFloat16 || scores == nil || scores.DType() != Float32 || scores.Len() != att.Len() {
		panic(fmt.Sprintf("tensor.%s: att %v (%v) with scores %v: a bfloat16 att takes float32 scores of its shape, a float32 one none", fn, att, att.DType(), scores))
	}
	return scores.Reshape(att.Shape()...)
}

// groupHeads returns, for the r-th query head of every group, the q
// operand, the shared k and v operands, and the att, and (B,T,NH*hs) out
// operands of those heads: a group's heads are consecutive in both.
func groupHeads(qkv, att, out *Tensor, t, nh, nkv, hs, r int) (q, k, v, a, o headOperand) {
	g := nh / nkv
	w := nkv * (g + 2) * hs
	q = headOperand{qkv, r * hs, w, t * w, (g + 2) * hs}
	k, v = q, q
	k.off, v.off = g*hs, (g+1)*hs
	a = headOperand{att, r * t * t, t, nh * t * t, g * t * t}
	o = headOperand{out, r * hs, nh * hs, t * nh * hs, g * hs}
	return q, k, v, a, o
}

// GroupedAttentionForward is AttentionForward with grouped-query heads
// (Ainslie et al. 2023): nh query heads in nkv groups, the heads of a
// group sharing one key and one value head. qkv is (B,T,nkv*(g+2)*hs) with
// g = nh/nkv, each row nkv groups of [g query heads | key | value] (the
// fused layout a tensor-parallel rank holds whole groups of); att is
// (B,NH,T,T), kept for the backward; out is (B,T,NH*hs), the heads in
// order; keyValid is (B,T) or nil; scores as AttentionForward's.
func GroupedAttentionForward(out, att, scores, qkv *Tensor, nh, nkv int, causal bool, keyValid []int32) {
	d := qkv.Device()
	b, t, hs := groupedDims("GroupedAttentionForward", qkv, att, nh, nkv)
	check.Len("GroupedAttentionForward", "out", out, b*t*nh*hs)
	pre := scoresOf("GroupedAttentionForward", att, scores)
	for r := 0; r < nh/nkv; r++ {
		q, k, _, a, _ := groupHeads(qkv, pre, out, t, nh, nkv, hs, r)
		headGemms(d, false, true, t, t, hs, q, k, 0, a, b, nkv)
	}
	d.SoftmaxForward(att, pre, float32(1/math.Sqrt(float64(hs))), causal, keyValid)
	for r := 0; r < nh/nkv; r++ {
		_, _, v, a, o := groupHeads(qkv, att, out, t, nh, nkv, hs, r)
		headGemms(d, false, false, t, hs, t, a, v, 0, o, b, nkv)
	}
}

// GroupedAttentionBackward accumulates into dqkv (laid out as qkv) the
// gradient of GroupedAttentionForward from dout (B,T,NH*hs), given the
// forward's qkv and att; a key or value head gathers the gradients of its
// group's query heads. datt and dpreatt are (B,NH,T,T) scratch,
// overwritten; dpreatt, dout and dqkv may be bfloat16 (as
// AttentionBackward's: a bfloat16 dqkv's keys and values are rounded
// once a query head of their group).
func GroupedAttentionBackward(dqkv, datt, dpreatt, dout, qkv, att *Tensor, nh, nkv int) {
	d := qkv.Device()
	b, t, hs := groupedDims("GroupedAttentionBackward", qkv, att, nh, nkv)
	check.Len("GroupedAttentionBackward", "dqkv", dqkv, qkv.Len())
	check.Len("GroupedAttentionBackward", "dout", dout, b*t*nh*hs)
	check.Len("GroupedAttentionBackward", "datt", datt, att.Len())
	check.Len("GroupedAttentionBackward", "dpreatt", dpreatt, att.Len())
	g := nh / nkv
	for r := 0; r < g; r++ {
		_, _, v, a, do := groupHeads(qkv, att, dout, t, nh, nkv, hs, r)
		_, _, dv, da, _ := groupHeads(dqkv, datt, dout, t, nh, nkv, hs, r)
		// datt_h = dout_h v^T; dv += att_h^T dout_h
		headGemms(d, false, true, t, t, hs, do, v, 0, da, b, nkv)
		headGemms(d, true, false, t, hs, t, a, do, 1, dv, b, nkv)
	}
	d.Zero(dpreatt)
	d.SoftmaxBackward(dpreatt, datt, att, float32(1/math.Sqrt(float64(hs))))
	for r := 0; r < g; r++ {
		q, k, _, _, _ := groupHeads(qkv, att, dout, t, nh, nkv, hs, r)
		dq, dk, _, pd, _ := groupHeads(dqkv, dpreatt, dout, t, nh, nkv, hs, r)
		// dq_h += dpre_h k; dk += dpre_h^T q_h
		headGemms(d, false, false, t, hs, t, pd, k, 1, dq, b, nkv)
		headGemms(d, true, false, t, hs, t, pd, q, 1, dk, b, nkv)
	}
}
