// Package train runs the training loop of a BERT-style classifier or a
// GPT-style language model under tensor and data parallelism: config, data
// (texts, IMDb CSVs, token files) and tokenizers, sampler, AdamW and its
// schedule, evaluation, per-rank metrics; it starts from pretrained weights
// (Hugging Face GPT-2 and BERT, llm.c, through train/interop) and samples
// text from a GPT.
package train
