// Package tensor is the compute engine under the parallel layers: tensors of
// float32 (and bfloat16 operands) on a Device (CPU always; CUDA when its libraries load), GEMM and the
// kernels a transformer's forward and backward passes need, with memory
// accounting. It knows nothing of parallelism.
//
// # Tensors
//
// A Tensor is a contiguous row-major view (shape and element offset) into a
// Buffer, one allocation of a Device. Allocate once, carve named views with
// View and Reshape (llm.c style: all parameters in one tensor, one view per
// weight), and free the allocation with Device.Free. Storage is opaque:
// Host gives the elements on the CPU device only, Ptr a raw device address
// (for NCCL) on the others.
//
// Elements are float32, or bfloat16 in a tensor from AllocAs(BFloat16, ...)
// (2 bytes, HostBF16 on the CPU): copies round into them to nearest even,
// GEMMs read them as operands (the bfloat16 copies of the weights that
// mixed precision keeps beside the float32 masters, bf16 activations) and
// the kernels Device.AllocAs lists read (widened) or write (rounded)
// them; every kernel computes in float32.
//
// # Kernels
//
// Layers call forward/backward pairs on a Device, llm.c style:
//
//	d.LayerNormForward(out, mean, rstd, inp, weight, bias, 1e-5)  // inp is (B,T,C)
//	d.LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd)
//
// Gradient convention: backward kernels ACCUMULATE (+=) into every gradient
// output, inputs and weights alike; callers zero gradients (Device.Zero)
// before a backward pass. Forward kernels overwrite their outputs. Integer
// inputs (token ids, targets, key-padding masks) are []int32 on the host.
//
// Shapes are in the comments, with N rows (B*T tokens), C channels, V a
// vocabulary slice, OC output channels; a kernel reads the row length from a
// tensor's last dimension, so (B,T,C) and (B*T,C) views are interchangeable.
// Wrong shapes are programming errors: they panic with a one-line message
// naming the argument, the same on every device because each backend runs
// check.X (tensor/internal/check) before its kernel X. Device failures (out
// of memory, a failed CUDA launch) come back as errors from Alloc and Sync.
//
// EmbeddingForward with row indices as ids is also a row gather (the [CLS]
// rows of a (B,T,C) activation: ids 0, T, 2T, ...), and EmbeddingBackward its
// scatter-add. LinearForward/LinearBackward (nn.Linear's (OC,C) weight),
// MatMul, AttentionForward/AttentionBackward (multi-head attention on a
// packed (B,T,3C) qkv) are built from Device calls and so work on every
// backend.
//
// # Vocab-parallel pieces
//
// EmbeddingForward/Backward take the vocabulary slice [vocabStart,
// vocabStart+V) a rank owns; ids outside it give zero rows and no gradient,
// so an all-reduce of the outputs completes the lookup. Cross-entropy comes
// in pieces for the same reason: CrossEntropyRowMax (all-reduce MAX),
// CrossEntropySumExp given the global max (all-reduce SUM),
// CrossEntropyTargetLogit (all-reduce SUM), CrossEntropyLoss, and
// CrossEntropyBackward, which is local. One rank's whole vocabulary takes
// the fused classifier instead: CrossEntropyForward (the pieces' results
// in one pass a row) and CrossEntropyBackwardInPlace, which writes the
// gradient over the logits (no (N,V) gradient buffer), sharded or not.
//
// # CPU
//
// The CPU device (NewCPU, Default) runs GEMM with Sgemm and the other
// kernels in Go, split over rows across a shared goroutine pool; the
// exp-heavy ones (GELU, softmax, cross-entropy) use AVX2+FMA loops where the
// CPU has them, and portable Go under the noasm build tag or HPCRUN_NOASM=1.
// Its kernels do not allocate in steady state.
package tensor
