package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

func benchStepCommand() *cli.Command {
	return &cli.Command{
		Name:  "step",
		Usage: "time one training step and its model GFLOP/s, against OpenBLAS sgemm on the step's own GEMMs (cpu) or as tokens/s and peak memory (cuda)",
		Description: "Times full training steps (forward, backward, AdamW) of a preset on the CPU at tp=1,\n" +
			"on random tokens. Model GFLOP/s counts 6 x parameters x tokens per step. The peer\n" +
			"replays every GEMM of one step through OpenBLAS sgemm in the same run (binaries\n" +
			"built with -tags openblas), so the ratio says how close the whole step comes to\n" +
			"the BLAS alone. Example: hpcrun bench step --model gpt2-124m --bsz 4 --seq 64\n\n" +
			"With --device cuda the step runs on a GPU and reports tokens/s and peak memory; the\n" +
			"peer is PyTorch eager on the same model and batch, run beside it by\n" +
			"bench/pytorch/gpt2_step.py (bench/pytorch/gpu-check.sh runs both).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Value: "gpt2-124m", Usage: "preset to time (tiny, small, bert-base, bert-large, gpt2-124m, gpt2-350m, llama-tiny, smollm-135m, llama-1b)"},
			&cli.IntFlag{Name: "bsz", Value: 4, Usage: "batch size"},
			&cli.IntFlag{Name: "seq", Value: 64, Usage: "sequence length"},
			&cli.IntFlag{Name: "steps", Value: 3, Usage: "timed steps"},
			&cli.IntFlag{Name: "warmup", Value: 1, Usage: "untimed steps first"},
			&cli.IntFlag{Name: "threads", Usage: "threads for the engine and the peer (0 = GOMAXPROCS)"},
			&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu, or cuda (a GPU through the CUDA backend)"},
			&cli.IntFlag{Name: "gpu", Usage: "CUDA device ordinal (--device cuda)"},
			&cli.StringFlag{Name: "precision", Value: "fp32", Usage: "CUDA matmul precision: fp32, tf32 or bf16 (--device cuda)"},
		},
		Action: runBenchStep,
	}
}

func gemmFLOPs(g tensor.GemmShape) float64 {
	return 2 * float64(g.M) * float64(g.N) * float64(g.K) * float64(g.Batch)
}

type benchStepResult struct {
	Model          string  `json:"model"`
	Params         int64   `json:"params"`
	Bsz            int     `json:"bsz"`
	Seq            int     `json:"seq"`
	Threads        int     `json:"threads"`
	StepS          float64 `json:"step_s"` // median
	ModelGFLOPS    float64 `json:"model_gflops"`
	GemmCalls      int     `json:"gemm_calls"`
	GemmGFLOP      float64 `json:"gemm_gflop_per_step"`
	EngineGemmS    float64 `json:"engine_gemm_s"`
	EngineGFLOPS   float64 `json:"engine_sgemm_gflops"`
	Peer           string  `json:"peer,omitempty"`
	PeerGemmS      float64 `json:"peer_gemm_s,omitempty"`
	PeerGFLOPS     float64 `json:"peer_sgemm_gflops,omitempty"`
	ModelOverPeer  float64 `json:"model_over_peer,omitempty"`
	Loss           float64 `json:"loss"`
	PeerAbsentWhy  string  `json:"peer_absent,omitempty"`
	StepsMeasured  int     `json:"steps"`
	StepSMin       float64 `json:"step_s_min"`
	StepSMax       float64 `json:"step_s_max"`
	ModelFLOPsStep float64 `json:"model_flop_per_step"`
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
		if err := reexecWithOpenBLASCore(peer); err != nil {
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
	tensor.SetGemmThreads(threads)
	cpu := tensor.NewCPU()
	cpu.SetThreads(threads)
	// One observed step gives the GEMM mix; then the timed steps.
	var gemms []tensor.GemmShape
	cpu.ObserveGemm(func(g tensor.GemmShape) { gemms = append(gemms, g) })
	if _, err := train.BenchStep(cfg, cpu, 0, 1); err != nil {
		return err
	}
	cpu.ObserveGemm(nil)
	t, err := train.BenchStep(cfg, cpu, c.Int("warmup"), steps)
	if err != nil {
		return err
	}
	sorted := slices.Clone(t.StepS)
	slices.Sort(sorted)
	res := benchStepResult{
		Model: cfg.Preset, Params: t.Params, Bsz: cfg.BatchSize, Seq: cfg.Seq, Threads: threads,
		StepS: sorted[len(sorted)/2], StepSMin: sorted[0], StepSMax: sorted[len(sorted)-1],
		StepsMeasured: len(sorted), Loss: t.Loss, GemmCalls: len(gemms),
	}
	res.ModelFLOPsStep = 6 * float64(t.Params) * float64(t.TokensPerStep)
	res.ModelGFLOPS = res.ModelFLOPsStep / res.StepS / 1e9
	for _, g := range gemms {
		res.GemmGFLOP += gemmFLOPs(g) / 1e9
	}
	res.EngineGemmS = replayGemms(gemms, tensor.Sgemm)
	res.EngineGFLOPS = res.GemmGFLOP / res.EngineGemmS
	if peer, ok := tensor.OpenBLASPeer(); ok {
		peer.SetThreads(threads)
		res.Peer = peer.Name
		res.PeerGemmS = replayGemms(gemms, peer.Sgemm)
		res.PeerGFLOPS = res.GemmGFLOP / res.PeerGemmS
		res.ModelOverPeer = res.ModelGFLOPS / res.PeerGFLOPS
	} else {
		res.PeerAbsentWhy = "this binary was built without -tags openblas (and cgo)"
	}
	if c.Bool("json") {
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(out))
		return nil
	}
	fmt.Printf("bench step: %s (%.1fM params), bsz %d x seq %d, tp 1, %d threads, cpu\n", res.Model, float64(res.Params)/1e6, res.Bsz, res.Seq, threads)
	fmt.Printf("step time          %.3f s median of %d (min %.3f, max %.3f); loss %.3f\n", res.StepS, res.StepsMeasured, res.StepSMin, res.StepSMax, res.Loss)
	fmt.Printf("model              %.1f GFLOP/step (6 x params x tokens) -> %.1f GFLOP/s\n", res.ModelFLOPsStep/1e9, res.ModelGFLOPS)
	fmt.Printf("step's GEMMs       %d calls, %.1f GFLOP; hpcrun Sgemm replays them at %.1f GFLOP/s\n", res.GemmCalls, res.GemmGFLOP, res.EngineGFLOPS)
	if res.Peer != "" {
		fmt.Printf("OpenBLAS sgemm     %.1f GFLOP/s on the same GEMMs, same run (%s)\n", res.PeerGFLOPS, res.Peer)
		fmt.Printf("model / OpenBLAS   %.2f (target >= 0.50)\n", res.ModelOverPeer)
	} else {
		fmt.Printf("OpenBLAS sgemm     absent: %s\n", res.PeerAbsentWhy)
	}
	return nil
}

// replayGemms runs every recorded GEMM through sgemm on random matrices
// (batched ones as a loop) and returns the seconds they took, the best of
// three passes.
func replayGemms(gemms []tensor.GemmShape, sgemm func(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)) float64 {
	maxA, maxB, maxC := 0, 0, 0
	for _, g := range gemms {
		maxA, maxB, maxC = max(maxA, g.M*g.K), max(maxB, g.K*g.N), max(maxC, g.M*g.N)
	}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = r.Float32() - 0.5
		}
		return s
	}
	a, b, cm := fill(maxA), fill(maxB), make([]float32, maxC)
	best := 0.0
	for pass := 0; pass < 3; pass++ {
		start := time.Now()
		for _, g := range gemms {
			lda, ldb := g.K, g.N
			if g.TransA {
				lda = g.M
			}
			if g.TransB {
				ldb = g.K
			}
			for i := 0; i < g.Batch; i++ {
				sgemm(g.TransA, g.TransB, g.M, g.N, g.K, 1, a, lda, b, ldb, 0, cm, g.N)
			}
		}
		if s := time.Since(start).Seconds(); pass == 0 || s < best {
			best = s
		}
	}
	if best == 0 {
		best = 1e-9
	}
	return best
}

type benchStepCUDAResult struct {
	Model         string  `json:"model"`
	Params        int64   `json:"params"`
	Bsz           int     `json:"bsz"`
	Seq           int     `json:"seq"`
	Device        string  `json:"device"`
	Precision     string  `json:"precision"`
	StepS         float64 `json:"step_s"` // median
	StepSMin      float64 `json:"step_s_min"`
	StepSMax      float64 `json:"step_s_max"`
	StepsMeasured int     `json:"steps"`
	TokensPerS    float64 `json:"tokens_per_s"`
	ModelTFLOPS   float64 `json:"model_tflops"`
	PeakBytes     int64   `json:"peak_bytes"`     // most bytes of live tensors
	ReservedBytes int64   `json:"reserved_bytes"` // held from the driver, cache included
	Workspace     int64   `json:"workspace_bytes"`
	Mallocs       int64   `json:"cumemalloc_calls"`
	Loss          float64 `json:"loss"`
}

// benchStepConfig is the model of --model at --bsz and --seq, and the
// steps to time.
func benchStepConfig(c *cli.Context) (trainconfig.Config, int, error) {
	cfg := trainconfig.DefaultConfig()
	if err := cfg.ApplyPreset(c.String("model")); err != nil {
		return cfg, 0, cli.Exit(err.Error(), 2)
	}
	cfg.BatchSize, cfg.Seq = c.Int("bsz"), c.Int("seq")
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
	prec, err := cuda.ParsePrecision(c.String("precision"))
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
	d.SetMatmulPrecision(prec)
	d.ResetPeak()
	t, err := train.BenchStep(cfg, d, max(c.Int("warmup"), 1), steps)
	if err != nil {
		return err
	}
	sorted := slices.Clone(t.StepS)
	slices.Sort(sorted)
	ms, as := d.MemStats(), d.AllocStats()
	res := benchStepCUDAResult{
		Model: cfg.Preset, Params: t.Params, Bsz: cfg.BatchSize, Seq: cfg.Seq,
		Device: d.Describe(), Precision: prec.String(),
		StepS: sorted[len(sorted)/2], StepSMin: sorted[0], StepSMax: sorted[len(sorted)-1], StepsMeasured: len(sorted),
		PeakBytes: ms.Peak, ReservedBytes: as.Reserved, Workspace: as.Workspace, Mallocs: as.Mallocs, Loss: t.Loss,
	}
	res.TokensPerS = float64(t.TokensPerStep) / res.StepS
	res.ModelTFLOPS = 6 * float64(t.Params) * float64(t.TokensPerStep) / res.StepS / 1e12
	if c.Bool("json") {
		out, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(out))
		return nil
	}
	fmt.Printf("bench step: %s (%.1fM params), bsz %d x seq %d, tp 1, %s, matmul %s\n", res.Model, float64(res.Params)/1e6, res.Bsz, res.Seq, res.Device, res.Precision)
	fmt.Printf("step time          %.4f s median of %d (min %.4f, max %.4f); loss %.3f\n", res.StepS, res.StepsMeasured, res.StepSMin, res.StepSMax, res.Loss)
	fmt.Printf("throughput         %.0f tokens/s; model %.1f TFLOP/s (6 x params x tokens)\n", res.TokensPerS, res.ModelTFLOPS)
	fmt.Printf("memory             peak %.0f MiB of tensors; %.0f MiB reserved, %.0f MiB kernel workspace; %d cuMemAlloc calls\n",
		float64(res.PeakBytes)/(1<<20), float64(res.ReservedBytes)/(1<<20), float64(res.Workspace)/(1<<20), res.Mallocs)
	fmt.Printf("peer               PyTorch eager on the same step: python3 bench/pytorch/gpt2_step.py --bsz %d --seq %d\n", res.Bsz, res.Seq)
	return nil
}
