// Package ckpt reads and writes training checkpoints: safetensors files (a
// writer and a validating reader of the format), the checkpoint directory
// layout (step-NNNNNN/ with one model shard per tensor-parallel rank, the
// optimizer state and state.json; a "latest" file moved last), atomic
// commit and pruning, merging shards into full tensors, resharding them for
// another tensor-parallel degree, and exporting GPT checkpoints with Hugging
// Face GPT-2 names and layouts.
package ckpt
