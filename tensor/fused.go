package tensor

import "fmt"

// HeadLayout is where the heads of a fused (B,T,Row) qkv activation lie:
// kv head j's columns start at j*KVStride, its query heads (Heads/KVHeads
// of them, HeadSize apart) at j*KVStride+Q, its key at j*KVStride+K and
// its value at j*KVStride+V.
type HeadLayout struct {
	Heads, KVHeads, HeadSize int
	Row, KVStride, Q, K, V   int
}

// PackedHeads is the layout of AttentionForward's qkv: [q | k | v], each
// nh heads of hs.
func PackedHeads(nh, hs int) HeadLayout {
	c := nh * hs
	return HeadLayout{Heads: nh, KVHeads: nh, HeadSize: hs, Row: 3 * c, KVStride: hs, Q: 0, K: c, V: 2 * c}
}

// GroupedHeads is the layout of GroupedAttentionForward's qkv: nkv groups
// of [nh/nkv query heads | key | value].
func GroupedHeads(nh, nkv, hs int) HeadLayout {
	g := nh / nkv
	return HeadLayout{Heads: nh, KVHeads: nkv, HeadSize: hs, Row: nkv * (g + 2) * hs, KVStride: (g + 2) * hs, Q: 0, K: g * hs, V: (g + 1) * hs}
}

// FusedAttention is a device that computes attention in fused kernels
// (FlashAttention-2): no (B,NH,T,T) scores or probabilities in memory, the
// backward recomputing them from each row's log-sum-exp. Its products
// round their operands to bfloat16, so a device offers it only where its
// matrix precision already does (tf32, bf16).
type FusedAttention interface {
	// FusedAttentionUnsupported says why the device does not run its fused
	// attention on heads of headSize at its precision, or "" when it does.
	FusedAttentionUnsupported(headSize int) string
	// FusedAttentionForward is AttentionForward (GroupedAttentionForward)
	// on qkv (B,T,l.Row) laid out as l: out (B,T,Heads*HeadSize), with the
	// masks of SoftmaxForward; lse (B,Heads,T) receives each query row's
	// log-sum-exp of its scaled scores (+Inf on a row that sees no key).
	// qkv and out are both Float32 or both BFloat16 (out rounded on
	// store); the backward reads them as they are.
	FusedAttentionForward(out, lse, qkv *Tensor, l HeadLayout, causal bool, keyValid []int32)
	// FusedAttentionBackward accumulates into dqkv (laid out as qkv) the
	// gradient of FusedAttentionForward from dout, given the forward's
	// qkv, out and lse and the same masks; delta (B,Heads,T) is scratch,
	// overwritten. dqkv and dout are stored as qkv (a BFloat16 dqkv gets
	// each element's float32 sum rounded once). Every sum runs in a fixed
	// order: the same inputs give the same bits.
	FusedAttentionBackward(dqkv, delta, dout, out, lse, qkv *Tensor, l HeadLayout, causal bool, keyValid []int32)
}

// FusedAttentionHeadSizes are the head sizes a device's fused attention
// is built for (the CUDA device's kernels; the plan asks the same).
var FusedAttentionHeadSizes = []int{32, 64, 128}

// FusedAttentionOn returns dev's fused attention for heads of headSize, or
// nil and why it has none.
func FusedAttentionOn(dev Device, headSize int) (FusedAttention, string) {
	f, ok := dev.(FusedAttention)
	if !ok {
		return nil, fmt.Sprintf("the %s device has no fused attention", dev.Name())
	}
	if why := f.FusedAttentionUnsupported(headSize); why != "" {
		return nil, why
	}
	return f, ""
}
