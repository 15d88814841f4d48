package parallel

import (
	"fmt"
	"math"
	"strings"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// The layers of a Llama-family decoder (Touvron et al. 2023; Hugging
// Face's LlamaForCausalLM): RMSNorm, attention with rotary position
// embeddings and grouped-query heads, the SwiGLU MLP, and the block that
// joins them. No biases anywhere. The tensor-parallel split is Megatron's:
// the fused Q,K,V and the fused gate/up projections column-parallel, the
// output and down projections row-parallel, RMSNorm replicated.

// RoPE says how rotary position embeddings turn a head's channel pairs:
// pair j of a head of hd channels by position*freq_j, with freq_j =
// Theta^(-2j/hd), adjusted as Llama 3's Scaling says when it is not nil.
type RoPE struct {
	Theta   float64 // the base; 0 means 10000
	Scaling *RoPEScaling
}

// RoPEScaling is Llama 3's rope_scaling ("rope_type": "llama3"): wave
// lengths longer than OriginalMaxPositions/LowFreqFactor are slowed by
// Factor, those shorter than OriginalMaxPositions/HighFreqFactor kept, and
// the ones between interpolated.
type RoPEScaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  int
}

// Frequencies are the hd/2 angular frequencies of a head of hd channels.
func (r RoPE) Frequencies(hd int) []float64 {
	theta := r.Theta
	if theta == 0 {
		theta = 10000
	}
	f := make([]float64, hd/2)
	for j := range f {
		f[j] = 1 / math.Pow(theta, float64(2*j)/float64(hd))
		if s := r.Scaling; s != nil {
			old := float64(s.OriginalMaxPositions)
			wave := 2 * math.Pi / f[j]
			switch {
			case wave > old/s.LowFreqFactor:
				f[j] /= s.Factor
			case wave >= old/s.HighFreqFactor:
				smooth := (old/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				f[j] = (1-smooth)*f[j]/s.Factor + smooth*f[j]
			}
		}
	}
	return f
}

// Table is the (seqLen,hd) table RoPEForward reads: row p holds
// cos(p*freq_j) for j < hd/2, then sin(p*freq_j).
func (r RoPE) Table(seqLen, hd int) []float32 {
	f := r.Frequencies(hd)
	out := make([]float32, seqLen*hd)
	for p := 0; p < seqLen; p++ {
		for j, fj := range f {
			s, c := math.Sincos(float64(p) * fj)
			out[p*hd+j], out[p*hd+hd/2+j] = float32(c), float32(s)
		}
	}
	return out
}

// RMSNormSizes are an RMSNorm's buffers for (b,t,c) inputs: out (b,t,c),
// stored as dt (RMSNorm.Out), and rstd (b*t), saved.
func RMSNormSizes(b, t, c int, dt tensor.DType) Sizes {
	return Sizes{Saved: Buffers{buf("out", b, t, c).as(dt), buf("rstd", b*t)}}
}

// RMSNorm scales each position by the reciprocal of its root mean square
// and a learned weight (no mean, no bias); the weight is replicated on
// every tensor-parallel rank.
type RMSNorm struct {
	Name   string
	Dim    int
	Weight *Param
	Eps    float32
	Out    tensor.DType // what the output is stored as (LayerNorm.Out)

	*rmsSaved
}

// rmsSaved is what an RMSNorm's Forward keeps for its Backward.
type rmsSaved struct {
	inp       *tensor.Tensor
	bufs      buffers
	out, rstd *tensor.Tensor
}

// NewRMSNorm makes an RMSNorm over dim channels (weight 1), its weight
// taken from from (nil: a new one).
func NewRMSNorm(dev tensor.Device, name string, dim int, eps float32, from *ParamSet) (*RMSNorm, error) {
	if dim < 1 {
		return nil, fmt.Errorf("%s: dim %d: must be at least 1", name, dim)
	}
	if !(eps > 0) {
		return nil, fmt.Errorf("%s: eps %g: must be positive", name, eps)
	}
	w, err := from.param(dev, ParamSpec{Name: name + ".weight", Full: []int{dim}, Shard: Shard{Parts: 1}, Init: InitOnes}, 0)
	if err != nil {
		return nil, err
	}
	return &RMSNorm{Name: name, Dim: dim, Weight: w, Eps: eps, rmsSaved: new(rmsSaved)}, nil
}

// SetSequenceParallel marks the weight as used in a sequence-parallel
// region over sp (its gradient then comes from this rank's positions only).
func (l *RMSNorm) SetSequenceParallel(sp *SequenceParallel) {
	l.Weight.SeqReduce = sp != nil && sp.Size() > 1
}

// Params lists the weight.
func (l *RMSNorm) Params() []*Param { return []*Param{l.Weight} }

// Forward normalises inp (B,T,C) into the layer's (B,T,C) output.
func (l *RMSNorm) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	return l.AddForward(nil, inp, nil)
}

// AddForward is Forward(sum) after sum = a + b (a residual add), in one
// kernel; with a nil b it is Forward(a). sum is the input Backward
// differentiates at.
func (l *RMSNorm) AddForward(sum, a, b *tensor.Tensor) (*tensor.Tensor, error) {
	bs, t, err := batchShape(l.Name, a, l.Dim)
	if err != nil {
		return nil, err
	}
	dev := l.Weight.Data.Device()
	if err := l.bufs.ensure(dev, [2]int{bs, t}, func() Buffers { return RMSNormSizes(bs, t, l.Dim, l.Out).Saved }, func(get func(string) *tensor.Tensor) {
		l.out, l.rstd = get("out"), get("rstd")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	if b == nil {
		l.inp = a
		dev.RMSNormForward(l.out, l.rstd, a, l.Weight.Data, l.Eps)
		return l.out, nil
	}
	l.inp = sum
	dev.AddRMSNormForward(sum, l.out, l.rstd, a, b, l.Weight.Data, l.Eps)
	return l.out, nil
}

// Backward accumulates into dinp (B,T,C) and the weight's gradient.
func (l *RMSNorm) Backward(dout, dinp *tensor.Tensor) error {
	if l.inp == nil {
		return fmt.Errorf("%s: Backward before Forward", l.Name)
	}
	if dout.Len() != l.out.Len() || dinp.Len() != l.inp.Len() {
		return shapeErr(l.Name, "Backward with dout %v, dinp %v after a Forward of %v", dout, dinp, l.inp)
	}
	l.Weight.Data.Device().RMSNormBackward(dinp, l.Weight.grad(), dout, l.inp, l.Weight.Data, l.rstd)
	return nil
}

// Shadow returns a copy of the layer with its own saved activations.
func (l *RMSNorm) Shadow() *RMSNorm {
	c := *l
	c.rmsSaved = new(rmsSaved)
	return &c
}

// Release frees the layer's activation buffers.
func (l *RMSNorm) Release() { l.bufs.release() }

// KVSplit is how grouped-query attention's heads lie over tp ranks
// (Megatron-LM's rule): tp divides the query heads, and either divides
// the key/value heads (each rank holds kvHeads/tp of them, local, with
// their query heads: replicas 1) or is a multiple of them (each key/value
// head held by replicas = tp/kvHeads ranks, local 1, each rank a share of
// its query heads). Any other tp is refused, naming the ones that work.
func KVSplit(heads, kvHeads, tp int) (local, replicas int, err error) {
	tp = max(tp, 1)
	fits := func(t int) bool { return heads%t == 0 && (kvHeads%t == 0 || t%kvHeads == 0) }
	if heads < 1 || kvHeads < 1 || heads%kvHeads != 0 {
		return 0, 0, fmt.Errorf("heads %d, kv heads %d: want at least one of each and whole groups of query heads", heads, kvHeads)
	}
	if !fits(tp) {
		var ok []string
		for t := 1; t <= heads; t++ {
			if fits(t) {
				ok = append(ok, fmt.Sprint(t))
			}
		}
		return 0, 0, fmt.Errorf("tp %d with %d query and %d key/value heads: tp must divide the query heads and either divide the key/value heads or be a multiple of them (each key/value head then replicated over tp/kv ranks): tp %s work",
			tp, heads, kvHeads, strings.Join(ok, ", "))
	}
	if kvHeads%tp == 0 {
		return kvHeads / tp, 1, nil
	}
	return 1, tp / kvHeads, nil
}

// LlamaAttentionConfig sizes a grouped-query attention layer with rotary
// embeddings.
type LlamaAttentionConfig struct {
	Dim     int // C, the model width
	Heads   int // query heads over all ranks; the head size is Dim/Heads
	KVHeads int // key/value heads over all ranks (num_key_value_heads); 0 means Heads
	RoPE    RoPE
	Seed    uint64
	Std     float32
	ProjStd float32 // init std of the output projection; 0 means Std
	// SP, when not nil, is the sequence-parallel region of tp (see
	// AttentionConfig.SP).
	SP *SequenceParallel
	// Selective keeps no softmax probabilities (RecomputeSelective).
	Selective bool
	Fused     bool // the device's fused attention (AttentionConfig.Fused)
	// Activations is what qkv_proj's output and y are stored as
	// (AttentionConfig.Activations; RoPE rotates the first in place,
	// rounding), and y's gradient, and qkv_proj's output gradient as
	// QKVGradDType says.
	Activations tensor.DType
	OutGrad     tensor.DType // what the output's gradient arrives as (AttentionConfig.OutGrad)
	From        *ParamSet    // the model's parameters, where the layer takes its own; nil: new ones
}

// LlamaAttention is causal self-attention with grouped-query heads and
// rotary position embeddings. The fused Q,K,V projection holds KVHeads
// groups, each [Heads/KVHeads query heads | key head | value head]
// (Megatron-LM's grouped layout), and is column-parallel over whole
// groups when tp divides KVHeads; when tp is a multiple of KVHeads each
// group is held by tp/KVHeads ranks, each with its share of the query
// heads and the whole key and value head (KVSplit), whose gradients
// ReduceReplicas sums over those ranks. The output projection is
// row-parallel. Queries and keys are rotated after the projection, and
// their gradients rotated back before its backward. Communication as
// ParallelSelfAttention: one all-reduce forward, one backward.
type LlamaAttention struct {
	Name string
	QKV  *ColumnParallelLinear // (KVHeads*(g+2)*hd, C), g = Heads/KVHeads, split by groups
	Proj *RowParallelLinear    // (C, C), input parallel

	dim, nh, nkv, hd int // width, query and key/value heads on this rank, head size
	ropeCfg          RoPE
	selective        bool
	sp               *SequenceParallel
	fused            tensor.FusedAttention // nil: the unfused attention

	*attnSaved
	*gqaScratch
}

// gqaScratch is what a LlamaAttention's Backward uses and leaves nothing
// in, and its rotation table: the layer and its shadows share it.
type gqaScratch struct {
	grads      phasedBuffers  // the rotation table and attnForwardScratch's, made by Forward; the rest by Backward
	ropeTable  *tensor.Tensor // (T, hd) cos | sin of each position's angles
	attScratch *tensor.Tensor // (B, nh, T, T) the probabilities under selective recomputation
	dqkv       *tensor.Tensor // (B, T, nkv*(g+2)*hd)
	datt, dpre *tensor.Tensor // (B, nh, T, T)
	dy         *tensor.Tensor // (B, T, nh*hd)
	delta      *tensor.Tensor // (B, nh, T) the fused backward's rowsum(dy*y)
}

// llamaAttentionCoreSizes are a LlamaAttention's own buffers for b x t
// tokens (the full sequence), nh query and nkv key/value heads of hd on
// this rank: as attentionCoreSizes, with dqkv (b,t,(nh+2nkv)*hd), stored
// as QKVGradDType says (bfloat16 Q and K gradients are rounded once more
// by RoPE's backward, in place), and the rotation table rope (t,hd),
// scratch made by Forward; fused, as attentionCoreSizes's.
func llamaAttentionCoreSizes(b, t, nh, nkv, hd int, selective, fused bool, y tensor.DType) Sizes {
	dqkv := buf("dqkv", b, t, (nh+2*nkv)*hd).as(QKVGradDType(y, fused, nh, nkv))
	if fused {
		return Sizes{
			Saved:   Buffers{buf("lse", b, nh, t), buf("y", b, t, nh*hd).as(y)},
			Scratch: Buffers{buf("rope", t, hd), buf("delta", b, nh, t), buf("dy", b, t, nh*hd).as(y), dqkv},
		}
	}
	z := Sizes{
		Saved: Buffers{buf("att", b, nh, t, t).as(y), buf("y", b, t, nh*hd).as(y)},
		Scratch: Buffers{buf("rope", t, hd), buf("datt", b, nh, t, t), buf("dpre", b, nh, t, t).as(y),
			buf("dy", b, t, nh*hd).as(y), dqkv},
	}
	if selective {
		z.Saved, z.Scratch = z.Saved[1:], append(Buffers{z.Saved[0]}, z.Scratch...)
	}
	return z
}

// NewLlamaAttention makes this rank's groups of a grouped-query attention
// layer over the group tp (nil: unsharded).
func NewLlamaAttention(dev tensor.Device, tp nccl.Comm, name string, cfg LlamaAttentionConfig) (*LlamaAttention, error) {
	g := NewGroup(tp)
	if cfg.KVHeads == 0 {
		cfg.KVHeads = cfg.Heads
	}
	if cfg.Dim < 1 || cfg.Heads < 1 || cfg.KVHeads < 1 {
		return nil, fmt.Errorf("%s: dim %d, heads %d, kv heads %d: must be at least 1", name, cfg.Dim, cfg.Heads, cfg.KVHeads)
	}
	if cfg.Dim%cfg.Heads != 0 || (cfg.Dim/cfg.Heads)%2 != 0 {
		return nil, fmt.Errorf("%s: dim %d does not split into %d heads of an even size (rotary embeddings turn channel pairs)", name, cfg.Dim, cfg.Heads)
	}
	if cfg.Heads%cfg.KVHeads != 0 {
		return nil, fmt.Errorf("%s: heads %d is not a multiple of kv heads %d", name, cfg.Heads, cfg.KVHeads)
	}
	nkv, replicas, err := KVSplit(cfg.Heads, cfg.KVHeads, g.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	projStd := cfg.ProjStd
	if projStd == 0 {
		projStd = cfg.Std
	}
	hd := cfg.Dim / cfg.Heads
	fused, err := fusedAttention(dev, name, cfg.Fused, hd)
	if err != nil {
		return nil, err
	}
	qkv, err := NewColumnParallelLinear(dev, tp, name+".qkv_proj", cfg.Dim, (cfg.Heads+2*cfg.KVHeads)*hd, LinearOptions{Seed: cfg.Seed, Std: cfg.Std, SequenceParallel: cfg.SP,
		Replicas: replicas, Shared: 2 * hd, From: cfg.From, OutDType: cfg.Activations})
	if err != nil {
		return nil, err
	}
	proj, err := NewRowParallelLinear(dev, tp, name+".o_proj", cfg.Dim, cfg.Dim, LinearOptions{InputIsParallel: true, TransientOut: true, Seed: cfg.Seed, Std: projStd, SequenceParallel: cfg.SP, From: cfg.From, GradDType: ProjGradDType(cfg.Activations, cfg.OutGrad)})
	if err != nil {
		return nil, err
	}
	return &LlamaAttention{Name: name, QKV: qkv, Proj: proj, dim: cfg.Dim, nh: cfg.Heads / g.Size(), nkv: nkv, hd: hd,
		ropeCfg: cfg.RoPE, selective: cfg.Selective, sp: cfg.SP, fused: fused, attnSaved: new(attnSaved), gqaScratch: new(gqaScratch)}, nil
}

// Params lists the layer's parameters.
func (a *LlamaAttention) Params() []*Param { return append(a.QKV.Params(), a.Proj.Params()...) }

// group is the query heads of a group (g), for the rotation's pattern: of
// every g+2 heads of a fused row the first g+1 (queries and key) turn.
func (a *LlamaAttention) group() int { return a.nh / a.nkv }

// Forward computes attention over inp (B,T,C) (this rank's positions
// under sequence parallelism) and returns the same shape, in o_proj's
// output buffer (as ParallelSelfAttention's: read it before the next
// Forward of an attention sharing the scratch). keyValid, when not nil,
// is (B*T) with 0 at padding keys.
func (a *LlamaAttention) Forward(inp *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error) {
	b, t, err := batchShape(a.Name, inp, a.dim)
	if err != nil {
		return nil, err
	}
	if a.sp != nil {
		t *= a.sp.Size()
	}
	if keyValid != nil && len(keyValid) != b*t {
		return nil, shapeErr(a.Name, "key mask of %d entries for a batch of %dx%d tokens", len(keyValid), b, t)
	}
	dev := a.QKV.Weight.Data.Device()
	if err := a.bufs.ensure(dev, [2]int{b, t}, func() Buffers {
		return llamaAttentionCoreSizes(b, t, a.nh, a.nkv, a.hd, a.selective, a.fused != nil, a.QKV.opt.OutDType).Saved
	}, func(get func(string) *tensor.Tensor) {
		a.att, a.lse, a.y = get("att"), get("lse"), get("y")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", a.Name, err)
	}
	if err := a.ensureScratch(dev, b, t, false); err != nil {
		return nil, err
	}
	a.keyValid = keyValid
	qkv, err := a.QKV.Forward(inp)
	if err != nil {
		return nil, err
	}
	g := a.group()
	dev.RoPEForward(qkv, a.ropeTable, t, g+2, g+1) // in place: c_attn's backward reads its input, not its output
	if a.fused != nil {
		a.fused.FusedAttentionForward(a.y, a.lse, qkv, tensor.GroupedHeads(a.nh, a.nkv, a.hd), true, keyValid)
		return a.Proj.Forward(a.y)
	}
	tensor.GroupedAttentionForward(a.y, a.probs(), a.scores(), qkv, a.nh, a.nkv, true, keyValid)
	return a.Proj.Forward(a.y)
}

// ensureScratch makes the rotation table and Forward's scratch
// (attnForwardScratch) for b x t tokens, and with backward the
// backward's too.
func (a *LlamaAttention) ensureScratch(dev tensor.Device, b, t int, backward bool) error {
	var fill *tensor.Tensor
	if err := a.grads.ensure(dev, [2]int{b, t}, func() Buffers {
		return llamaAttentionCoreSizes(b, t, a.nh, a.nkv, a.hd, a.selective, a.fused != nil, a.QKV.opt.OutDType).Scratch
	}, append(attnForwardScratch(a.QKV.opt.OutDType), "rope"), backward, func(get func(string) *tensor.Tensor) {
		a.attScratch, a.ropeTable = get("att"), get("rope")
		takeDatt(&a.datt, get)
		fill = a.ropeTable
	}, func(get func(string) *tensor.Tensor) {
		a.dpre, a.dy, a.dqkv, a.delta = get("dpre"), get("dy"), get("dqkv"), get("delta")
		takeDatt(&a.datt, get)
	}); err != nil {
		return fmt.Errorf("%s: %w", a.Name, err)
	}
	if fill != nil {
		dev.CopyFromHost(fill, a.ropeCfg.Table(t, a.hd))
	}
	return nil
}

// scores is where the forward's scores go before the softmax (as
// ParallelSelfAttention's).
func (a *LlamaAttention) scores() *tensor.Tensor { return scoresScratch(a.probs(), a.datt) }

func (a *LlamaAttention) probs() *tensor.Tensor {
	if a.selective {
		return a.attScratch
	}
	return a.att
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient from dout.
func (a *LlamaAttention) Backward(dout, dinp *tensor.Tensor) error {
	if a.y == nil || a.QKV.inp == nil {
		return fmt.Errorf("%s: Backward before Forward", a.Name)
	}
	dev := dout.Device()
	t := a.y.Dim(1)
	if err := a.ensureScratch(dev, a.y.Dim(0), t, true); err != nil {
		return err
	}
	dev.Zero(a.dy)
	if err := a.Proj.Backward(dout, a.dy); err != nil {
		return err
	}
	dev.Zero(a.dqkv)
	if a.fused != nil {
		a.fused.FusedAttentionBackward(a.dqkv, a.delta, a.dy, a.y, a.lse, a.QKV.outLocal, tensor.GroupedHeads(a.nh, a.nkv, a.hd), true, a.keyValid)
	} else {
		if a.selective {
			tensor.GroupedAttentionForward(a.y, a.attScratch, a.scores(), a.QKV.outLocal, a.nh, a.nkv, true, a.keyValid)
		}
		tensor.GroupedAttentionBackward(a.dqkv, a.datt, a.dpre, a.dy, a.QKV.outLocal, a.probs(), a.nh, a.nkv)
	}
	g := a.group()
	dev.RoPEBackward(a.dqkv, a.ropeTable, t, g+2, g+1)
	return a.QKV.Backward(a.dqkv, dinp)
}

// Shadow returns a copy of the layer with its own saved activations.
func (a *LlamaAttention) Shadow() *LlamaAttention {
	c := *a
	c.attnSaved = new(attnSaved)
	c.QKV, c.Proj = a.QKV.Shadow(), a.Proj.Shadow()
	return &c
}

// Release frees the layer's activation buffers.
func (a *LlamaAttention) Release() {
	a.bufs.release()
	a.grads.release()
	a.QKV.Release()
	a.Proj.Release()
}

// SwiGLUMLP is Llama's feed-forward block: down(silu(gate(x)) * up(x)).
// The gate and up projections are one column-parallel layer of two fused
// blocks (each rank holds its columns of both, side by side), the down
// projection row-parallel: one all-reduce forward, one backward.
type SwiGLUMLP struct {
	Name   string
	GateUp *ColumnParallelLinear // (2*Hidden, C) as [gate; up], 2 blocks split over ranks
	Down   *RowParallelLinear    // (C, Hidden), input parallel

	act tensor.DType // what h and gate_up_proj's output, and their gradients, are stored as
	*swigluSaved
	*swigluScratch
}

type swigluSaved struct {
	bufs buffers
	h    *tensor.Tensor // (B,T,Hidden/tp) silu(gate)*up
}

type swigluScratch struct {
	grads   buffers
	dh, dgu *tensor.Tensor // (B,T,Hidden/tp), (B,T,2*Hidden/tp), stored as SwiGLUMLP.act
}

// swigluCoreSizes are the SwiGLU MLP's own buffers for b x t tokens, fl =
// Hidden/tp: h (b,t,fl), saved, stored as act (read only by down_proj's
// products); dh (b,t,fl) and dgate_up (b,t,2fl), the gradients of h and of
// the fused projection's output, scratch, stored as act too (down_proj's
// input-gradient product rounds into dh, SwiGLU's backward reads it and
// rounds into dgate_up, which gate_up_proj's products read).
func swigluCoreSizes(b, t, fl int, act tensor.DType) Sizes {
	return Sizes{
		Saved:   Buffers{buf("h", b, t, fl).as(act)},
		Scratch: Buffers{buf("dh", b, t, fl).as(act), buf("dgate_up", b, t, 2*fl).as(act)},
	}
}

// NewSwiGLUMLP makes this rank's shard of a SwiGLU MLP (dim -> hidden ->
// dim) over the group tp (nil: unsharded), in the sequence-parallel region
// sp when it is not nil; tp must divide hidden. The parameters are taken
// from from (nil: new ones). act is what gate_up_proj's output and h, and
// their gradients, are stored as (as NewParallelMLP's).
func NewSwiGLUMLP(dev tensor.Device, tp nccl.Comm, sp *SequenceParallel, name string, dim, hidden int, seed uint64, std, projStd float32, from *ParamSet, act, outGrad tensor.DType) (*SwiGLUMLP, error) {
	if projStd == 0 {
		projStd = std
	}
	gu, err := NewColumnParallelLinear(dev, tp, name+".gate_up_proj", dim, 2*hidden, LinearOptions{Blocks: 2, Seed: seed, Std: std, SequenceParallel: sp, From: from, OutDType: act})
	if err != nil {
		return nil, err
	}
	down, err := NewRowParallelLinear(dev, tp, name+".down_proj", hidden, dim, LinearOptions{InputIsParallel: true, TransientOut: true, Seed: seed, Std: projStd, SequenceParallel: sp, From: from, GradDType: ProjGradDType(act, outGrad)})
	if err != nil {
		return nil, err
	}
	return &SwiGLUMLP{Name: name, GateUp: gu, Down: down, act: act, swigluSaved: new(swigluSaved), swigluScratch: new(swigluScratch)}, nil
}

// Params lists the layer's parameters.
func (m *SwiGLUMLP) Params() []*Param { return append(m.GateUp.Params(), m.Down.Params()...) }

// Forward maps inp (B,T,C) to (B,T,C), the output in down_proj's buffer
// (as ParallelMLP's).
func (m *SwiGLUMLP) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	gu, err := m.GateUp.Forward(inp)
	if err != nil {
		return nil, err
	}
	dev := gu.Device()
	b, t := gu.Dim(0), gu.Dim(1)
	if err := m.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return swigluCoreSizes(b, t, gu.Dim(2)/2, m.act).Saved }, func(get func(string) *tensor.Tensor) {
		m.h = get("h")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name, err)
	}
	dev.SwiGLUForward(m.h, gu)
	return m.Down.Forward(m.h)
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient from dout.
func (m *SwiGLUMLP) Backward(dout, dinp *tensor.Tensor) error {
	if m.h == nil {
		return fmt.Errorf("%s: Backward before Forward", m.Name)
	}
	dev := dout.Device()
	b, t := m.h.Dim(0), m.h.Dim(1)
	if err := m.grads.ensure(dev, [2]int{b, t}, func() Buffers { return swigluCoreSizes(b, t, m.h.Dim(2), m.act).Scratch }, func(get func(string) *tensor.Tensor) {
		m.dh, m.dgu = get("dh"), get("dgate_up")
	}); err != nil {
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	dev.Zero(m.dh)
	if err := m.Down.Backward(dout, m.dh); err != nil {
		return err
	}
	dev.Zero(m.dgu)
	dev.SwiGLUBackward(m.dgu, m.GateUp.outLocal, m.dh)
	return m.GateUp.Backward(m.dgu, dinp)
}

// Shadow returns a copy of the layer with its own saved activations.
func (m *SwiGLUMLP) Shadow() *SwiGLUMLP {
	c := *m
	c.swigluSaved = new(swigluSaved)
	c.GateUp, c.Down = m.GateUp.Shadow(), m.Down.Shadow()
	return &c
}

// Release frees the layer's activation buffers.
func (m *SwiGLUMLP) Release() {
	m.bufs.release()
	m.grads.release()
	m.GateUp.Release()
	m.Down.Release()
}

// LlamaBlockConfig sizes a Llama decoder block.
type LlamaBlockConfig struct {
	Dim     int // C
	Heads   int // query heads over all ranks
	KVHeads int // key/value heads over all ranks; 0 means Heads
	Hidden  int // the SwiGLU width (intermediate_size)
	Eps     float32
	RoPE    RoPE
	Seed    uint64
	Std     float32 // 0 means DefaultStd
	ProjStd float32 // init std of the two output projections; 0 means Std
	// SP, when not nil, is the sequence-parallel region of tp (as
	// BlockConfig.SP).
	SP             *SequenceParallel
	Recompute      Recompute
	FusedAttention bool // the attention runs fused (AttentionConfig.Fused)
	// Activations is what the activations only matrix products, the
	// activation kernels and the attention read are stored as
	// (gate_up_proj's and SwiGLU's outputs, qkv_proj's, the norms'), the
	// MLP's and the attention's gradients that only they read, and the
	// residual stream, as BlockConfig.Activations.
	Activations tensor.DType
	From        *ParamSet // the model's parameters, where the block takes its own; nil: new ones
}

// LlamaBlock is a pre-norm Llama decoder block, Block's residual skeleton
// (its Forward and Backward) over Llama's layers:
//
//	r = x + Attn(RMSNorm1(x));  out = r + MLP(RMSNorm2(r))
//
// with the tensor-parallel split and the recomputation modes of Block: 2
// all-reduces forward and 2 backward (with SP, the all-gathers and
// reduce-scatters of BlockConfig.SP).
type LlamaBlock struct {
	Name                string
	InputNorm, PostNorm *RMSNorm
	Attn                *LlamaAttention
	MLP                 *SwiGLUMLP

	prenorm
}

// LlamaBlockShape is what decides a Llama block's buffers.
type LlamaBlockShape struct {
	Dim, Heads, KVHeads, Hidden int
	TP                          int
	SP                          bool
	Recompute                   Recompute
	FusedAttention              bool         // the attention runs fused (LlamaBlockConfig.FusedAttention)
	Activations                 tensor.DType // LlamaBlockConfig.Activations
}

// LlamaBlockSizes are all the buffers of one Llama block and its layers
// for b sequences of t tokens, named by layer as BlockSizes names GPT's:
// "r", "input_layernorm.out", "self_attn.att", "self_attn.qkv_proj.out_local",
// "mlp.down_proj.out".
func LlamaBlockSizes(s LlamaBlockShape, b, t int) Sizes {
	tp, c := max(s.TP, 1), s.Dim
	kv := s.KVHeads
	if kv == 0 {
		kv = s.Heads
	}
	nkv, _, err := KVSplit(s.Heads, kv, tp)
	if err != nil {
		nkv = kv / tp // refused by NewLlamaAttention
	}
	hd := c / s.Heads
	tl := t
	if s.SP {
		tl = t / tp
	}
	var z, layers Sizes
	full := s.Recompute == RecomputeFull
	z.add("", blockOwnSizes(b, tl, c, full, s.Activations, false))
	norms := s.Activations
	layers.add("input_layernorm.", RMSNormSizes(b, tl, c, norms))
	layers.add("self_attn.", llamaAttentionCoreSizes(b, t, s.Heads/tp, nkv, hd, s.Recompute == RecomputeSelective, s.FusedAttention, s.Activations))
	layers.add("self_attn.qkv_proj.", ColumnSizes(LinearShape{In: c, Out: (s.Heads + 2*nkv*tp) * hd, TP: tp, SP: s.SP, OutDType: s.Activations}, b, t))
	layers.add("self_attn.o_proj.", RowSizes(LinearShape{In: c, Out: c, TP: tp, SP: s.SP, InputIsParallel: true, TransientOut: true}, b, t))
	layers.add("post_attention_layernorm.", RMSNormSizes(b, tl, c, norms))
	layers.add("mlp.", swigluCoreSizes(b, t, s.Hidden/tp, s.Activations))
	layers.add("mlp.gate_up_proj.", ColumnSizes(LinearShape{In: c, Out: 2 * s.Hidden, TP: tp, SP: s.SP, OutDType: s.Activations}, b, t))
	layers.add("mlp.down_proj.", RowSizes(LinearShape{In: s.Hidden, Out: c, TP: tp, SP: s.SP, InputIsParallel: true, TransientOut: true}, b, t))
	if full {
		layers = Sizes{Scratch: append(layers.Saved, layers.Scratch...)}
	}
	z.add("", layers)
	return z
}

// NewLlamaBlock makes this rank's shard of a Llama block named name (e.g.
// "model.layers.0") over the group tp (nil: unsharded).
func NewLlamaBlock(dev tensor.Device, tp nccl.Comm, name string, cfg LlamaBlockConfig) (*LlamaBlock, error) {
	if cfg.Hidden < 1 {
		return nil, fmt.Errorf("%s: MLP width %d: must be at least 1", name, cfg.Hidden)
	}
	if tp != nil && cfg.Hidden%tp.Size() != 0 {
		return nil, fmt.Errorf("%s: MLP width %d is not a multiple of tp %d", name, cfg.Hidden, tp.Size())
	}
	std := cfg.Std
	if std == 0 {
		std = DefaultStd
	}
	n1, err := NewRMSNorm(dev, name+".input_layernorm", cfg.Dim, cfg.Eps, cfg.From)
	if err != nil {
		return nil, err
	}
	attn, err := NewLlamaAttention(dev, tp, name+".self_attn", LlamaAttentionConfig{Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeads, RoPE: cfg.RoPE,
		Seed: cfg.Seed, Std: std, ProjStd: cfg.ProjStd, SP: cfg.SP, Selective: cfg.Recompute == RecomputeSelective, Fused: cfg.FusedAttention,
		Activations: cfg.Activations, OutGrad: cfg.Activations, From: cfg.From})
	if err != nil {
		return nil, err
	}
	n2, err := NewRMSNorm(dev, name+".post_attention_layernorm", cfg.Dim, cfg.Eps, cfg.From)
	if err != nil {
		return nil, err
	}
	mlp, err := NewSwiGLUMLP(dev, tp, cfg.SP, name+".mlp", cfg.Dim, cfg.Hidden, cfg.Seed, std, cfg.ProjStd, cfg.From, cfg.Activations, cfg.Activations)
	if err != nil {
		return nil, err
	}
	n1.Out = cfg.Activations
	n2.Out = n1.Out
	n1.SetSequenceParallel(cfg.SP)
	n2.SetSequenceParallel(cfg.SP)
	b := &LlamaBlock{Name: name, InputNorm: n1, Attn: attn, PostNorm: n2, MLP: mlp, prenorm: prenorm{name: name, dim: cfg.Dim, stream: cfg.Activations, recompute: cfg.Recompute, blockScratch: new(blockScratch)}}
	b.bind()
	return b, nil
}

// bind points the skeleton at the block's layers.
func (b *LlamaBlock) bind() {
	b.norm1, b.attn, b.norm2, b.mlp = b.InputNorm, b.Attn, b.PostNorm, b.MLP
	b.dev = b.InputNorm.Weight.Data.Device
}

// Params lists the block's parameters: input norm, attention, post norm,
// MLP.
func (b *LlamaBlock) Params() []*Param {
	ps := append(b.InputNorm.Params(), b.Attn.Params()...)
	ps = append(ps, b.PostNorm.Params()...)
	return append(ps, b.MLP.Params()...)
}

// ShareBuffers is Block.ShareBuffers for Llama blocks.
func (b *LlamaBlock) ShareBuffers(with *LlamaBlock) {
	b.Release()
	b.blockScratch = with.blockScratch
	b.Attn.gqaScratch = with.Attn.gqaScratch
	shareProjections(b.Attn.QKV, with.Attn.QKV, b.Attn.Proj, with.Attn.Proj)
	b.MLP.swigluScratch = with.MLP.swigluScratch
	shareProjections(b.MLP.GateUp, with.MLP.GateUp, b.MLP.Down, with.MLP.Down)
	if b.recompute == RecomputeFull {
		b.InputNorm.rmsSaved, b.PostNorm.rmsSaved = with.InputNorm.rmsSaved, with.PostNorm.rmsSaved
		b.Attn.attnSaved, b.MLP.swigluSaved = with.Attn.attnSaved, with.MLP.swigluSaved
		b.Attn.QKV.colSaved, b.Attn.Proj.rowSaved = with.Attn.QKV.colSaved, with.Attn.Proj.rowSaved
		b.MLP.GateUp.colSaved, b.MLP.Down.rowSaved = with.MLP.GateUp.colSaved, with.MLP.Down.rowSaved
	}
}

// Shadow returns a copy of the block with its own saved activations.
func (b *LlamaBlock) Shadow() *LlamaBlock {
	c := *b
	c.blockSaved = blockSaved{}
	if b.recompute != RecomputeFull {
		c.InputNorm, c.Attn, c.PostNorm, c.MLP = b.InputNorm.Shadow(), b.Attn.Shadow(), b.PostNorm.Shadow(), b.MLP.Shadow()
	}
	c.bind()
	return &c
}

// Release frees the block's activation buffers and its layers'.
func (b *LlamaBlock) Release() {
	b.bufs.release()
	b.grads.release()
	b.InputNorm.Release()
	b.PostNorm.Release()
	b.Attn.Release()
	b.MLP.Release()
}
