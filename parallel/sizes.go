package parallel

import (
	"fmt"
	"slices"

	"github.com/hpcrun/hpcrun/tensor"
)

// The size table. Every layer lists the activation buffers it allocates for
// a batch shape in one pure function (llm.c's fill_in_activation_sizes is
// the model): the layer's Forward and Backward allocate exactly the listed
// buffers (Allocate, by name), and train/plan sums the same lists to
// predict a rank's memory without building a layer. A buffer added to a
// layer is a line in its list, and the plan counts it.

// Buffer is one tensor a layer allocates for a batch shape.
type Buffer struct {
	Name  string // what it holds, unique in its list: "att", "c_attn.out_local"
	Shape []int
	DType tensor.DType // what an element is stored as (Float32, the zero value, or BFloat16)
}

// Len is the buffer's number of elements.
func (b Buffer) Len() int64 {
	n := int64(1)
	for _, d := range b.Shape {
		n *= int64(d)
	}
	return n
}

// Bytes is the buffer's size in bytes.
func (b Buffer) Bytes() int64 { return b.Len() * int64(b.DType.Size()) }

// Buffers is a list of buffers.
type Buffers []Buffer

// Len is the elements of all the buffers.
func (l Buffers) Len() int64 {
	var n int64
	for _, b := range l {
		n += b.Len()
	}
	return n
}

// Bytes is the size of all the buffers in bytes.
func (l Buffers) Bytes() int64 {
	var n int64
	for _, b := range l {
		n += b.Bytes()
	}
	return n
}

func buf(name string, shape ...int) Buffer { return Buffer{Name: name, Shape: shape} }

// as is b stored as dt.
func (b Buffer) as(dt tensor.DType) Buffer { b.DType = dt; return b }

// split is z's buffers named in names, and the others, each in z's order.
func (z Buffers) split(names []string) (in, out Buffers) {
	for _, b := range z {
		if slices.Contains(names, b.Name) {
			in = append(in, b)
		} else {
			out = append(out, b)
		}
	}
	return in, out
}

// Sizes are the buffers a layer allocates for one batch shape, split as a
// pipeline stage needs them: Saved is what Forward keeps for Backward (a
// Shadow has its own: one per micro-batch in flight), Scratch what a call
// uses and leaves nothing in past its return (Backward's working buffers;
// a projection's output its caller reads at once, the forward's float32
// attention scores), shared by the layer and its shadows.
type Sizes struct {
	Saved, Scratch Buffers
}

// Len is the elements of all the buffers.
func (s Sizes) Len() int64 { return s.Saved.Len() + s.Scratch.Len() }

// Bytes is the size of all the buffers in bytes.
func (s Sizes) Bytes() int64 { return s.Saved.Bytes() + s.Scratch.Bytes() }

// add appends o's buffers with their names prefixed (a sublayer's).
func (s *Sizes) add(prefix string, o Sizes) {
	for _, b := range o.Saved {
		b.Name = prefix + b.Name
		s.Saved = append(s.Saved, b)
	}
	for _, b := range o.Scratch {
		b.Name = prefix + b.Name
		s.Scratch = append(s.Scratch, b)
	}
}

// Allocate allocates one tensor on dev for every buffer of list and hands
// them to take, which picks them by name (get returns nil for a name the
// list does not have: a buffer this configuration does without). take must
// pick every buffer of the list, so that the list is what the layer uses.
// On an error nothing stays allocated. The tensors are returned for the
// caller to free.
func Allocate(dev tensor.Device, list Buffers, take func(get func(name string) *tensor.Tensor)) ([]*tensor.Tensor, error) {
	ts := make([]*tensor.Tensor, 0, len(list))
	free := func() {
		for _, t := range ts {
			dev.Free(t)
		}
	}
	for i, b := range list {
		for _, o := range list[:i] {
			if o.Name == b.Name {
				free()
				return nil, fmt.Errorf("buffer %q listed twice", b.Name)
			}
		}
		t, err := dev.AllocAs(b.DType, b.Shape...)
		if err != nil {
			free()
			return nil, fmt.Errorf("buffer %s %v %s: %w", b.Name, b.Shape, b.DType, err)
		}
		ts = append(ts, t)
	}
	taken := make([]bool, len(list))
	take(func(name string) *tensor.Tensor {
		for i, b := range list {
			if b.Name == name {
				taken[i] = true
				return ts[i]
			}
		}
		return nil
	})
	for i, ok := range taken {
		if !ok {
			free()
			return nil, fmt.Errorf("buffer %s %v allocated but not used", list[i].Name, list[i].Shape)
		}
	}
	return ts, nil
}

// LayerNormSizes are a layer norm's buffers for (b,t,c) inputs: out
// (b,t,c), stored as dt (LayerNorm.Out), and the statistics mean and rstd
// (b*t) that Backward reads.
func LayerNormSizes(b, t, c int, dt tensor.DType) Sizes {
	return Sizes{Saved: Buffers{buf("out", b, t, c).as(dt), buf("mean", b*t), buf("rstd", b*t)}}
}

// LinearShape is what decides a linear layer's buffers: its full sizes,
// the tensor-parallel degree and the options that change what it keeps
// (LinearOptions).
type LinearShape struct {
	In, Out         int
	TP              int          // the group's size (1: unsharded)
	SP              bool         // LinearOptions.SequenceParallel is set
	GatherOutput    bool         // column-parallel only
	OutDType        tensor.DType // column-parallel only: LinearOptions.OutDType
	InputIsParallel bool         // row-parallel only
	TransientOut    bool         // row-parallel only: LinearOptions.TransientOut
	GradDType       tensor.DType // row-parallel only: LinearOptions.GradDType
}

func (s LinearShape) tp() int { return max(s.TP, 1) }

// ColumnSizes are a ColumnParallelLinear's buffers for b x t tokens (the
// gathered sequence under sequence parallelism). Saved: out_local
// (b,t,Out/tp), stored as OutDType, this rank's columns (also the input of GELU or of the
// attention core, read again by their backward); with GatherOutput at tp >
// 1 the gathered out (b,t,Out). Scratch: at tp > 1 without sequence
// parallelism dx (b,t,In), the input gradient before f's all-reduce (with
// it the input gradient goes through the region's shared full buffer); with
// the gathered output, dout_local (b,t,Out/tp), this rank's columns of its
// gradient.
func ColumnSizes(s LinearShape, b, t int) Sizes {
	tp, ol := s.tp(), s.Out/s.tp()
	z := Sizes{Saved: Buffers{buf("out_local", b, t, ol).as(s.OutDType)}}
	gathered := s.GatherOutput && tp > 1
	if gathered {
		z.Saved = append(z.Saved, buf("out", b, t, s.Out))
	}
	if !s.SP && tp > 1 {
		z.Scratch = append(z.Scratch, buf("dx", b, t, s.In))
	}
	if gathered {
		z.Scratch = append(z.Scratch, buf("dout_local", b, t, ol))
	}
	return z
}

// RowSizes are a RowParallelLinear's buffers for b x t input tokens. Saved:
// out (b,t,Out), under sequence parallelism this rank's (b,t/tp,Out)
// positions, Scratch with TransientOut; when the layer cuts its own slice
// of a full input (InputIsParallel not set, tp > 1, no sequence
// parallelism) that slice x_local (b,t,In/tp), with its gradient dx_local
// (b,t,In/tp) as Backward's scratch; with a bfloat16 GradDType the output
// gradient rounded, dout_half, shaped as out, scratch too.
func RowSizes(s LinearShape, b, t int) Sizes {
	tp, tl := s.tp(), t
	if s.SP {
		tl = t / tp
	}
	z := Sizes{Saved: Buffers{buf("out", b, tl, s.Out)}}
	if !s.SP && !s.InputIsParallel && tp > 1 {
		z.Saved = append(z.Saved, buf("x_local", b, t, s.In/tp))
		z.Scratch = Buffers{buf("dx_local", b, t, s.In/tp)}
	}
	if s.TransientOut {
		z.Saved, z.Scratch = z.Saved[1:], append(Buffers{z.Saved[0]}, z.Scratch...)
	}
	if s.GradDType == tensor.BFloat16 {
		z.Scratch = append(z.Scratch, buf("dout_half", b, tl, s.Out).as(tensor.BFloat16))
	}
	return z
}

// attentionCoreSizes are the attention core's own buffers for b x t tokens
// (the full sequence), nh heads of width cl/nh on this rank. Saved: att
// (b,nh,t,t), the softmax probabilities, and y (b,t,cl), the heads' output
// before the projection, both stored as y (the activations' dtype).
// Scratch: datt and dpre (b,nh,t,t), the gradients of the probabilities
// and of the scores, dpre stored as y (the A operand of the products of dQ
// and dK; datt, float32, holds the forward's float32 scores when att is
// bfloat16); dy (b,t,cl), y's gradient, and dqkv (b,t,3cl), the gradient
// of c_attn's output, both stored as y too (products and the fused
// kernels read them; each element's float32 sum rounded once). With
// selective recomputation att is scratch: Backward computes it again from
// c_attn's saved output. The fused attention keeps no (t,t) tensor: lse
// (b,nh,t), each row's log-sum-exp, saved, and delta (b,nh,t) scratch, in
// att's and datt's place, and dpre not at all.
func attentionCoreSizes(b, t, nh, cl int, selective, fused bool, y tensor.DType) Sizes {
	if fused {
		return Sizes{
			Saved:   Buffers{buf("lse", b, nh, t), buf("y", b, t, cl).as(y)},
			Scratch: Buffers{buf("delta", b, nh, t), buf("dy", b, t, cl).as(y), buf("dqkv", b, t, 3*cl).as(y)},
		}
	}
	z := Sizes{
		Saved:   Buffers{buf("att", b, nh, t, t).as(y), buf("y", b, t, cl).as(y)},
		Scratch: Buffers{buf("datt", b, nh, t, t), buf("dpre", b, nh, t, t).as(y), buf("dy", b, t, cl).as(y), buf("dqkv", b, t, 3*cl).as(y)},
	}
	if selective {
		z.Saved, z.Scratch = z.Saved[1:], append(Buffers{z.Saved[0]}, z.Scratch...)
	}
	return z
}

// ProjGradDType is an output projection's LinearOptions.GradDType when
// its output gradient (the residual stream's) arrives as outGrad: act,
// the activations' dtype, where that gradient is float32 and act
// bfloat16 (the layer rounds it once for both its products: a post-norm
// block's, whose stream is float32); Float32, nothing to round, where it
// arrives as act (a pre-norm block's stream gradient).
func ProjGradDType(act, outGrad tensor.DType) tensor.DType {
	if outGrad == act {
		return tensor.Float32
	}
	return act
}

// QKVGradDType is what the gradient of an attention's fused Q,K,V
// projection output (dqkv) is stored as, the attention's activations
// stored as act: act, but float32 where the unfused attention sums a
// group of query heads' products into the gradients of their shared keys
// and values (heads > kvHeads), which bfloat16 would round once a head.
// The fused kernels sum a group in float32 and round once.
func QKVGradDType(act tensor.DType, fused bool, heads, kvHeads int) tensor.DType {
	if !fused && heads > kvHeads {
		return tensor.Float32
	}
	return act
}

// mlpCoreSizes are the MLP's own buffers for b x t tokens, fl = Hidden/tp
// wide: h (b,t,fl), GELU's output, saved, stored as act (read only by
// c_proj's products); dh (b,t,fl), the gradient of GELU's output and then,
// overwritten in place, of its input, scratch, stored as act too (as
// llm.c keeps it: c_proj's input-gradient product rounds into it, GELU's
// backward rounds again, and c_fc's products and bias gradient read it).
func mlpCoreSizes(b, t, fl int, act tensor.DType) Sizes {
	return Sizes{
		Saved:   Buffers{buf("h", b, t, fl).as(act)},
		Scratch: Buffers{buf("dh", b, t, fl).as(act)},
	}
}

// blockOwnSizes are a block's own buffers for (b,t,c) inputs (this rank's
// t positions under sequence parallelism): r, the residual after
// attention, and out, saved, both stored as resid (the residual stream:
// bfloat16 under bf16 compute in a pre-norm block, whose norms read it
// widened and whose adds round into it); dh, the gradient of a layer
// norm's output, scratch, stored as resid too (the norms' backward read
// it, the column-parallel layers' input-gradient products round into it:
// in a pre-norm block the norms' outputs are stored as the stream). The
// gradient of r needs none in a pre-norm block, whose BackwardInPlace
// runs the residual path in the gradient of its output; a post-norm
// layer (postNorm: train's arch hf) keeps dr, scratch. With full
// recomputation r is scratch too: Backward runs the block's forward
// again.
func blockOwnSizes(b, t, c int, full bool, resid tensor.DType, postNorm bool) Sizes {
	z := Sizes{
		Saved:   Buffers{buf("r", b, t, c).as(resid), buf("out", b, t, c).as(resid)},
		Scratch: Buffers{buf("dh", b, t, c).as(resid)},
	}
	if postNorm {
		z.Scratch = Buffers{buf("dr", b, t, c).as(resid), buf("dh", b, t, c).as(resid)}
	}
	if full {
		z.Saved, z.Scratch = z.Saved[1:], append(Buffers{z.Saved[0]}, z.Scratch...)
	}
	return z
}

// Recompute is how much of a block's forward pass its Backward runs again
// instead of keeping it, Megatron-LM's granularities (arXiv 2205.05198
// §5). The gradients are the same to the bit: the recomputation runs the
// same kernels on the same inputs. With either, the blocks of a model
// share their backward scratch (Block.ShareBuffers), which then counts
// once, not per block.
type Recompute int

const (
	// RecomputeNone keeps every activation the backward reads.
	RecomputeNone Recompute = iota
	// RecomputeSelective keeps no attention probabilities (b,nh,t,t), the
	// largest activation at long sequences: Backward computes them again
	// from the saved Q, K and V.
	RecomputeSelective
	// RecomputeFull keeps only each block's output (the next block's
	// input): Backward runs the block's forward again from its input,
	// into buffers all the blocks share.
	RecomputeFull
)

// BlockShape is what decides a transformer block's buffers (BlockConfig
// without its seeds and with the group's size).
type BlockShape struct {
	Dim, Heads int
	Hidden     int  // 0 means 4*Dim
	TP         int  // the tensor-parallel group's size
	SP         bool // sequence parallelism (BlockConfig.SP)
	Recompute  Recompute
	// FusedAttention: the attention runs fused (BlockConfig.FusedAttention).
	FusedAttention bool
	// Activations is the dtype of the activations only products, the
	// activation kernels and the attention read, and of the gradients only
	// they read (BlockConfig.Activations).
	Activations tensor.DType
	// PostNorm: the norms' outputs are the residual stream (BERT's
	// post-norm layers, train's arch hf), float32 whatever Activations.
	PostNorm bool
}

// normOut is what the block's norms store their outputs as: the
// activations' dtype, whose only readers are then the next products'
// (their A operand forward, B of the weight gradient; under sequence
// parallelism the all-gather into them, which carries bfloat16 too);
// Float32 in a post-norm block, whose norm outputs are the residual
// stream (spec.NormOut).
func (s BlockShape) normOut() tensor.DType {
	if s.PostNorm {
		return tensor.Float32
	}
	return s.Activations
}

// BlockSizes are all the buffers of one transformer block and its layers
// for b sequences of t tokens, named by layer: "r", "ln_1.out",
// "attn.att", "attn.c_attn.out_local", "mlp.c_proj.out". Under sequence
// parallelism the block's own buffers, the layer norms' and the
// row-parallel outputs hold this rank's t/tp positions, while attention
// and the MLP inside work on the full sequence (gathered into the
// region's shared buffers, SequenceParallelSizes), and the column-parallel
// layers keep no input gradient of their own. With full recomputation
// every buffer but the block's out is Scratch, shared by the blocks.
func BlockSizes(s BlockShape, b, t int) Sizes {
	tp, c := max(s.TP, 1), s.Dim
	hidden := s.Hidden
	if hidden == 0 {
		hidden = 4 * c
	}
	tl := t
	if s.SP {
		tl = t / tp
	}
	var z, layers Sizes
	full := s.Recompute == RecomputeFull
	norms := s.normOut()
	z.add("", blockOwnSizes(b, tl, c, full, norms, s.PostNorm))
	layers.add("ln_1.", LayerNormSizes(b, tl, c, norms))
	layers.add("attn.", attentionCoreSizes(b, t, s.Heads/tp, c/tp, s.Recompute == RecomputeSelective, s.FusedAttention, s.Activations))
	layers.add("attn.c_attn.", ColumnSizes(LinearShape{In: c, Out: 3 * c, TP: tp, SP: s.SP, OutDType: s.Activations}, b, t))
	layers.add("attn.c_proj.", RowSizes(LinearShape{In: c, Out: c, TP: tp, SP: s.SP, InputIsParallel: true, TransientOut: true, GradDType: ProjGradDType(s.Activations, norms)}, b, t))
	layers.add("ln_2.", LayerNormSizes(b, tl, c, norms))
	layers.add("mlp.", mlpCoreSizes(b, t, hidden/tp, s.Activations))
	layers.add("mlp.c_fc.", ColumnSizes(LinearShape{In: c, Out: hidden, TP: tp, SP: s.SP, OutDType: s.Activations}, b, t))
	layers.add("mlp.c_proj.", RowSizes(LinearShape{In: hidden, Out: c, TP: tp, SP: s.SP, InputIsParallel: true, TransientOut: true, GradDType: ProjGradDType(s.Activations, norms)}, b, t))
	if full {
		layers = Sizes{Scratch: append(layers.Saved, layers.Scratch...)}
	}
	z.add("", layers)
	return z
}

// EmbeddingSizes are the buffers of a VocabParallelEmbedding or a
// PositionEmbedding for b sequences of t tokens of width c (this rank's t
// positions under sequence parallelism): out (b,t,c), stored as the
// layer's Out, saved (a Shadow has its own; their backward needs none).
func EmbeddingSizes(b, t, c int, out tensor.DType) Sizes {
	return Sizes{Saved: Buffers{buf("out", b, t, c).as(out)}}
}

// CrossEntropySizes are a VocabParallelCrossEntropy's buffers for n rows
// of logits: the row maxima row_max (n), sums (2n: the exp sums then the
// target logits) and the per-row losses (n), all read by Backward or the
// caller after Forward.
func CrossEntropySizes(n int) Sizes {
	return Sizes{Saved: Buffers{buf("row_max", n), buf("sums", 2*n), buf("losses", n)}}
}
