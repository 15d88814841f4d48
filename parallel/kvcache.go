package parallel

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/tensor"
)

// KVCache is one attention layer's keys and values of the positions a
// decoder has seen, on this rank (its own heads under tensor parallelism),
// for incremental decoding of one sequence: ForwardCached appends the new
// positions' keys and values (Llama's keys after their rotation) and
// attends over all of them, so a step over n new tokens costs n positions
// of the model, not the whole sequence again. Queries never enter it.
type KVCache struct {
	dev      tensor.Device
	k, v     *tensor.Tensor // (max, nkv*hd): each position's key and value heads
	len, max int
	lay      kvLayout
	rope     *tensor.Tensor // (max, hd) rotation table; nil without RoPE

	att, y *tensor.Tensor // scratch: (nh, n, len) scores and probabilities, (n, nh*hd) output
	probs  *tensor.Tensor // scratch: the probabilities stored as the layer's bfloat16 (nil: in att)
}

// kvLayout is where a fused Q,K,V row of a layer keeps its heads: nkv
// groups of g query heads sharing a key and a value head (g = 1 and nkv =
// nh for multi-head attention). Query head r of group j starts at
// j*qStride + r*hd; the key heads are rows of kCols at kOff, every kLd,
// kRows of them per token (the values the same at vOff).
type kvLayout struct {
	nh, nkv, hd, g int
	width          int // the fused row
	qStride        int
	kOff, vOff     int
	kLd, kCols     int
	kRows          int
	rotate         bool         // turn queries and keys (RoPE) before caching
	dt             tensor.DType // what the fused rows, and so the cached keys and values, and the output are stored as
}

func newKVCache(dev tensor.Device, lay kvLayout, max int, rope RoPE) (*KVCache, error) {
	if max < 1 {
		return nil, fmt.Errorf("kv cache of %d positions", max)
	}
	c := &KVCache{dev: dev, max: max, lay: lay}
	var err error
	if c.k, err = dev.AllocAs(lay.dt, max, lay.nkv*lay.hd); err != nil {
		return nil, err
	}
	if c.v, err = dev.AllocAs(lay.dt, max, lay.nkv*lay.hd); err != nil {
		c.Release()
		return nil, err
	}
	if lay.rotate {
		if c.rope, err = dev.Alloc(max, lay.hd); err != nil {
			c.Release()
			return nil, err
		}
		dev.CopyFromHost(c.rope, rope.Table(max, lay.hd))
	}
	return c, nil
}

// Len is the positions cached.
func (c *KVCache) Len() int { return c.len }

// Cap is the positions the cache holds at most.
func (c *KVCache) Cap() int { return c.max }

// Reset empties the cache (a new sequence).
func (c *KVCache) Reset() { c.len = 0 }

// Release frees the cache's device memory; it must not be used again.
func (c *KVCache) Release() {
	for _, t := range []*tensor.Tensor{c.k, c.v, c.rope, c.att, c.y, c.probs} {
		if t != nil {
			c.dev.Free(t)
		}
	}
	c.k, c.v, c.rope, c.att, c.y, c.probs = nil, nil, nil, nil, nil, nil
}

// scratch returns t if it holds n elements, else a new tensor of n
// stored as dt (t freed).
func (c *KVCache) scratch(t *tensor.Tensor, n int, dt tensor.DType) (*tensor.Tensor, error) {
	if t != nil && t.Len() >= n {
		return t, nil
	}
	if t != nil {
		c.dev.Free(t)
	}
	return c.dev.AllocAs(dt, n)
}

// attend takes qkv (1,n,width), the fused projection of n new tokens at
// positions Len()..Len()+n-1, rotates its queries and keys under RoPE,
// appends its keys and values, and returns the (1,n,nh*hd) attention
// output of its queries over every cached position, causal.
func (c *KVCache) attend(name string, qkv *tensor.Tensor, n int) (*tensor.Tensor, error) {
	l, d := c.lay, c.dev
	s := c.len
	if s+n > c.max {
		return nil, shapeErr(name, "%d cached and %d new positions: the cache holds %d", s, n, c.max)
	}
	if qkv.Len() != n*l.width {
		return nil, shapeErr(name, "fused projection %v for %d tokens, want rows of %d", qkv, n, l.width)
	}
	if l.rotate {
		d.RoPEForward(qkv, c.rope.View(s*l.hd, n, l.hd), n, l.g+2, l.g+1)
	}
	kvw := l.nkv * l.hd
	d.Copy2D(c.k, s*kvw, l.kCols, qkv, l.kOff, l.kLd, n*l.kRows, l.kCols)
	d.Copy2D(c.v, s*kvw, l.kCols, qkv, l.vOff, l.kLd, n*l.kRows, l.kCols)
	c.len = s + n
	L := c.len
	var err error
	// At least a row of every position for each head: one-token steps
	// never grow it.
	if c.att, err = c.scratch(c.att, max(l.nh*n*L, l.nh*c.max), tensor.Float32); err != nil {
		return nil, err
	}
	// The heads' output as Forward stores it (the layer's y).
	if c.y, err = c.scratch(c.y, n*l.nh*l.hd, l.dt); err != nil {
		return nil, err
	}
	att, y := c.att.View(0, 1, l.nh, n, L), c.y.View(0, 1, n, l.nh*l.hd)
	probs := att
	if l.dt == tensor.BFloat16 {
		// The probabilities as Forward's unfused attention stores them.
		if c.probs, err = c.scratch(c.probs, c.att.Len(), l.dt); err != nil {
			return nil, err
		}
		probs = c.probs.View(0, 1, l.nh, n, L)
	}
	// Head r of every group at once: scores = q k^T over the L keys.
	for r := 0; r < l.g; r++ {
		d.GemmStridedBatched(false, true, n, L, l.hd, 1, qkv, r*l.hd, l.width, l.qStride, c.k, 0, kvw, l.hd,
			0, att, r*n*L, L, l.g*n*L, l.nkv)
	}
	d.SoftmaxForward(probs, att, float32(1/math.Sqrt(float64(l.hd))), true, nil)
	for r := 0; r < l.g; r++ {
		d.GemmStridedBatched(false, false, n, l.hd, L, 1, probs, r*n*L, L, l.g*n*L, c.v, 0, kvw, l.hd,
			0, y, r*l.hd, l.nh*l.hd, l.g*l.hd, l.nkv)
	}
	return y, nil
}

// NewKVCache makes an empty cache of max positions for this rank's heads.
func (a *ParallelSelfAttention) NewKVCache(max int) (*KVCache, error) {
	cl := a.nh * a.hd
	return newKVCache(a.QKV.Weight.Data.Device(), kvLayout{nh: a.nh, nkv: a.nh, hd: a.hd, g: 1, width: 3 * cl, qStride: a.hd,
		kOff: cl, vOff: 2 * cl, kLd: 3 * cl, kCols: cl, kRows: 1, dt: a.QKV.opt.OutDType}, max, RoPE{})
}

// ForwardCached is Forward for incremental decoding of one causal
// sequence: inp (1,n,C) is the n positions after the cache's, whose keys
// and values it appends; it returns (1,n,C), as Forward over the whole
// sequence would at those positions. It keeps nothing for a Backward.
func (a *ParallelSelfAttention) ForwardCached(inp *tensor.Tensor, c *KVCache) (*tensor.Tensor, error) {
	b, t, err := batchShape(a.Name, inp, a.dim)
	if err != nil {
		return nil, err
	}
	if b != 1 || a.sp != nil || !a.causal {
		return nil, shapeErr(a.Name, "a cached forward decodes one causal sequence without sequence parallelism (batch %d)", b)
	}
	qkv, err := a.QKV.Forward(inp)
	if err != nil {
		return nil, err
	}
	y, err := c.attend(a.Name, qkv, t)
	if err != nil {
		return nil, err
	}
	return a.Proj.Forward(y)
}

// NewKVCache makes an empty cache of max positions for this rank's key
// and value heads, and the rotation table of those positions.
func (a *LlamaAttention) NewKVCache(max int) (*KVCache, error) {
	g := a.group()
	return newKVCache(a.QKV.Weight.Data.Device(), kvLayout{nh: a.nh, nkv: a.nkv, hd: a.hd, g: g, width: a.nkv * (g + 2) * a.hd,
		qStride: (g + 2) * a.hd, kOff: g * a.hd, vOff: (g + 1) * a.hd, kLd: (g + 2) * a.hd, kCols: a.hd, kRows: a.nkv, rotate: true, dt: a.QKV.opt.OutDType}, max, a.ropeCfg)
}

// ForwardCached is ParallelSelfAttention.ForwardCached for grouped-query
// heads: the new queries and keys turn by their positions in the
// sequence, and the cache keeps the turned keys.
func (a *LlamaAttention) ForwardCached(inp *tensor.Tensor, c *KVCache) (*tensor.Tensor, error) {
	b, t, err := batchShape(a.Name, inp, a.dim)
	if err != nil {
		return nil, err
	}
	if b != 1 || a.sp != nil {
		return nil, shapeErr(a.Name, "a cached forward decodes one sequence without sequence parallelism (batch %d)", b)
	}
	qkv, err := a.QKV.Forward(inp)
	if err != nil {
		return nil, err
	}
	y, err := c.attend(a.Name, qkv, t)
	if err != nil {
		return nil, err
	}
	return a.Proj.Forward(y)
}

// cachedAttention is an attention sublayer with an incremental decode path.
type cachedAttention interface {
	NewKVCache(max int) (*KVCache, error)
	ForwardCached(inp *tensor.Tensor, c *KVCache) (*tensor.Tensor, error)
}

// NewKVCache makes an empty cache of max positions for the block's
// attention.
func (b *prenorm) NewKVCache(max int) (*KVCache, error) {
	a, ok := b.attn.(cachedAttention)
	if !ok {
		return nil, fmt.Errorf("%s: its attention has no cached forward", b.name)
	}
	return a.NewKVCache(max)
}

// ForwardCached is Forward for incremental decoding (see
// ParallelSelfAttention.ForwardCached): x (1,n,C) is the n positions
// after c's.
func (b *prenorm) ForwardCached(x *tensor.Tensor, c *KVCache) (*tensor.Tensor, error) {
	a, ok := b.attn.(cachedAttention)
	if !ok {
		return nil, fmt.Errorf("%s: its attention has no cached forward", b.name)
	}
	dev, _, err := b.prepare(x)
	if err != nil {
		return nil, err
	}
	return b.forwardWith(dev, x, func(h *tensor.Tensor) (*tensor.Tensor, error) { return a.ForwardCached(h, c) })
}
