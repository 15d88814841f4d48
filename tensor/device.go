package tensor

// Device allocates tensors and runs kernels on them. The CPU device is
// always available; a CUDA device implements the same interface.
//
// Kernels are enqueued in order, as on one CUDA stream: on an asynchronous
// device they may return before they finish, and a kernel failure (rather
// than a programming error) is reported by the next Sync. Host slices passed
// to a kernel (ids, targets, masks) may be reused as soon as it returns.
// Every tensor argument must live on the device. Shape mismatches are
// programming errors and panic with a one-line message naming the argument.
//
// Gradient convention: backward kernels ACCUMULATE (+=) into every gradient
// output, for inputs and weights alike; callers zero gradients (Zero) before
// a backward pass. Forward kernels overwrite their outputs.
//
// Shapes: N is the number of rows (B*T tokens for activations), C the
// channels, V a vocabulary (slice), OC output channels. Kernels read the row
// length from the last dimension of the tensor named in the comment and the
// row count from Len()/rowlength, so (B,T,C) and (B*T,C) views both work.
type Device interface {
	// Name identifies the device, e.g. "cpu" or "cuda:0".
	Name() string

	// Alloc returns a zeroed Float32 tensor of the given shape, or an
	// error (a negative dimension, out of memory).
	Alloc(shape ...int) (*Tensor, error)
	// AllocAs is Alloc for elements stored as dt. A BFloat16 tensor goes
	// to Copy, CopyFromHost and CopyToHost (which convert, rounding to
	// nearest even on store); as an operand A, B or C of Gemm and
	// GemmStridedBatched (at any precision on the CPU, at BF16 on a GPU; a
	// C gets the float32 sums rounded once); as the output of the kernels
	// that say so (ActivationForward, BiasActivationForward, SwiGLUForward,
	// LayerNormForward, AddLayerNormForward, RMSNormForward,
	// AddRMSNormForward, AddBias: float32 values rounded); as the input of
	// ActivationForward, ActivationBackward, ActivationBackwardInPlace,
	// SwiGLUForward, SwiGLUBackward, LayerNormForward, LayerNormBackward,
	// RMSNormForward and RMSNormBackward (widened); as the sum of
	// AddLayerNormForward and AddRMSNormForward (rounded, and normalised
	// as stored) with their a too, as Add's out (rounded) and a where
	// out is (a residual stream), and as EmbeddingForward's out (the
	// table's rows rounded); as BiasActivationForward's
	// pre (both); as the gradients ActivationBackwardInPlace's dout,
	// BiasBackward's dout, SwiGLUBackward's dinp and dout together,
	// SoftmaxBackward's dinp, EmbeddingBackward's dout, and
	// LayerNormBackward's and RMSNormBackward's dinp (a residual stream's
	// gradient) and dout (a norm output's gradient) (widened; those
	// written rounded, an accumulation once); as
	// either or both of Axpy's y and x (y rounded once); as
	// RoPEForward's and RoPEBackward's x (widened, rotated, rounded); to
	// Copy2D between two BFloat16 tensors, to Fill and Zero; as
	// SoftmaxForward's out (rounded) and SoftmaxBackward's out (widened);
	// and as the logits of the cross-entropy kernels but
	// CrossEntropyBackward (widened; the in-place gradient rounded). Every
	// other kernel takes Float32 tensors only. A Device that wraps another
	// must override AllocAs where it overrides Alloc: layers allocate
	// through AllocAs.
	AllocAs(dt DType, shape ...int) (*Tensor, error)
	// Free releases the Buffer t views; t and its views must not be used
	// again. Freeing a freed buffer does nothing.
	Free(t *Tensor)
	// MemStats reports the bytes allocated now and the peak since the device
	// was made or since ResetPeak.
	MemStats() MemStats
	// ResetPeak sets the peak to the current allocation.
	ResetPeak()
	// Sync waits for enqueued work and returns the first error a kernel hit
	// since the last Sync.
	Sync() error

	// CopyFromHost copies src into dst; len(src) == dst.Len().
	CopyFromHost(dst *Tensor, src []float32)
	// CopyToHost copies src into dst; len(dst) == src.Len(). It waits for
	// the work that writes src.
	CopyToHost(dst []float32, src *Tensor)
	// Copy copies src into dst (same Len, both on this device; they may
	// not overlap), converting when their dtypes differ.
	Copy(dst, src *Tensor)
	// Copy2D copies a (rows,cols) block between row-major layouts, as
	// cudaMemcpy2D: dst[dstOff+i*ldDst+j] = src[srcOff+i*ldSrc+j] (columns of
	// a sharded activation, for example). The blocks may not overlap.
	Copy2D(dst *Tensor, dstOff, ldDst int, src *Tensor, srcOff, ldSrc, rows, cols int)
	// Axpy2D is the accumulating block form:
	// dst[dstOff+i*ldDst+j] += alpha*src[srcOff+i*ldSrc+j].
	Axpy2D(dst *Tensor, dstOff, ldDst int, alpha float32, src *Tensor, srcOff, ldSrc, rows, cols int)
	// Zero sets every element of t to 0; t may be bfloat16.
	Zero(t *Tensor)
	// Fill sets every element of t to v; a bfloat16 t gets v rounded.
	Fill(t *Tensor, v float32)

	// Gemm computes C = alpha*op(A)*op(B) + beta*C on row-major matrices
	// that start aOff, bOff, cOff elements into the tensors a, b, c, with
	// leading dimensions lda, ldb, ldc; op(A) is (m,k), op(B) is (k,n), C is
	// (m,n). The layout rules are Sgemm's. beta == 0 ignores C's contents.
	Gemm(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda int, b *Tensor, bOff, ldb int, beta float32, c *Tensor, cOff, ldc int)
	// GemmStridedBatched is batch Gemms whose i-th matrices start i*stride
	// elements after the first (stride 0 shares one matrix), as in
	// SgemmStridedBatched. A and B matrices may interleave, so the heads of
	// a (B,T,3C) qkv tensor are read in place (lda 3C, stride hs). The C
	// matrices must not overlap: disjoint blocks (strideC >= (m-1)*ldc+n),
	// or side by side within rows (n <= strideC, (batch-1)*strideC+n <= ldc),
	// so per-head outputs are written into a (B,T,C) row in place
	// (AttentionForward shows both).
	GemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a *Tensor, aOff, lda, strideA int, b *Tensor, bOff, ldb, strideB int, beta float32, c *Tensor, cOff, ldc, strideC, batch int)

	// EmbeddingForward looks rows up in an embedding table that holds the
	// vocabulary slice [vocabStart, vocabStart+V): out[i] = table[ids[i]-vocabStart]
	// when ids[i] is in the slice, zeros otherwise (vocab-parallel embedding;
	// vocabStart is 0 and every id in range when unsharded).
	// out is (N,C), ids is (N), table is (V,C).
	EmbeddingForward(out *Tensor, ids []int32, table *Tensor, vocabStart int)
	// EmbeddingBackward scatter-adds dout into the table gradient:
	// dtable[ids[i]-vocabStart] += dout[i] for ids in the slice.
	// dtable is (V,C), dout is (N,C), ids is (N).
	EmbeddingBackward(dtable, dout *Tensor, ids []int32, vocabStart int)

	// LayerNormForward normalizes each row over C and saves the statistics
	// for the backward: out = (inp-mean)*rstd*weight + bias, with
	// rstd = 1/sqrt(var+eps) (biased variance).
	// out, inp are (N,C); mean, rstd are (N); weight, bias are (C). out
	// may be BFloat16 (the float32 values rounded), and inp (widened).
	LayerNormForward(out, mean, rstd, inp, weight, bias *Tensor, eps float32)
	// AddLayerNormForward is Add(sum, a, b) and then
	// LayerNormForward(out, mean, rstd, sum, weight, bias, eps) in one pass
	// over each row (a residual add and the layer norm after it), the same
	// bits. sum, a, b are (N,C). b is float32; sum may be BFloat16 (a + b
	// rounded, then normalised as stored), and a with it (widened). A
	// float32 sum may be a or b, a bfloat16 one only a.
	AddLayerNormForward(sum, out, mean, rstd, a, b, weight, bias *Tensor, eps float32)
	// LayerNormBackward accumulates into dinp (N,C), dweight (C), dbias (C)
	// from dout (N,C) and the forward's inp (which may be BFloat16),
	// weight, mean, rstd.
	LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd *Tensor)

	// RMSNormForward scales each row by the reciprocal of its root mean
	// square and saves it for the backward: out = inp*rstd*weight, with
	// rstd = 1/sqrt(mean(inp^2)+eps) (Llama's RMSNorm).
	// out, inp are (N,C); rstd is (N); weight is (C). out may be
	// BFloat16 (the float32 values rounded), and inp (widened).
	RMSNormForward(out, rstd, inp, weight *Tensor, eps float32)
	// AddRMSNormForward is Add(sum, a, b) and then RMSNormForward(out,
	// rstd, sum, weight, eps) in one pass over each row, the same bits.
	// sum, a, b are (N,C), as AddLayerNormForward's.
	AddRMSNormForward(sum, out, rstd, a, b, weight *Tensor, eps float32)
	// RMSNormBackward accumulates into dinp (N,C) and dweight (C) from dout
	// (N,C) and the forward's inp (which may be BFloat16), weight, rstd.
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd *Tensor)

	// RoPEForward rotates heads of x in place by their position (rotary
	// embeddings in Hugging Face's rotate_half layout): a head's channels j
	// and j+hd/2 are the pair rotated by angle pos*freq_j, and table
	// (positions,hd) holds cos(pos*freq_j) in its first hd/2 columns and
	// sin(pos*freq_j) in the rest. x is (N,W), W a multiple of hd; row i is
	// at position i mod seqLen; of each period consecutive heads of a row
	// the first rotated ones turn (the queries and keys of a fused Q,K,V
	// group), the rest stay.
	RoPEForward(x, table *Tensor, seqLen, period, rotated int)
	// RoPEBackward turns a gradient of RoPEForward's output into one of its
	// input, in place: the inverse rotation (a rotation's transpose). It
	// overwrites dx, unlike the accumulating backward kernels.
	RoPEBackward(dx, table *Tensor, seqLen, period, rotated int)

	// SwiGLUForward is out = silu(gate)*up with inp's rows [gate | up]:
	// silu(g) = g/(1+exp(-g)). out is (N,F), inp is (N,2F). Either may
	// be BFloat16 (inp widened, the float32 values rounded into out).
	SwiGLUForward(out, inp *Tensor)
	// SwiGLUBackward accumulates the gradient of SwiGLUForward into dinp
	// (N,2F), [dgate | dup], from dout (N,F) and the forward's inp (N,2F),
	// which may be BFloat16; dinp and dout may be BFloat16 both (widened,
	// the float32 sums rounded into dinp).
	SwiGLUBackward(dinp, inp, dout *Tensor)

	// ActivationForward is out = f(inp) elementwise. out, inp have the
	// same Len; out may be inp; either may be BFloat16 (inp widened, the
	// float32 values rounded into out).
	ActivationForward(f Activation, out, inp *Tensor)
	// ActivationBackward is dinp += f'(inp) * dout. dinp, inp, dout have
	// the same Len; inp may be BFloat16.
	ActivationBackward(f Activation, dinp, inp, dout *Tensor)
	// BiasActivationForward is AddBias(pre, bias) and then
	// ActivationForward(f, out, pre) in one pass (a linear layer's bias
	// fused with the activation after it): pre (N,OC) gets the bias added
	// in place, kept for the backward, and out = f(pre). pre and out may
	// be BFloat16 (pre widened, added to and rounded; f reads the rounded
	// value); bias is (OC).
	BiasActivationForward(f Activation, out, pre, bias *Tensor)
	// ActivationBackwardInPlace is dout = f'(inp) * dout, overwriting dout:
	// ActivationBackward into a zeroed gradient, without one. dout and inp
	// have the same Len; either may be BFloat16 (a bfloat16 dout widened,
	// the float32 product rounded into it).
	ActivationBackwardInPlace(f Activation, dout, inp *Tensor)

	// SoftmaxForward is a row softmax of scale*inp with masked entries set to
	// 0 (a row with every key masked is all zeros). inp and out are
	// (B,...,Tq,Tk): rows of Tk keys. causal masks key j > i+(Tk-Tq) in query
	// row i. keyValid, when not nil, is (B,Tk) and masks the keys where it is
	// 0 in every row of batch item b (key padding). out may be inp, or
	// BFloat16 (the float32 probabilities rounded).
	SoftmaxForward(out, inp *Tensor, scale float32, causal bool, keyValid []int32)
	// SoftmaxBackward is dinp += scale * out*(dout - rowsum(dout*out)), the
	// gradient with respect to the forward's inp (masked entries get 0 since
	// out is 0 there). dinp, dout, out are (B,...,Tq,Tk); out may be
	// BFloat16, and dinp (widened, added to and rounded).
	SoftmaxBackward(dinp, dout, out *Tensor, scale float32)

	// Add is out = a + b elementwise (residual add). out and a may be
	// BFloat16 together (a widened, the sum rounded); b is float32. A
	// float32 out may be a or b, a bfloat16 one only a.
	Add(out, a, b *Tensor)
	// Axpy is y += alpha*x elementwise (residual backward with alpha 1).
	Axpy(y *Tensor, alpha float32, x *Tensor)
	// Scale is x *= alpha elementwise.
	Scale(x *Tensor, alpha float32)
	// AddBias is out[i] += bias for every row i. out is (N,OC), bias is (OC).
	AddBias(out, bias *Tensor)
	// BiasBackward is dbias += column sums of dout. dbias is (OC), dout is
	// (N,OC), float32 or BFloat16 (widened, summed in float32).
	BiasBackward(dbias, dout *Tensor)

	// Cross-entropy in pieces, so that a vocab-parallel caller can
	// all-reduce between them (MAX of rowMax, SUM of sumExp and of
	// targetLogit); unsharded callers run them in turn (see CrossEntropy).
	// logits is (N,V) and holds the vocabulary slice [vocabStart,
	// vocabStart+V); targets is (N) of global ids, negative ones ignored.
	// All but CrossEntropyBackward accept bfloat16 logits (an LM head's
	// output under bf16 compute): the kernels work in float32 on the
	// widened values, the bits of the same kernel on float32 logits of
	// those values.

	// CrossEntropyRowMax is rowMax[i] = max_j logits[i,j]. rowMax is (N).
	CrossEntropyRowMax(rowMax, logits *Tensor)
	// CrossEntropySumExp is sumExp[i] = sum_j exp(logits[i,j] - rowMax[i])
	// for a given (global) rowMax. sumExp, rowMax are (N).
	CrossEntropySumExp(sumExp, logits, rowMax *Tensor)
	// CrossEntropyTargetLogit is out[i] = logits[i, targets[i]-vocabStart]
	// when the target is in the slice, 0 otherwise. out is (N).
	CrossEntropyTargetLogit(out, logits *Tensor, targets []int32, vocabStart int)
	// CrossEntropyLoss is losses[i] = log(sumExp[i]) + rowMax[i] - targetLogit[i],
	// 0 where targets[i] < 0. All are (N).
	CrossEntropyLoss(losses, rowMax, sumExp, targetLogit *Tensor, targets []int32)
	// CrossEntropyBackward is dlogits[i,j] += dloss * (softmax(logits)[i,j] - onehot),
	// with softmax from the global rowMax and sumExp and onehot 1 at
	// targets[i]-vocabStart; rows with targets[i] < 0 are left alone. dloss
	// is dLoss/dlosses[i], e.g. 1/(number of counted targets) for a mean.
	// dlogits, logits are (N,V); rowMax, sumExp are (N).
	CrossEntropyBackward(dlogits, logits, rowMax, sumExp *Tensor, targets []int32, vocabStart int, dloss float32)

	// The fused classifier: an unsharded loss in one kernel, and the
	// gradient written over the logits, so that no (N,V) gradient is ever
	// allocated and the logits are read twice a step instead of five times.

	// CrossEntropyForward is the unsharded cross-entropy (vocabStart 0) in
	// one pass over each row: rowMax, sumExp and losses as
	// CrossEntropyRowMax, CrossEntropySumExp and CrossEntropyLoss with
	// CrossEntropyTargetLogit's target logit would give them, bit for bit
	// (a target outside [0,V) counts a target logit of 0, as there).
	// logits is (N,V); losses, rowMax, sumExp are (N).
	CrossEntropyForward(losses, rowMax, sumExp, logits *Tensor, targets []int32)
	// CrossEntropyBackwardInPlace overwrites the first cols columns of
	// logits with dloss * (softmax(logits) - onehot), the values
	// CrossEntropyBackward would add to a zeroed dlogits (0 on rows whose
	// target is negative). Columns from cols on are left as they are: a
	// padded head's masked logits, which its next forward does not write
	// again. logits is (N,V), cols in [0,V]; rowMax, sumExp are (N).
	// Bfloat16 logits get the float32 gradient rounded.
	CrossEntropyBackwardInPlace(logits, rowMax, sumExp *Tensor, targets []int32, vocabStart, cols int, dloss float32)

	// AdamW updates param with decoupled weight decay and bias correction:
	// g = grad*s; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
	// param -= LR*( (m/(1-b1^Step)) / (sqrt(v/(1-b2^Step))+Eps) + WeightDecay*param ),
	// with the gradient scale s read from scale[0] on the device (ClipNorm's
	// out[2]), or 1 when scale is nil. param, grad, m, v have the same Len.
	// half, when not nil, is param's BFloat16 copy: it gets the updated
	// values rounded, in the same pass (mixed precision's compute weights).
	AdamW(param, grad, m, v, half *Tensor, p AdamWParams, scale *Tensor)

	// The step's scalars, kept in device memory so that a GPU step waits
	// for the device once (a float64 in two float32 slots, low bits
	// first; scalars.go has the rules).

	// SumSquaresEach writes the sum of the squares of the elements of each
	// of ts, accumulated in float64 (0 for nil), into out as float64s, and
	// 0 into the rest of out: squared L2 norms for gradient clipping.
	SumSquaresEach(out *Tensor, ts ...*Tensor)
	// SumBlocks adds in's blocks of out.Len() floats (float64s) into out,
	// element by element, in block order.
	SumBlocks(out, in *Tensor)
	// ClipNorm sums sq's float64s in order and writes the square root (a
	// float64, out[0:2]) and the clip scale (out[2]: clip/(norm+1e-6) when clip > 0 and the norm exceeds it, else 1).
	ClipNorm(out, sq *Tensor, clip float64)
	// SumTo sets (or adds to) out[0] alpha times the float64 sum of x.
	SumTo(out *Tensor, alpha float32, accumulate bool, x *Tensor)
	// Fetch copies src into dst once every enqueued operation is done and
	// returns the first error since the last Sync: a step's one wait.
	Fetch(dst []float32, src *Tensor) error
	// HostSyncs counts the times the host waited for the device.
	HostSyncs() int64
}

// Activation is an elementwise function that ActivationForward and
// ActivationBackward apply; the zero value is GELU.
type Activation int

const (
	GELU Activation = iota // gelu, tanh approximation (GPT-2's)
	Tanh                   // tanh (BERT's pooler)
)

// MemStats is a device's memory accounting, in bytes.
type MemStats struct {
	Current int64 // allocated now
	Peak    int64 // most allocated at once since the device was made or ResetPeak
}

// MultiTensorAdamW is a device that updates many tensors in one launch
// (a GPU, where a launch a tensor costs more than the update of a small
// one).
type MultiTensorAdamW interface {
	// AdamWMany is AdamW on every params[i] with grads[i], ms[i], vs[i]
	// and halves[i] (halves may be nil, or hold nils) at hyper[i], which
	// may differ from each other in WeightDecay only; the results are
	// AdamW's, bit for bit.
	AdamWMany(params, grads, ms, vs, halves []*Tensor, hyper []AdamWParams, scale *Tensor)
}

// AdamWParams are the hyperparameters of one AdamW step.
type AdamWParams struct {
	LR          float32
	Beta1       float32
	Beta2       float32
	Eps         float32
	WeightDecay float32 // decoupled: applied to the parameter, not the gradient
	Step        int     // 1 for the first step; used for bias correction
}
