// Package parallel lays ranks out on a tensor-parallel x data-parallel mesh and
// provides the Megatron-LM tensor-parallel layers (column- and row-parallel
// linear, vocab-parallel embedding and cross-entropy, self-attention, MLP,
// transformer block), each with an explicit Forward and Backward.
package parallel
