// Package metrics writes and reads the per-rank metrics files of a training
// run: runs/<execid>/metrics/rank-NNNNN.jsonl, one JSON object per line.
//
// Every line has a "type": "run" (once, first: the training config and where
// the rank runs), "step" (one per optimizer step), "eval" (one per
// validation), "gpu" (device memory and utilisation sampled through NVML) and
// "end" (once, last: status, error, wall time). The Writer writes each line
// with a single write call, so a crash leaves whole lines except perhaps a
// torn last one; the reader skips that torn line, reports corrupt lines with
// their file and line number without stopping, and ignores fields it does not
// know, so files written by older or newer versions still read.
//
// Summarize turns the ranks of one run into the figures hpcrun metrics shows:
// step time percentiles, throughput, share of time in communication, peak
// memory per rank, model FLOP/s, MFU and HFU. ReadSummary computes the same
// straight from the files in one streaming pass that keeps no steps (one
// float64 per step for the percentiles), so a run of a million steps sums up
// in a fraction of a second and a few tens of MB; ReadRun keeps every line,
// for the follower of hpcrun watch (ProgressOf: how far a run got, from its
// ranks' last lines) and for tests.
package metrics
