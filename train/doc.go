// Package train runs the training loop of a BERT-style classifier or a
// GPT- or Llama-style language model under tensor, data and pipeline
// parallelism: config, data (texts, IMDb CSVs, token files; tokenized by
// train/tokenizer), sampler, the optimizer (AdamW or ZeRO-1, the gradient
// norm) and its schedule, the one training step (step.go) for every device
// and layout, evaluation, per-rank metrics; it starts from pretrained
// weights (Hugging Face GPT-2, BERT and Llama, llm.c, through train/interop)
// and samples text from a causal LM.
package train
