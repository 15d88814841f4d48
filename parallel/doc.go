// Package parallel lays ranks out on a pipeline x data-parallel x
// tensor-parallel mesh and provides the Megatron-LM tensor-parallel layers
// (column- and row-parallel linear, vocab-parallel embedding and
// cross-entropy, self-attention, MLP, transformer block), each with an
// explicit Forward and Backward, and the 1F1B pipeline schedule
// (OneFOneB) by which a stage orders its micro-batches' passes.
//
// Conventions, shared by every layer:
//
//   - A layer is built on one tensor.Device and the tensor-parallel
//     communicator of its rank (Mesh.TP); a nil communicator is the
//     unsharded layer (tp = 1, no communication).
//   - Weights are stored (out, in), as PyTorch's nn.Linear and llm.c. A
//     column-parallel weight is split along dim 0, a row-parallel one along
//     dim 1; Param.Shard says which, so that the optimizer, grad-norm
//     clipping and checkpoints can treat every parameter alike.
//   - Every parameter's full tensor is drawn from (seed, name) and then cut
//     (InitFull, Shard.Take), so tp = 1 and tp = N start from the same
//     weights. Padded vocabulary rows start at zero and their logits are
//     masked, so the loss does not depend on the padding either.
//   - Forward returns a tensor owned by the layer, valid until its next
//     Forward (or until a fused kernel writes over it in place: the loss's
//     BackwardInPlace turns the head's logits into their gradient, the MLP
//     adds c_fc's deferred bias into its output); the layer keeps a
//     reference to its input for Backward, so the input must not change in
//     between. Activation buffers are allocated on
//     the first Forward of a batch shape and reused; the scratch that only
//     Backward uses, on its first Backward. Each layer allocates exactly
//     the buffers its size table lists (BlockSizes, ColumnSizes and the
//     others in sizes.go, SequenceParallelSizes), the table train/plan
//     sums to predict a rank's memory.
//   - Shadow makes a copy of a layer that shares its parameters (and
//     their gradients) and its backward scratch but keeps its own saved
//     activations: a pipeline stage holds one per micro-batch in flight
//     and runs their Forward and Backward interleaved.
//   - Backward accumulates (+=) into the input gradient it is given and into
//     the parameters' Grad, like the tensor package's kernels: zero the
//     gradients (ZeroGrads) before a step, or mark them stale
//     (MarkGradsStale) so that the next Backward overwrites them
//     (weight-gradient GEMMs with beta 0, no pass over the gradient memory)
//     and zero those no Backward wrote (ZeroStaleGrads) before reading
//     them. A layer whose backward ends in an
//     all-reduce (the f operator) reduces its own contribution before adding
//     it, so accumulation never sums a residual gradient tp times.
//   - Per transformer block: exactly 2 all-reduces of (B,T,C) forward and 2
//     backward (BlockComm checks it).
//   - Sequence parallelism (SequenceParallel, Megatron-LM arXiv 2205.05198):
//     a model built with one splits the replicated region (layer norms,
//     residuals, position embedding) along the sequence, each rank holding
//     positions [r*T/tp, (r+1)*T/tp) of every sample as (B,T/tp,C); a block
//     then makes 2 all-gathers and 2 reduce-scatters forward, 4 and 2
//     backward (BlockCommSP checks it), and the layer-norm gradients are
//     summed once per step (ReduceGrads). The models have no dropout, so
//     the region holds no random state.
//
// Checks lists the equivalence checks (sharded layer against unsharded, at
// the tensor-parallel degree of the communicator they run on); go test runs
// them in-process and `hpcrun check` across processes.
package parallel
