package main

import (
	"strings"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/cmdline"
)

// flagMeanings is the one table of the flags users bring from other tools
// (Slurm, torchrun, Megatron-LM, nanoGPT, Hugging Face and PyTorch
// scripts) that hpcrun spells otherwise: an unknown flag found here is
// answered by what it means, where the command has the flags it means,
// before any spelling (--dp got -d, --dependency). Each line's names mean
// its first meaning whose flags the command has.
var flagMeanings = func() cmdline.Meanings {
	m := cmdline.Meanings{}
	add := func(names string, means ...cmdline.Meaning) {
		for _, n := range strings.Fields(names) {
			m[n] = means
		}
	}
	flag := func(name string) cmdline.Meaning { return cmdline.Meaning{Flags: []string{name}} }
	add("dp data-parallel data-parallel-size",
		cmdline.Meaning{Flags: []string{"ntasks", "tp", "pp"}, Note: "dp is not a flag: it comes from --ntasks / (--tp x --pp)"})
	add("tensor-parallel tensor-parallel-size tensor-model-parallel-size", flag("tp"))
	add("pipeline-parallel pipeline-parallel-size pipeline-model-parallel-size", flag("pp"))
	add("batch-size batch bs micro-batch-size per-device-train-batch-size", flag("bsz"))
	add("gradient-accumulation-steps", flag("grad-accum"))
	add("gpus gres", flag("gpus-per-node"))
	add("gpus-per-task", cmdline.Meaning{Flags: []string{"gpus-per-node"}, Note: "hpcrun runs one task a GPU: give a node's GPUs with --gpus-per-node"})
	add("world-size np", flag("ntasks"), flag("nproc"))
	add("nnodes", flag("nodes"))
	add("nproc-per-node", flag("ntasks-per-node"), flag("nproc"))
	add("learning-rate", flag("lr"))
	add("max-steps max-iters train-iters", flag("steps"))
	add("seq-len seq-length max-seq-len block-size", flag("seq"))
	add("num-layers n-layer", flag("layers"))
	add("hidden-size n-embd", flag("dim"))
	add("num-attention-heads n-head", flag("heads"))
	add("job-name J", flag("name"))
	return m
}()
