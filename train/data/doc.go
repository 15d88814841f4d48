// Package data is what a run trains and validates on: the data sets
// (Dataset, gathered into a Batch a micro-step) that Prepare makes from a
// run's config, every rank the same; their sources (IMDb CSVs, plain texts,
// the built-in synthetic sets, and llm.c's token files, memory-mapped and
// read as one stream, which TokenizeFiles and WriteTokenFile make); the
// vocabulary the model embeds (ModelVocab, PlanVocab); and the Sampler that
// splits a data set among the data-parallel ranks. Texts are tokenized by
// train/tokenizer; train runs the model on the batches.
package data
