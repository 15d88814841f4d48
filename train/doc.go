// Package train runs the training loop of a BERT-style classifier or a
// GPT- or Llama-style language model under tensor, data and pipeline
// parallelism: the models, the optimizer (AdamW or ZeRO stages 1 to 3, the gradient
// norm) and its schedule, the one training step (step.go) for every device
// and layout, the pipeline stage, evaluation, checkpoints, per-rank
// metrics; it trains on the data sets of train/data (texts, IMDb CSVs,
// token files; tokenized by train/tokenizer), batched by its sampler, starts
// from pretrained weights (Hugging Face GPT-2, BERT and Llama, llm.c,
// through train/interop) and samples text from a causal LM.
package train
