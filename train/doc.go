// Package train runs the training loop of a BERT-style classifier or a
// GPT-style language model under tensor and data parallelism: config, data and
// tokenizers, sampler, AdamW, evaluation, and per-rank metrics.
package train
