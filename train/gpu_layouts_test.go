package train

import (
	"context"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train/data"
)

// On one GPU, the layouts of the memory-saving and pipeline parallelism
// train as on the CPU (loss curves over 10 steps within curveTolerance:
// ten times the spread that reordering the CPU's GEMM sums causes in the
// same run, at least 1e-6; see tolerance_test.go): every rank a
// device of its own on GPU 0, the collectives and the pipeline's
// transfers host-staged between them (in-process, not NCCL, which puts
// one rank on a GPU). It runs the CUDA kernels of sequence parallelism,
// ZeRO-1's sharded update and a pipeline's stage copies where one GPU is
// all there is; the NCCL paths need two (the TwoRanks tests).
func TestGPULayoutsOnOneGPU(t *testing.T) {
	if ok, why := cuda.Available(); !ok {
		t.Skip("no CUDA here: " + why)
	}
	for _, l := range []struct {
		name                  string
		model                 string
		ntasks, tp, pp, micro int
		sp                    bool
		zero                  int
		kv                    int // a Llama's kv heads (fewer than tp: replicated)
	}{
		{"gpt tp2+sp", "gpt", 2, 2, 1, 0, true, 0, 0},
		{"gpt dp2+zero1", "gpt", 2, 1, 1, 0, false, 1, 0},
		{"bert dp2+zero1", "bert", 2, 1, 1, 0, false, 1, 0},
		{"gpt pp2", "gpt", 2, 1, 2, 4, false, 0, 0},
		{"bert pp2", "bert", 2, 1, 2, 3, false, 0, 0},
		{"gpt pp2xtp2+sp", "gpt", 4, 2, 2, 4, true, 0, 0},
		{"llama tp4 kv2 replicated", "llama", 4, 4, 1, 0, false, 0, 2},
		{"llama tp2xdp2+sp+zero1 kv1 replicated", "llama", 4, 2, 1, 0, true, 1, 1},
		{"llama tp2xdp2+sp+zero2 kv1 replicated", "llama", 4, 2, 1, 0, true, 2, 1},
		{"gpt pp2xdp2+zero3", "gpt", 4, 1, 2, 4, false, 3, 0},
	} {
		t.Run(l.name, func(t *testing.T) {
			cfg := smallConfig(l.model)
			if l.model != "bert" {
				cfg.Data = textFile(t)
			}
			if l.model == "llama" {
				cfg.KVHeads, cfg.FFN, cfg.GradClip = l.kv, 48, 0.5
			}
			cfg.Layers, cfg.Steps, cfg.CkptEvery, cfg.BatchSize = 4, 10, -1, 4
			cfg.NTasks, cfg.TP, cfg.PP, cfg.MicroBatches, cfg.SP, cfg.Zero = l.ntasks, l.tp, l.pp, l.micro, l.sp, l.zero
			ds, err := data.Prepare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cpuDir := t.TempDir()
			want, err := runRanks(t, cfg, ds, func(int) Options { return Options{Device: tensor.NewCPU(), RunDir: cpuDir} })
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			var mu sync.Mutex
			var got *Result
			err = nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
				dev, err := cuda.Open(0)
				if err != nil {
					return err
				}
				defer dev.Close()
				res, err := Run(context.Background(), cfg, c, Options{Data: ds, Device: dev, RunDir: dir})
				if c.Rank() == 0 {
					mu.Lock()
					got = res
					mu.Unlock()
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			closeCurve(t, "cuda "+l.name, got.Losses, "cpu", want[0].Losses, curveTolerance(t, cfg, ds, want[0].Losses))
		})
	}
}
