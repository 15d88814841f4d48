package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/hpcrun/hpcrun/internal/stats"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/tensor/cuda"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
)

// StepResult is hpcrun bench step on the CPU: the step time, the model's
// GFLOP/s, and the step's own GEMMs replayed through hpcrun's Sgemm and
// the OpenBLAS peer.
type StepResult struct {
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
	Precision      string  `json:"precision"`
	// At bf16, the same step at fp32 in the same run (median) and the bf16
	// step's time over it.
	FP32StepS float64 `json:"fp32_step_s,omitempty"`
	OverFP32  float64 `json:"bf16_over_fp32,omitempty"`
}

// Step times steps training steps (after warmup untimed) of cfg at tp 1
// on the CPU with threads threads, then replays the GEMMs of one step
// through tensor.Sgemm and, in a binary built with -tags openblas, through
// OpenBLAS's sgemm.
func Step(cfg trainconfig.Config, threads, warmup, steps int) (StepResult, error) {
	tensor.SetGemmThreads(threads)
	cpu := tensor.NewCPU()
	cpu.SetThreads(threads)
	// One observed step gives the GEMM mix; then the timed steps.
	var gemms []tensor.GemmShape
	cpu.ObserveGemm(func(g tensor.GemmShape) { gemms = append(gemms, g) })
	if _, err := train.BenchStep(cfg, cpu, 0, 1); err != nil {
		return StepResult{}, err
	}
	cpu.ObserveGemm(nil)
	t, err := train.BenchStep(cfg, cpu, warmup, steps)
	if err != nil {
		return StepResult{}, err
	}
	var fp32 []float64
	if cfg.Precision == "bf16" {
		// The products read bfloat16 copies of the weights, which AdamW
		// writes and the GEMMs widen as they pack them: the same step at
		// fp32 beside it, alternating (bf16, fp32, bf16, fp32), says what
		// that costs on a machine whose speed drifts.
		c := cfg
		c.Precision = "fp32"
		for round := range 2 {
			f, err := train.BenchStep(c, cpu, warmup, steps)
			if err != nil {
				return StepResult{}, err
			}
			fp32 = append(fp32, f.StepS...)
			if round == 0 {
				b, err := train.BenchStep(cfg, cpu, warmup, steps)
				if err != nil {
					return StepResult{}, err
				}
				t.StepS = append(t.StepS, b.StepS...)
			}
		}
	}
	sorted := slices.Clone(t.StepS)
	slices.Sort(sorted)
	res := StepResult{
		Model: cfg.Preset, Params: t.Params, Bsz: cfg.BatchSize, Seq: cfg.Seq, Threads: threads,
		StepS: stats.Median(sorted), StepSMin: sorted[0], StepSMax: sorted[len(sorted)-1],
		StepsMeasured: len(sorted), Loss: t.Loss, GemmCalls: len(gemms), Precision: cfg.Precision,
	}
	if len(fp32) > 0 {
		res.FP32StepS = stats.Median(slices.Sorted(slices.Values(fp32)))
		res.OverFP32 = res.StepS / res.FP32StepS
	}
	res.ModelFLOPsStep = t.FlopsPerToken * float64(t.TokensPerStep)
	res.ModelGFLOPS = res.ModelFLOPsStep / res.StepS / 1e9
	for _, g := range gemms {
		res.GemmGFLOP += g.Flops() / 1e9
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
	return res, nil
}

// WriteText prints the result as hpcrun bench step does.
func (res StepResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "bench step: %s (%.1fM params), bsz %d x seq %d, tp 1, %d threads, cpu\n", res.Model, float64(res.Params)/1e6, res.Bsz, res.Seq, res.Threads)
	fmt.Fprintf(w, "step time          %.3f s median of %d (min %.3f, max %.3f); loss %.3f; %s\n", res.StepS, res.StepsMeasured, res.StepSMin, res.StepSMax, res.Loss, res.Precision)
	if res.FP32StepS > 0 {
		fmt.Fprintf(w, "bf16 / fp32        %.2f (fp32's step %.3f s, same run; target <= 1)\n", res.OverFP32, res.FP32StepS)
	}
	fmt.Fprintf(w, "model              %.1f GFLOP/step (6 x params + attention's 12 x layers x seq x dim, a token) -> %.1f GFLOP/s\n", res.ModelFLOPsStep/1e9, res.ModelGFLOPS)
	fmt.Fprintf(w, "step's GEMMs       %d calls, %.1f GFLOP; hpcrun Sgemm replays them at %.1f GFLOP/s\n", res.GemmCalls, res.GemmGFLOP, res.EngineGFLOPS)
	if res.Peer != "" {
		fmt.Fprintf(w, "OpenBLAS sgemm     %.1f GFLOP/s on the same GEMMs, same run (%s)\n", res.PeerGFLOPS, res.Peer)
		fmt.Fprintf(w, "model / OpenBLAS   %.2f (target >= 0.50)\n", res.ModelOverPeer)
	} else {
		fmt.Fprintf(w, "OpenBLAS sgemm     absent: %s\n", res.PeerAbsentWhy)
	}
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
			for range max(g.Batch, 1) {
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

// StepCUDAResult is hpcrun bench step on a GPU: tokens/s, model TFLOP/s
// and peak memory, to set beside PyTorch's numbers for the same step.
type StepCUDAResult struct {
	Model         string  `json:"model"`
	Params        int64   `json:"params"`
	Bsz           int     `json:"bsz"`
	Seq           int     `json:"seq"`
	Device        string  `json:"device"`
	Precision     string  `json:"precision"`
	Attention     string  `json:"attention"` // fused or unfused, as the step ran it
	StepS         float64 `json:"step_s"`    // median
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

// StepCUDA times steps training steps (after at least one untimed) of cfg
// at tp 1 on d, at matmul precision prec.
func StepCUDA(cfg trainconfig.Config, d *cuda.Device, prec tensor.Precision, warmup, steps int) (StepCUDAResult, error) {
	cfg.Precision = prec.String() // the step sets the device's precision from its config
	d.ResetPeak()
	t, err := train.BenchStep(cfg, d, max(warmup, 1), steps)
	if err != nil {
		return StepCUDAResult{}, err
	}
	sorted := slices.Clone(t.StepS)
	slices.Sort(sorted)
	ms, as := d.MemStats(), d.AllocStats()
	attention := "unfused"
	if fused, _, _ := train.AttentionFused(cfg, d); fused {
		attention = "fused"
	}
	res := StepCUDAResult{
		Model: cfg.Preset, Params: t.Params, Bsz: cfg.BatchSize, Seq: cfg.Seq,
		Device: d.Describe(), Precision: prec.String(), Attention: attention,
		StepS: stats.Median(sorted), StepSMin: sorted[0], StepSMax: sorted[len(sorted)-1], StepsMeasured: len(sorted),
		PeakBytes: ms.Peak, ReservedBytes: as.Reserved, Workspace: as.Workspace, Mallocs: as.Mallocs, Loss: t.Loss,
	}
	res.TokensPerS = float64(t.TokensPerStep) / res.StepS
	res.ModelTFLOPS = t.FlopsPerToken * res.TokensPerS / 1e12
	return res, nil
}

// WriteText prints the result as hpcrun bench step --device cuda does.
func (res StepCUDAResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "bench step: %s (%.1fM params), bsz %d x seq %d, tp 1, %s, matmul %s, attention %s\n", res.Model, float64(res.Params)/1e6, res.Bsz, res.Seq, res.Device, res.Precision, res.Attention)
	fmt.Fprintf(w, "step time          %.4f s median of %d (min %.4f, max %.4f); loss %.3f\n", res.StepS, res.StepsMeasured, res.StepSMin, res.StepSMax, res.Loss)
	fmt.Fprintf(w, "throughput         %.0f tokens/s; model %.1f TFLOP/s (6 x params + attention's 12 x layers x seq x dim, a token)\n", res.TokensPerS, res.ModelTFLOPS)
	fmt.Fprintf(w, "memory             peak %.0f MiB of tensors; %.0f MiB reserved, %.0f MiB kernel workspace; %d cuMemAlloc calls\n",
		float64(res.PeakBytes)/(1<<20), float64(res.ReservedBytes)/(1<<20), float64(res.Workspace)/(1<<20), res.Mallocs)
	fmt.Fprintf(w, "peer               PyTorch eager on the same step: python3 bench/pytorch/gpt2_step.py --bsz %d --seq %d\n", res.Bsz, res.Seq)
}

// StepZeROResult is hpcrun bench step --nproc N --zero S on the CPU: the same
// data-parallel step at ZeRO-1 and at stage S, timed in the same run.
type StepZeROResult struct {
	Model   string         `json:"model"`
	Params  int64          `json:"params"`
	Bsz     int            `json:"bsz"`
	Seq     int            `json:"seq"`
	DP      int            `json:"dp"`
	Threads int            `json:"threads_per_rank"`
	Stages  []ZeROStepTime `json:"stages"` // ZeRO-1 first
	// StepRatio and MemRatio are stage S's median step time and engine
	// peak over ZeRO-1's.
	StepRatio float64 `json:"step_ratio"`
	MemRatio  float64 `json:"mem_ratio"`
}

// ZeROStepTime is one stage's timing: rank 0's median step and
// communication seconds, and its engine peak.
type ZeROStepTime struct {
	Zero    int     `json:"zero"`
	StepS   float64 `json:"step_s"`
	CommS   float64 `json:"comm_s"`
	MemPeak int64   `json:"mem_peak_bytes"`
	Loss    float64 `json:"loss"`
}

// StepZeRO times cfg at dp data-parallel ranks of this process (tp 1,
// threads threads a rank) at ZeRO-1 and at stage zero, alternating two
// rounds of each so that both see the same machine.
func StepZeRO(cfg trainconfig.Config, dp, zero, threads, warmup, steps int) (StepZeROResult, error) {
	if dp < 2 || zero < 2 || zero > 3 {
		return StepZeROResult{}, fmt.Errorf("bench step: --nproc %d --zero %d: compare ZeRO-2 or -3 with ZeRO-1 at 2 data-parallel ranks or more", dp, zero)
	}
	tensor.SetGemmThreads(threads)
	res := StepZeROResult{Model: cfg.Preset, Bsz: cfg.BatchSize, Seq: cfg.Seq, DP: dp, Threads: threads}
	times := map[int][]float64{}
	comms := map[int][]float64{}
	for round := 0; round < 2; round++ {
		for _, z := range []int{1, zero} {
			c := cfg
			c.Zero = z
			t, err := train.BenchStepDP(c, dp, threads, warmup, steps)
			if err != nil {
				return res, err
			}
			times[z], comms[z] = append(times[z], t.StepS...), append(comms[z], t.CommS...)
			if round == 1 {
				res.Params = t.Params
				res.Stages = append(res.Stages, ZeROStepTime{Zero: z, MemPeak: t.MemPeak, Loss: t.Loss})
			}
		}
	}
	for i := range res.Stages {
		s := &res.Stages[i]
		ts, cs := slices.Clone(times[s.Zero]), slices.Clone(comms[s.Zero])
		slices.Sort(ts)
		slices.Sort(cs)
		s.StepS, s.CommS = stats.Median(ts), stats.Median(cs)
	}
	one, other := res.Stages[0], res.Stages[1]
	res.StepRatio, res.MemRatio = other.StepS/one.StepS, float64(other.MemPeak)/float64(one.MemPeak)
	return res, nil
}

// WriteText prints the result as hpcrun bench step --nproc does.
func (res StepZeROResult) WriteText(w io.Writer) {
	fmt.Fprintf(w, "bench step: %s (%.1fM params), bsz %d x seq %d a rank, dp %d in one process, %d threads a rank, cpu\n",
		res.Model, float64(res.Params)/1e6, res.Bsz, res.Seq, res.DP, res.Threads)
	for _, s := range res.Stages {
		fmt.Fprintf(w, "zero %d   step %.3f s (comm %.3f s), median; engine peak %.1f MB a rank; loss %.4f\n", s.Zero, s.StepS, s.CommS, float64(s.MemPeak)/1e6, s.Loss)
	}
	fmt.Fprintf(w, "zero %d / zero 1: step x%.2f, memory x%.2f (same run)\n", res.Stages[1].Zero, res.StepRatio, res.MemRatio)
}
