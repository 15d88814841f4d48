package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/hpcrun/hpcrun/bench"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

func benchStepCommand() *cli.Command {
	return &cli.Command{
		Name:  "step",
		Usage: "time one training step and its model GFLOP/s, against OpenBLAS sgemm on the step's own GEMMs (cpu) or as tokens/s and peak memory (cuda)",
		Description: "Times full training steps (forward, backward, AdamW) of a preset on the CPU at tp=1,\n" +
			"on random tokens. Model GFLOP/s counts the model's FLOPs as MFU does everywhere: a\n" +
			"token's 6 x parameters + attention's 12 x layers x seq x dim. The peer\n" +
			"replays every GEMM of one step through OpenBLAS sgemm in the same run (binaries\n" +
			"built with -tags openblas), so the ratio says how close the whole step comes to\n" +
			"the BLAS alone. Example: hpcrun bench step --model gpt2-124m --bsz 4 --seq 64\n\n" +
			"With --device cuda the step runs on a GPU and reports tokens/s and peak memory; the\n" +
			"peer is PyTorch eager on the same model and batch, run beside it by\n" +
			"bench/pytorch/gpt2_step.py (bench/pytorch/gpu-check.sh runs both).\n\n" +
			"With --nproc N (N > 1) N data-parallel ranks run in this process on the CPU, and the\n" +
			"step at --zero 2 or 3 is timed beside the same step at ZeRO-1, in the same run:\n" +
			"the step time and the engine peak a rank of each, and their ratios.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Value: "gpt2-124m", Usage: "preset to time (tiny, small, bert-base, bert-large, gpt2-124m, gpt2-350m, llama-tiny, smollm-135m, llama-1b)"},
			&cli.IntFlag{Name: "bsz", Value: 4, Usage: "batch size"},
			&cli.IntFlag{Name: "seq", Value: 64, Usage: "sequence length"},
			&cli.IntFlag{Name: "steps", Value: 3, Usage: "timed steps"},
			&cli.IntFlag{Name: "warmup", Value: 1, Usage: "untimed steps first"},
			&cli.IntFlag{Name: "threads", Usage: "threads for the engine and the peer (0 = GOMAXPROCS)"},
			&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu, or cuda (a GPU through the CUDA backend)"},
			&cli.IntFlag{Name: "gpu", Usage: "CUDA device ordinal (--device cuda)"},
			&cli.StringFlag{Name: "precision", Value: "fp32", Usage: "matmul precision: fp32, tf32 or bf16 (cuda); fp32, or bf16 timed beside fp32 in the same run (cpu)"},
			&cli.StringFlag{Name: "attention", Value: "auto", Usage: "auto, fused or unfused: the GPU's fused attention kernels at tf32 and bf16 (--device cuda; see train --attention)"},
			&cli.IntFlag{Name: "nproc", Value: 1, Usage: "data-parallel ranks in this process (cpu); above 1, the step at --zero against ZeRO-1's, same run"},
			&cli.IntFlag{Name: "zero", Value: 3, Usage: "the ZeRO stage set beside ZeRO-1's (--nproc above 1): 2 or 3"},
		},
		Action: runBenchStep,
	}
}

func runBenchStep(c *cli.Context) error {
	switch c.String("device") {
	case "cpu":
	case "cuda":
		return runBenchStepCUDA(c)
	default:
		return cli.Exit(fmt.Sprintf("--device %q: use cpu or cuda", c.String("device")), 2)
	}
	if peer, ok := tensor.OpenBLASPeer(); ok {
		if err := bench.ReexecWithOpenBLASCore(peer); err != nil {
			return err
		}
	}
	cfg, steps, err := benchStepConfig(c)
	if err != nil {
		return err
	}
	threads := c.Int("threads")
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	if dp := c.Int("nproc"); dp > 1 {
		res, err := bench.StepZeRO(cfg, dp, c.Int("zero"), max(threads/dp, 1), c.Int("warmup"), steps)
		if err != nil {
			return cli.Exit(err.Error(), 1)
		}
		return printBench(c, res)
	}
	switch cfg.Precision = c.String("precision"); cfg.Precision {
	case "fp32", "bf16":
	default:
		return cli.Exit(fmt.Sprintf("--precision %q on the cpu: use fp32, or bf16 (the weights' bfloat16 copies, timed beside fp32)", cfg.Precision), 2)
	}
	res, err := bench.Step(cfg, threads, c.Int("warmup"), steps)
	if err != nil {
		return err
	}
	return printBench(c, res)
}

// printBench prints a benchmark's result, as JSON under --json.
func printBench(c *cli.Context, res interface{ WriteText(io.Writer) }) error {
	if c.Bool("json") {
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(out))
		return nil
	}
	res.WriteText(os.Stdout)
	return nil
}

// benchStepConfig is the model of --model at --bsz and --seq, and the
// steps to time.
func benchStepConfig(c *cli.Context) (trainconfig.Config, int, error) {
	cfg := trainconfig.DefaultConfig()
	if err := cfg.ApplyPreset(c.String("model")); err != nil {
		return cfg, 0, cli.Exit(err.Error(), 2)
	}
	cfg.BatchSize, cfg.Seq, cfg.Attention = c.Int("bsz"), c.Int("seq"), c.String("attention")
	if err := cfg.Validate(); err != nil {
		return cfg, 0, cli.Exit(err.Error(), 2)
	}
	steps := c.Int("steps")
	if steps < 1 || c.Int("warmup") < 0 {
		return cfg, 0, cli.Exit("--steps must be at least 1 and --warmup not negative", 2)
	}
	return cfg, steps, nil
}

// runBenchStepCUDA times training steps on a GPU: tokens/s, model TFLOP/s
// and peak memory, to set beside PyTorch's numbers for the same step.
func runBenchStepCUDA(c *cli.Context) error {
	cfg, steps, err := benchStepConfig(c)
	if err != nil {
		return err
	}
	prec, err := tensor.ParsePrecision(c.String("precision"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if ok, why := cuda.Available(); !ok {
		return cli.Exit("bench step --device cuda: "+why, 1)
	}
	d, err := cuda.Open(c.Int("gpu"))
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	defer d.Close()
	res, err := bench.StepCUDA(cfg, d, prec, c.Int("warmup"), steps)
	if err != nil {
		return err
	}
	if c.Bool("json") {
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(out))
		return nil
	}
	res.WriteText(os.Stdout)
	return nil
}
