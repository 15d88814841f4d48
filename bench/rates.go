package bench

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/hpcrun/hpcrun/internal/stats"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/plan"
)

// RateShapes are the GEMM shapes bench gemm measures for hpcrun plan: the
// products a step runs (plan.StepGemms: a block's four weight products
// forward, dX and dW, the attention's batched per-head products, the LM
// head's) for a GPT of width 256 (the small preset, 8 heads) over 256,
// 1024 and 4096 tokens, of width 768 (12 heads) over 256 tokens and of
// width 64 (the tiny preset, 4 heads) over 512, at tp 1 and 2, sequences
// of 128 (32 for the tiny); sorted by FLOPs, each once.
func RateShapes() ([]tensor.GemmShape, error) {
	type ref struct{ dim, heads, bsz, seq int }
	var out []tensor.GemmShape
	for _, r := range []ref{{256, 8, 2, 128}, {256, 8, 8, 128}, {256, 8, 32, 128}, {768, 12, 2, 128}, {64, 4, 16, 32}} {
		for _, tp := range []int{1, 2} {
			cfg := trainconfig.DefaultConfig()
			cfg.Model = "gpt"
			if err := cfg.ApplyPreset("small"); err != nil {
				return nil, err
			}
			cfg.Dim, cfg.Heads, cfg.BatchSize, cfg.Seq, cfg.NTasks, cfg.TP = r.dim, r.heads, r.bsz, r.seq, tp, tp
			vocab, _, err := data.PlanVocab(cfg)
			if err != nil {
				return nil, err
			}
			gs, err := plan.StepGemms(cfg, vocab)
			if err != nil {
				return nil, err
			}
			for _, g := range gs {
				g.Batch = max(g.Batch, 1)
				if !slices.Contains(out, g.GemmShape) {
					out = append(out, g.GemmShape)
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b tensor.GemmShape) int {
		switch {
		case a.Flops() < b.Flops():
			return -1
		case a.Flops() > b.Flops():
			return 1
		}
		return 0
	})
	return out, nil
}

// RateThreads are the thread counts the rates are measured at: 1, the
// powers of two below most, and most.
func RateThreads(most int) []int {
	var ts []int
	for t := 1; t < most; t *= 2 {
		ts = append(ts, t)
	}
	return append(ts, max(most, 1))
}

// streamElems is the floats of each buffer the bandwidth is measured on:
// 64 MiB.
const streamElems = 16 << 20

// Rates measures what hpcrun plan prices a CPU step by (plan.CPURates):
// each shape's GFLOP/s through the engine's own device (tensor.CPUDevice's
// Gemm and GemmStridedBatched, as the layers call them) and the bandwidth
// of its Add and AdamW kernels, at each of threads, the best of rounds
// runs of at least minTime each; with calibrate, the bandwidth a real
// step's elementwise kernels reach (elementwiseRate). It writes a line per
// thread count to w.
func Rates(w io.Writer, shapes []tensor.GemmShape, threads []int, rounds int, minTime time.Duration, calibrate bool) (*plan.CPURates, error) {
	defer tensor.SetGemmThreads(0)
	r := &plan.CPURates{Format: plan.RatesFormat, CPU: plan.CPUModel(), Kernel: tensor.GemmKernel(), Measured: time.Now().UTC()}
	dev := tensor.NewCPU()
	for _, t := range threads {
		tensor.SetGemmThreads(t)
		dev.SetThreads(t)
		start := time.Now()
		var rates []float64
		for _, g := range shapes {
			gf, err := timeDeviceGemm(dev, g, rounds, minTime)
			if err != nil {
				return nil, err
			}
			r.Gemms = append(r.Gemms, plan.GemmRate{GemmShape: g, Threads: t, GFlops: gf})
			rates = append(rates, gf)
		}
		s, err := timeStream(dev, t, rounds, minTime)
		if err != nil {
			return nil, err
		}
		r.Stream = append(r.Stream, s)
		if calibrate {
			i := len(r.Stream) - 1
			if r.Stream[i].ElemGBs, err = elementwiseRate(r, t); err != nil {
				return nil, err
			}
			s = r.Stream[i]
		}
		fmt.Fprintf(w, "%2d threads: %d shapes, %.1f to %.1f GFLOP/s (median %.1f); Add %.1f GB/s, AdamW %.1f GB/s, a step's elementwise kernels %.1f GB/s (%.0f s)\n",
			t, len(shapes), slices.Min(rates), slices.Max(rates), stats.Median(rates), s.AddGBs, s.AdamGBs, s.ElemGBs, time.Since(start).Seconds())
	}
	return r, nil
}

// timeDeviceGemm is the best GFLOP/s of rounds runs of g on dev, each of
// at least minTime, packed operands.
func timeDeviceGemm(dev *tensor.CPUDevice, g tensor.GemmShape, rounds int, minTime time.Duration) (float64, error) {
	batch := max(g.Batch, 1)
	a, err := dev.Alloc(batch * g.M * g.K)
	if err != nil {
		return 0, err
	}
	defer dev.Free(a)
	b, err := dev.Alloc(batch * g.K * g.N)
	if err != nil {
		return 0, err
	}
	defer dev.Free(b)
	c, err := dev.Alloc(batch * g.M * g.N)
	if err != nil {
		return 0, err
	}
	defer dev.Free(c)
	for i, x := range a.Host() {
		a.Host()[i] = float32(i%7)*0.1 - 0.3 + x
	}
	for i := range b.Host() {
		b.Host()[i] = float32(i%5)*0.1 - 0.2
	}
	lda, ldb := g.K, g.N
	if g.TransA {
		lda = g.M
	}
	if g.TransB {
		ldb = g.K
	}
	call := func() {
		if batch == 1 {
			dev.Gemm(g.TransA, g.TransB, g.M, g.N, g.K, 1, a, 0, lda, b, 0, ldb, 0, c, 0, g.N)
			return
		}
		dev.GemmStridedBatched(g.TransA, g.TransB, g.M, g.N, g.K, 1, a, 0, lda, g.M*g.K, b, 0, ldb, g.K*g.N, 0, c, 0, g.N, g.M*g.N, batch)
	}
	call() // warm caches and worker threads
	return bestRate(rounds, minTime, call, g.Flops()/1e9), nil
}

// bestRate is the best of rounds runs of f, each repeated for at least
// minTime, in units of per (per call) a second.
func bestRate(rounds int, minTime time.Duration, f func(), per float64) float64 {
	best := 0.0
	for range max(rounds, 1) {
		calls := 0
		start := time.Now()
		for time.Since(start) < minTime || calls == 0 {
			f()
			calls++
		}
		best = max(best, per*float64(calls)/time.Since(start).Seconds())
	}
	return best
}

// timeStream is the bandwidth of the engine's Add (out = a + b, 12 bytes
// an element) and AdamW (28 bytes an element) over 64 MiB buffers on t
// threads.
func timeStream(dev *tensor.CPUDevice, t, rounds int, minTime time.Duration) (plan.StreamRate, error) {
	var ts [4]*tensor.Tensor
	for i := range ts {
		x, err := dev.Alloc(streamElems)
		if err != nil {
			return plan.StreamRate{}, err
		}
		defer dev.Free(x)
		for j := range x.Host() {
			x.Host()[j] = 0.01
		}
		ts[i] = x
	}
	n := float64(streamElems)
	add := bestRate(rounds, minTime, func() { dev.Add(ts[0], ts[1], ts[2]) }, 12*n/1e9)
	step := 0
	p := tensor.AdamWParams{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	adam := bestRate(rounds, minTime, func() {
		step++
		p.Step = step
		dev.AdamW(ts[0], ts[1], ts[2], ts[3], nil, p, nil)
	}, 28*n/1e9)
	return plan.StreamRate{Threads: t, AddGBs: add, AdamGBs: adam}, nil
}

// CalibrationCase is the step elementwiseRate times: GPT small (width
// 256, 4 blocks, byte vocabulary) at bsz 32, seq 128 on one rank, whose
// GEMMs RateShapes measures.
func CalibrationCase() trainconfig.Config {
	cfg := trainconfig.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("small"); err != nil {
		panic(err) // a preset of the table
	}
	cfg.BatchSize, cfg.Seq = 32, 128
	return cfg
}

// elementwiseRate is the bandwidth in GB/s a step of CalibrationCase's
// elementwise kernels reaches on t threads: the fastest of two steps
// (after one untimed), less its GEMMs at r's rates and its optimizer
// (plan.CalibrateElementwise).
func elementwiseRate(r *plan.CPURates, t int) (float64, error) {
	cfg := CalibrationCase()
	cpu := tensor.NewCPU()
	cpu.SetThreads(t)
	tensor.SetGemmThreads(t)
	st, err := train.BenchStep(cfg, cpu, 1, 2)
	if err != nil {
		return 0, err
	}
	return plan.CalibrateElementwise(cfg, 256, slices.Min(st.StepS), r, t)
}

// SaveRates keeps r for hpcrun plan (plan.SaveCPURates) and says where on w.
func SaveRates(w io.Writer, r *plan.CPURates) error {
	path, err := plan.SaveCPURates(r)
	if err != nil {
		return fmt.Errorf("bench gemm: keep the rates: %w", err)
	}
	_, err = fmt.Fprintf(w, "hpcrun plan will price each GEMM by its shape from these rates (%s, %s), kept in %s\n", r.CPU, r.Measured.Format(time.DateOnly), path)
	return err
}
