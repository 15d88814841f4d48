package plan

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/spec"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// randomData is a data set of n samples of cfg's shape with random tokens
// below vocab, for a model that needs no tokenizer to run.
func randomData(cfg config.Config, vocab, n int) *data.Data {
	r := rand.New(rand.NewPCG(7, 1))
	T := cfg.Seq
	d := &data.Dataset{Seq: T, Tokens: make([]int32, n*T), Lengths: make([]int32, n)}
	if cfg.LM() {
		d.Targets = make([]int32, n*T)
	} else {
		d.Labels = make([]int32, n)
	}
	for i := range d.Tokens {
		d.Tokens[i] = int32(r.IntN(vocab))
		if d.Targets != nil {
			d.Targets[i] = int32(r.IntN(vocab))
		}
	}
	for i := range d.Lengths {
		d.Lengths[i] = int32(1 + r.IntN(T)) // padding for the classifier's mask
		if d.Labels != nil {
			d.Labels[i] = int32(i % 2)
		} else {
			d.Lengths[i] = int32(T)
		}
	}
	return &data.Data{Tokenizer: tokenizer.Byte{}, Vocab: vocab, Train: d, Val: d}
}

// measure trains one step of cfg (and its validation) on cfg.NTasks
// in-process ranks, each on its own CPU device, and returns the largest
// engine peak of a rank and the step's wall time.
func measure(t *testing.T, cfg config.Config, vocab int) (peak int64, wall time.Duration) {
	t.Helper()
	start := time.Now()
	return slices.Max(measureRanks(t, cfg, vocab)), time.Since(start)
}

// measureRanks is measure's engine peak of every rank.
func measureRanks(t *testing.T, cfg config.Config, vocab int) []int64 {
	t.Helper()
	ds := randomData(cfg, vocab, cfg.BatchSize*cfg.Micro()*cfg.DP())
	peaks := make([]int64, cfg.NTasks)
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		dev := tensor.NewCPU()
		_, err := train.Run(context.Background(), cfg, c, train.Options{Device: dev, Data: ds})
		peaks[c.Rank()] = dev.MemStats().Peak
		return err
	})
	if err != nil {
		t.Fatalf("%s %s pp %d tp %d ntasks %d bsz %d sp %v zero %d: %v", cfg.Preset, cfg.Model, cfg.PP, cfg.TP, cfg.NTasks, cfg.BatchSize, cfg.SP, cfg.Zero, err)
	}
	return peaks
}

// TestPeakMemoryMatchesEngine is the plan's accuracy goal: the predicted
// engine peak is within 10% of the engine's own count after a real step,
// for the presets that run in seconds on a CPU, both models, tp 1, 2 and
// 4, and bsz from 1 to 16 (1, 2, 4, 8, 16 for tiny; 1, 4, 16 for small,
// which costs 40 times more a token), plus a tp x dp job; and with
// sequence parallelism and ZeRO-1: tp2+sp, tp4+sp, dp2+zero1 and tp2 x
// dp2 + sp + zero1 on tiny and small, and dp3+zero1 on a wide model whose
// parameters fill two gradient buckets of sizes not divisible by 3. It logs
// the table (go test -v) with the step time beside the plan's, which is
// not asserted: the machine may be busy.
func TestPeakMemoryMatchesEngine(t *testing.T) {
	type point struct {
		preset, model string
		tp, dp, bsz   int
		sp            bool
		zero          int
		bf16          bool // precision bf16: the products' bfloat16 weight copies
		gradBF16      bool // grad_reduce bf16: a bfloat16 gradient bucket
	}
	var points []point
	for _, model := range []string{"bert", "gpt"} {
		for _, tp := range []int{1, 2, 4} {
			for _, bsz := range []int{1, 2, 4, 8, 16} {
				points = append(points, point{"tiny", model, tp, 1, bsz, false, 0, false, false})
			}
			for _, bsz := range []int{1, 4, 16} {
				points = append(points, point{"small", model, tp, 1, bsz, false, 0, false, false})
			}
		}
		points = append(points, point{"tiny", model, 2, 2, 8, false, 0, false, false})
	}
	for _, model := range []string{"bert", "gpt"} {
		points = append(points,
			point{"tiny", model, 2, 1, 1, true, 0, false, false}, point{"tiny", model, 2, 1, 8, true, 0, false, false}, point{"tiny", model, 4, 1, 4, true, 0, false, false},
			point{"small", model, 2, 1, 4, true, 0, false, false},
			point{"tiny", model, 1, 2, 4, false, 1, false, false}, point{"small", model, 1, 2, 1, false, 1, false, false},
			point{"tiny", model, 2, 2, 8, true, 1, false, false}, point{"small", model, 2, 2, 1, true, 1, false, false},
			point{"wide", model, 1, 3, 2, false, 1, false, false},
			point{"tiny", model, 1, 2, 4, false, 2, false, false}, point{"tiny", model, 2, 2, 8, true, 2, false, false},
			point{"wide", model, 1, 3, 2, false, 2, false, false},
			point{"tiny", model, 1, 2, 4, false, 3, false, false}, point{"tiny", model, 2, 2, 8, true, 3, false, false},
			point{"wide", model, 1, 3, 2, false, 3, false, false},
		)
	}
	// Llamas (grouped heads, SwiGLU, RMSNorm, rotary tables), tied and
	// untied ("llama-untied": llama-tiny with a head of its own).
	for _, preset := range []string{"llama-tiny", "llama-untied"} {
		points = append(points,
			point{preset, "llama", 1, 1, 1, false, 0, false, false}, point{preset, "llama", 1, 1, 4, false, 0, false, false}, point{preset, "llama", 2, 1, 8, false, 0, false, false},
			point{preset, "llama", 2, 1, 4, true, 0, false, false}, point{preset, "llama", 1, 2, 4, false, 1, false, false}, point{preset, "llama", 2, 2, 2, true, 1, false, false},
			// tp 4 over 2 kv heads: each replicated over 2 ranks.
			point{preset, "llama", 4, 1, 4, false, 0, false, false}, point{preset, "llama", 4, 1, 8, true, 0, false, false},
			point{preset, "llama", 2, 2, 2, true, 2, false, false}, point{preset, "llama", 2, 2, 2, true, 3, false, false},
		)
	}
	// At bf16 the weights the products read have bfloat16 copies: their
	// own, or under ZeRO-3 one the blocks share as they share values.
	points = append(points,
		point{"tiny", "gpt", 1, 1, 4, false, 0, true, false}, point{"tiny", "gpt", 2, 2, 8, true, 1, true, false},
		point{"tiny", "gpt", 1, 2, 4, false, 3, true, false}, point{"tiny", "bert", 2, 1, 4, false, 0, true, false},
		point{"llama-untied", "llama", 2, 2, 2, true, 2, true, false}, point{"llama-tiny", "llama", 2, 2, 2, true, 3, true, false},
	)
	// grad_reduce bf16: every bucket through a bfloat16 buffer.
	points = append(points,
		point{"tiny", "gpt", 1, 2, 4, false, 0, true, true}, point{"tiny", "bert", 2, 2, 8, true, 0, true, true},
		point{"llama-untied", "llama", 1, 2, 2, false, 0, true, true}, point{"wide", "gpt", 1, 3, 2, false, 0, true, true},
		// Under ZeRO the biggest bucket, padded, and its range in bfloat16.
		point{"tiny", "gpt", 1, 2, 4, false, 1, true, true}, point{"wide", "gpt", 1, 3, 2, false, 2, true, true},
		point{"llama-tiny", "llama", 2, 2, 2, true, 3, true, true}, point{"tiny", "bert", 2, 2, 8, true, 1, true, true},
	)
	if testing.Short() {
		var short []point
		for i := 0; i < len(points); i += 4 {
			short = append(short, points[i])
		}
		points = short
	}
	const vocab = 1000 // padded to 1024: the padding counts too
	dev := CPU(0, 0, 0, "")
	var table strings.Builder
	fmt.Fprintf(&table, "%-6s %-5s %3s %3s %4s %-10s %14s %14s %7s %10s %10s\n", "preset", "model", "tp", "dp", "bsz", "mode", "predicted B", "measured B", "err %", "step s", "plan s")
	for _, p := range points {
		cfg := config.DefaultConfig()
		cfg.Model = p.model
		if p.preset == "wide" {
			// Two layers of dim 512: 3.7 Mi and 3.2 Mi parameters in
			// train's 4 Mi buckets.
			cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.LR = 2, 512, 8, 16, 1e-3
		} else if p.preset == "llama-untied" {
			if err := cfg.ApplyPreset("llama-tiny"); err != nil {
				t.Fatal(err)
			}
			cfg.UntiedHead = true
		} else if err := cfg.ApplyPreset(p.preset); err != nil {
			t.Fatal(err)
		}
		cfg.TP, cfg.NTasks, cfg.BatchSize, cfg.SP, cfg.Zero = p.tp, p.tp*p.dp, p.bsz, p.sp, p.zero
		cfg.Steps, cfg.EvalSamples, cfg.Device = 1, p.bsz, "cpu"
		if p.bf16 {
			cfg.Precision = "bf16"
		}
		if p.gradBF16 {
			cfg.GradReduce = "bf16"
		}
		pl, err := New(Request{Config: cfg, Vocab: vocab, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		mode := ""
		if p.sp {
			mode += "+sp"
		}
		if p.zero > 0 {
			mode += fmt.Sprintf("+zero%d", p.zero)
		}
		if p.bf16 {
			mode += "+bf16"
		}
		if p.gradBF16 {
			mode += "+grad-bf16"
		}
		if (pl.Memory.SPBuffers > 0) != p.sp {
			t.Errorf("%s %s tp %d dp %d bsz %d%s: sp buffers %d B", p.preset, p.model, p.tp, p.dp, p.bsz, mode, pl.Memory.SPBuffers)
		}
		got, wall := measure(t, cfg, vocab)
		errPct := 100 * float64(pl.Memory.EnginePeak-got) / float64(got)
		fmt.Fprintf(&table, "%-6s %-5s %3d %3d %4d %-10s %14d %14d %7.2f %10.3f %10.3f\n", p.preset, p.model, p.tp, p.dp, p.bsz, mode, pl.Memory.EnginePeak, got, errPct, wall.Seconds(), pl.Time.StepS)
		switch {
		case math.Abs(errPct) > 10:
			t.Errorf("%s %s tp %d dp %d bsz %d%s: predicted peak %d B, the engine's %d B: %.1f%% off", p.preset, p.model, p.tp, p.dp, p.bsz, mode, pl.Memory.EnginePeak, got, errPct)
		case pl.Memory.EnginePeak != got:
			// Within the goal, but the CPU engine counts exactly the bytes
			// of its tensors and the plan follows its buffers one for one:
			// a difference is a buffer the plan misses.
			t.Errorf("%s %s tp %d dp %d bsz %d%s: predicted peak %d B, the engine's %d B: %+d B, not the exact count", p.preset, p.model, p.tp, p.dp, p.bsz, mode, pl.Memory.EnginePeak, got, pl.Memory.EnginePeak-got)
		}
	}
	t.Logf("engine peak per rank, predicted against measured (step s: one step and its validation, wall):\n%s", table.String())
}

// TestHFBERTPlan: arch hf's BERT (Hugging Face's post-LN layout, its own
// model in train) is planned as hpcrun's BERT, which its token-type
// table, embedding layer norm and pooler differ from by a few small
// tensors: within 0.1% of the engine's peak, at fp32 and bf16, since its
// layers share their scratch as the blocks do (before, each layer kept
// its own and the engine's peak was 20% over the plan's).
func TestHFBERTPlan(t *testing.T) {
	for _, prec := range []string{"fp32", "bf16"} {
		cfg := config.DefaultConfig()
		cfg.Model = "bert"
		if err := cfg.ApplyPreset("small"); err != nil {
			t.Fatal(err)
		}
		cfg.Arch, cfg.BatchSize, cfg.Steps, cfg.EvalSamples, cfg.Device, cfg.Precision = "hf", 4, 1, 4, "cpu", prec
		pl, err := New(Request{Config: cfg, Vocab: 1000, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := measure(t, cfg, 1000)
		if d := math.Abs(float64(pl.Memory.EnginePeak-got)) / float64(got); d > 1e-3 {
			t.Errorf("hf bert small bsz 4 %s: predicted peak %d B, the engine's %d B: %.2f%% off", prec, pl.Memory.EnginePeak, got, 100*d)
		}
	}
}

// TestPlanScales checks the plan's arithmetic where it must move: a larger
// tp shrinks every sharded part, a larger batch grows the activations
// linearly, and bert-large does not fit a 16 GB V100 at a batch of 16
// while it fits an 80 GB H100 at its preset's 8.
func TestPlanScales(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("bert-large"); err != nil {
		t.Fatal(err)
	}
	v100, _ := LookupDevice("v100-16gb")
	h100, _ := LookupDevice("h100")
	at := func(dev Device, tp, bsz int) *Plan {
		c := cfg
		c.TP, c.NTasks, c.BatchSize = tp, tp, bsz
		p, err := New(Request{Config: c, Vocab: 30522, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p1, p2 := at(v100, 1, 8), at(v100, 2, 8)
	if p := at(v100, 1, 16); p.Fits {
		t.Errorf("bert-large bsz 16 on a V100 16 GB: predicted %d B, fits; it does not", p.Memory.Total)
	}
	if !at(h100, 1, 8).Fits {
		t.Error("bert-large bsz 8 on an H100 80 GB: predicted not to fit")
	}
	if p2.Memory.Params*2 < p1.Memory.Params*9/10 || p2.Memory.Params >= p1.Memory.Params {
		t.Errorf("params per rank at tp 2: %d, at tp 1: %d: want about half", p2.Memory.Params, p1.Memory.Params)
	}
	if p2.Memory.ActivationsPerBlock >= p1.Memory.ActivationsPerBlock {
		t.Errorf("activations per block at tp 2 (%d) not below tp 1 (%d)", p2.Memory.ActivationsPerBlock, p1.Memory.ActivationsPerBlock)
	}
	b8, b16 := at(v100, 1, 8), at(v100, 1, 16)
	if got, want := b16.Memory.Blocks-b8.Memory.Blocks, b8.Memory.Blocks; got != want {
		t.Errorf("block activations from bsz 8 to 16 grew by %d B, want %d (linear)", got, want)
	}
	if p2.Time.TPBytes == 0 || p1.Time.TPBytes != 0 {
		t.Errorf("tp bytes: %g at tp 1, %g at tp 2", p1.Time.TPBytes, p2.Time.TPBytes)
	}
	if p2.Time.StepS <= 0 || p2.Time.MFU <= 0 || p2.Time.MFU > 1 {
		t.Errorf("step %g s, MFU %g", p2.Time.StepS, p2.Time.MFU)
	}
}

func TestLookupDevice(t *testing.T) {
	for _, name := range []string{"v100-16", "V100-32GB", "a100-40", "a100-80gb", "h100", "h200"} {
		if _, err := LookupDevice(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := LookupDevice("tpu-v9"); err == nil || !strings.Contains(err.Error(), "h100-80") {
		t.Errorf("unknown device: %v, want an error listing the table", err)
	}
	cfg := config.DefaultConfig()
	cfg.Precision = "bf16"
	v100, _ := LookupDevice("v100")
	p, err := New(Request{Config: cfg, Vocab: 100, Device: v100})
	if err != nil || p.Time.PeakFlops != v100.FP32Flops || !strings.Contains(strings.Join(p.Notes, " "), "no bf16 tensor cores") {
		t.Errorf("bf16 on a V100: %v, peak %g, notes %q; want the fp32 peak and a note", err, p.Time.PeakFlops, p.Notes)
	}
}

// TestSuggestFits checks that every suggestion for a run that does not fit
// is one that does, and that each kind is offered where it exists.
func TestSuggestFits(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("bert-large"); err != nil {
		t.Fatal(err)
	}
	cfg.NTasks, cfg.TP, cfg.BatchSize = 4, 1, 10
	dev, _ := LookupDevice("v100-16")
	r := Request{Config: cfg, Vocab: 30522, Device: dev}
	if p, err := New(r); err != nil || p.Fits {
		t.Fatalf("bert-large bsz 10 on a V100 16 GB at tp 1: %v, fits %v; want it not to fit", err, p != nil && p.Fits)
	}
	sug := Suggest(r)
	kinds := map[string]bool{}
	for _, s := range sug {
		if s.Total > dev.MemBytes {
			t.Errorf("suggestion %s needs %d B of %d", s.Flags, s.Total, dev.MemBytes)
		}
		kinds[strings.Fields(s.Flags)[0]] = true
	}
	for _, k := range []string{"--tp", "--bsz", "--nodes"} {
		if !kinds[k] {
			t.Errorf("no %s suggestion among %+v", k, sug)
		}
	}
}

// TestSuggestSPZero checks the memory-saving suggestions: with room for
// either alone, both --sp and --zero 1 are offered (and fit); with room
// for neither alone but for both, the pair is; on a GPU --zero 1 is
// offered too (it runs there device-resident); --sp is not at tp 1 nor
// where tp does not divide the sequence.
func TestSuggestSPZero(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("bert-large"); err != nil {
		t.Fatal(err)
	}
	cfg.NTasks, cfg.TP, cfg.Device = 4, 2, "cpu"
	total := func(c config.Config, dev Device) int64 {
		p, err := New(Request{Config: c, Vocab: 30522, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		return p.Memory.Total
	}
	big := CPU(DefaultCPUFlops, 1<<40, 2, "test")
	sp, zero, both := cfg, cfg, cfg
	sp.SP, zero.Zero, both.SP, both.Zero = true, 1, true, 1
	base, tSP, tZero, tBoth := total(cfg, big), total(sp, big), total(zero, big), total(both, big)
	if !(tSP < base && tZero < base && tBoth < min(tSP, tZero)) {
		t.Fatalf("bert-large tp 2 x dp 2 per rank: %d B, with sp %d, zero 1 %d, both %d: want each below the last", base, tSP, tZero, tBoth)
	}
	flags := func(cfg config.Config, dev Device) map[string]int64 {
		out := map[string]int64{}
		for _, s := range Suggest(Request{Config: cfg, Vocab: 30522, Device: dev}) {
			if s.Total > dev.MemBytes {
				t.Errorf("suggestion %s needs %d B of %d", s.Flags, s.Total, dev.MemBytes)
			}
			out[s.Flags] = s.Total
		}
		return out
	}
	// bf16: the blocks' hidden activations and norms' outputs in 2 bytes,
	// offered where it fits.
	bf := cfg
	bf.Precision = "bf16"
	if tBF := total(bf, big); tBF >= base {
		t.Errorf("bert-large tp 2 x dp 2 per rank: %d B, at bf16 %d: want less", base, tBF)
	} else if got := flags(cfg, CPU(DefaultCPUFlops, tBF, 2, "test")); got["--precision bf16"] != tBF {
		t.Errorf("room for %d B: suggestions %v; want --precision bf16 (%d B)", tBF, got, tBF)
	}
	dev := CPU(DefaultCPUFlops, max(tSP, tZero), 2, "test")
	got := flags(cfg, dev)
	if got["--sp"] != tSP || got["--zero 1"] != tZero {
		t.Errorf("room for %d B: suggestions %v; want --sp (%d B) and --zero 1 (%d B)", dev.MemBytes, got, tSP, tZero)
	}
	if _, ok := got["--sp --zero 1"]; ok {
		t.Errorf("room for either alone: suggestions %v offer both together", got)
	}
	dev.MemBytes = tBoth
	if got := flags(cfg, dev); got["--sp --zero 1"] != tBoth {
		t.Errorf("room for %d B: suggestions %v; want --sp --zero 1 (%d B)", dev.MemBytes, got, tBoth)
	}
	// A GPU with room for ZeRO-1's moments and buckets, not for the
	// replicated moments.
	gpu, _ := LookupDevice("v100-16")
	c, cz := cfg, zero
	c.Device, cz.Device = "auto", "auto"
	gpu.MemBytes = total(cz, gpu)
	if total(c, gpu) <= gpu.MemBytes {
		t.Fatalf("on a GPU: ZeRO-1 saves nothing (%d B, replicated %d B)", gpu.MemBytes, total(c, gpu))
	}
	if got := flags(c, gpu); got["--zero 1"] != gpu.MemBytes {
		t.Errorf("on a GPU with room for ZeRO-1: suggestions %v; want --zero 1 (%d B)", got, gpu.MemBytes)
	}
	for _, tc := range []struct{ tp, heads, dim int }{{1, 16, 1024}, {3, 12, 768}} { // seq 512: tp 3 does not divide it
		c := cfg
		c.TP, c.NTasks, c.Heads, c.Dim = tc.tp, 2*tc.tp, tc.heads, tc.dim
		dev.MemBytes = total(c, big) - 1
		got := flags(c, dev)
		if _, ok := got["--zero 1"]; !ok {
			t.Errorf("tp %d x dp 2, 1 B short: suggestions %v lack --zero 1", tc.tp, got)
		}
		for f := range got {
			if strings.Contains(f, "--sp") {
				t.Errorf("tp %d, seq %d: suggestion %s", tc.tp, c.Seq, f)
			}
		}
	}
}

// groupSpy is a world communicator that keeps the tensor- and
// data-parallel groups train.Run makes of it (parallel.NewMesh: tp first),
// so that a test can read their traffic.
type groupSpy struct {
	nccl.Comm
	mu     *sync.Mutex
	groups *[]nccl.Comm
}

// Group implements nccl.Comm, keeping rank 0's groups and their own
// (a Llama's key/value replicas, made of the tensor-parallel group).
func (g groupSpy) Group(ranks []int) (nccl.Comm, error) {
	c, err := g.Comm.Group(ranks)
	if err == nil && g.Comm.Rank() == 0 {
		g.mu.Lock()
		*g.groups = append(*g.groups, c)
		g.mu.Unlock()
		c = groupSpy{c, g.mu, g.groups}
	}
	return c, err
}

// commPerStep is one optimizer step's traffic on rank 0 as the plan counts
// it: the bytes a rank sends in the tensor- and data-parallel groups on a
// ring (all-reduce 2(p-1)/p of the buffer, all-gather (p-1)/p of the
// gathered buffer, reduce-scatter p-1 times the block received) and the
// collectives. It runs cfg for 1 and for 2 steps with one validation batch
// at the end and takes the difference.
func commPerStep(t *testing.T, cfg config.Config, vocab int) (tpBytes, dpBytes float64, calls int) {
	t.Helper()
	groups := commStatsPerStep(t, cfg, vocab)
	sent := func(s nccl.Stats, p int) float64 {
		h := float64(p-1) / float64(p)
		return 2*h*float64(s.AllReduce.Bytes) + h*float64(s.AllGather.Bytes) + float64(p-1)*float64(s.ReduceScatter.Bytes)
	}
	tp, dp := groups[0], groups[1]
	tpBytes, dpBytes, calls = sent(tp, cfg.TP), sent(dp, cfg.DP()), int(tp.Total().Calls+dp.Total().Calls)
	if cfg.ZeroGroup != "" {
		// Hybrid sharding: ZeRO's groups of the data-parallel ranks and
		// their replicas, counted with dp.
		k, err := cfg.ZeroShards(cfg.NTasks)
		if err != nil {
			t.Fatal(err)
		}
		shard, replicas := groups[2], groups[3]
		dpBytes += sent(shard, k) + sent(replicas, cfg.DP()/k)
		calls += int(shard.Total().Calls + replicas.Total().Calls)
		groups = append(groups[:2], groups[4:]...)
	}
	if len(groups) == 3 {
		// The key/value replicas (parallel.KVReplicas), counted with tp.
		kv := groups[2]
		_, r, _ := parallel.KVSplit(cfg.Heads, cfg.KVHeadCount(), cfg.TP)
		tpBytes, calls = tpBytes+sent(kv, r), calls+int(kv.Total().Calls)
	}
	return tpBytes, dpBytes, calls
}

// commStatsPerStep is the engine's collectives over one step of cfg on
// rank 0, per group (tp, dp, and the key/value replicas where there are
// some): cfg run for 1 and for 2 steps with one validation batch at the
// end, the difference of nccl.Stats.
func commStatsPerStep(t *testing.T, cfg config.Config, vocab int) []nccl.Stats {
	t.Helper()
	run := func(steps int) []nccl.Stats {
		c := cfg
		c.Steps, c.EvalEvery = steps, 0
		ds := randomData(c, vocab, c.BatchSize*c.GradAccum*c.DP()*steps)
		val := randomData(c, vocab, c.BatchSize*c.DP())
		ds.Val = val.Train
		var mu sync.Mutex
		var groups []nccl.Comm
		err := nccl.RunInProcess(c.NTasks, func(w nccl.Comm) error {
			_, err := train.Run(context.Background(), c, groupSpy{w, &mu, &groups}, train.Options{Device: tensor.NewCPU(), Data: ds})
			return err
		})
		if err != nil || len(groups) < 2 || len(groups) > 5 {
			t.Fatalf("tp %d ntasks %d sp %v zero %d: %d groups, %v", c.TP, c.NTasks, c.SP, c.Zero, len(groups), err)
		}
		var out []nccl.Stats
		for _, g := range groups {
			out = append(out, g.Stats())
		}
		return out
	}
	one, two := run(1), run(2)
	out := make([]nccl.Stats, len(one))
	for i := range one {
		out[i] = two[i].Sub(one[i])
	}
	return out
}

// commLayout is a layout of the communication tests.
type commLayout struct {
	tp, dp, accum int
	sp            bool
	zero          int
	recompute     string // "": the default
}

// tinyConfig is model's tiny preset in the layout p on the CPU, bsz 4,
// one validation batch a replica.
func (p commLayout) tinyConfig(t *testing.T, model string) config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Model = model
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.TP, cfg.NTasks, cfg.BatchSize, cfg.GradAccum, cfg.SP, cfg.Zero = p.tp, p.tp*p.dp, 4, p.accum, p.sp, p.zero
	cfg.EvalSamples, cfg.Device = cfg.BatchSize*p.dp, "cpu"
	if p.recompute != "" {
		cfg.Recompute = p.recompute
	}
	return cfg
}

// TestCommMatchesEngine checks the plan's communication against the
// engine's own counters (nccl.Stats of the tensor- and data-parallel
// groups) over one optimizer step: the collectives and the bytes a rank
// sends exactly, with and without sequence parallelism and ZeRO-1 or -2,
// the three models, and gradient accumulation.
func TestCommMatchesEngine(t *testing.T) {
	const vocab = 1000
	var table strings.Builder
	fmt.Fprintf(&table, "%-5s %3s %3s %5s %-10s %12s %12s %12s %12s %5s %5s\n", "model", "tp", "dp", "accum", "mode", "plan tp B", "engine tp B", "plan dp B", "engine dp B", "plan", "calls")
	for _, model := range []string{"bert", "gpt", "llama"} {
		for _, pr := range []struct {
			commLayout
			precision string
		}{
			{commLayout{2, 1, 1, false, 0, ""}, ""}, {commLayout{2, 1, 1, true, 0, ""}, ""}, {commLayout{4, 1, 2, true, 0, ""}, ""},
			{commLayout{1, 2, 1, false, 0, ""}, ""}, {commLayout{1, 2, 1, false, 1, ""}, ""}, {commLayout{2, 2, 1, false, 0, ""}, ""},
			{commLayout{2, 2, 2, true, 1, ""}, ""},
			{commLayout{4, 1, 1, false, 0, ""}, ""}, // a Llama's 2 kv heads replicated over 2 ranks each
			{commLayout{1, 2, 2, false, 2, ""}, ""}, {commLayout{2, 2, 2, true, 2, ""}, ""}, {commLayout{1, 2, 2, false, 3, ""}, ""},
			{commLayout{2, 2, 1, true, 3, ""}, ""},
			// At bf16 sequence parallelism's all-gathers of the norms'
			// outputs carry 2 bytes an element; without it a Llama's
			// embedding all-reduce likewise (its output is the bf16
			// stream).
			{commLayout{2, 1, 1, true, 0, ""}, "bf16"}, {commLayout{2, 2, 2, true, 1, ""}, "bf16"},
			{commLayout{2, 1, 1, false, 0, ""}, "bf16"},
			// grad_reduce bf16: the gradient all-reduce carries 2 bytes an
			// element (packed two a word, a bucket's odd one padded).
			{commLayout{1, 2, 1, false, 0, ""}, "grad-bf16"}, {commLayout{2, 2, 2, true, 0, ""}, "grad-bf16"},
			// Under ZeRO its reduce-scatters likewise, each range padded.
			{commLayout{1, 2, 1, false, 1, ""}, "grad-bf16"}, {commLayout{2, 2, 2, true, 2, ""}, "grad-bf16"},
			{commLayout{1, 2, 2, false, 3, ""}, "grad-bf16"},
		} {
			p := pr.commLayout
			cfg := p.tinyConfig(t, model)
			switch pr.precision {
			case "grad-bf16":
				cfg.Precision, cfg.GradReduce = "bf16", "bf16"
			case "":
			default:
				cfg.Precision = pr.precision
			}
			if model == "llama" && (p.tp <= 2 || !p.sp && p.accum == 1) {
				cfg.KVHeads = 2 // grouped heads, whole groups a rank (at tp 4: each replicated over 2)
			}
			pl, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
			if err != nil {
				t.Fatal(err)
			}
			tpB, dpB, calls := commPerStep(t, cfg, vocab)
			mode := ""
			if p.sp {
				mode += "+sp"
			}
			if p.zero > 0 {
				mode += fmt.Sprintf("+zero%d", p.zero)
			}
			if pr.precision != "" {
				mode += "+" + pr.precision
			}
			fmt.Fprintf(&table, "%-5s %3d %3d %5d %-10s %12.0f %12.0f %12.0f %12.0f %5d %5d\n", model, p.tp, p.dp, p.accum, mode, pl.Time.TPBytes, tpB, pl.Time.DPBytes, dpB, pl.Time.Collectives, calls)
			off := func(plan, engine float64) bool { return math.Abs(plan-engine) > 1e-9*engine }
			if off(pl.Time.TPBytes, tpB) || off(pl.Time.DPBytes, dpB) || pl.Time.Collectives != calls {
				t.Errorf("%s tp %d dp %d accum %d%s: plan sends %.0f B in tp, %.0f B in dp, %d collectives a step; the engine %.0f, %.0f, %d",
					model, p.tp, p.dp, p.accum, mode, pl.Time.TPBytes, pl.Time.DPBytes, pl.Time.Collectives, tpB, dpB, calls)
			}
		}
	}
	t.Logf("communication of one step on rank 0, planned against the engine's counters:\n%s", table.String())
}

// TestRecomputeCommMatchesEngine is TestCommMatchesEngine with activation
// recomputation: full recomputation runs each block's forward collectives
// again in its backward, selective none; the plan counts them exactly.
func TestRecomputeCommMatchesEngine(t *testing.T) {
	const vocab = 1000
	for _, model := range []string{"bert", "gpt", "llama"} {
		for _, p := range []commLayout{{tp: 2, dp: 1, accum: 1}, {tp: 2, dp: 1, accum: 2, sp: true}, {tp: 2, dp: 2, accum: 1}} {
			for _, mode := range []string{"selective", "full"} {
				p.recompute = mode
				cfg := p.tinyConfig(t, model)
				if model == "llama" {
					cfg.KVHeads = 2
				}
				pl, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
				if err != nil {
					t.Fatal(err)
				}
				tpB, dpB, calls := commPerStep(t, cfg, vocab)
				off := func(plan, engine float64) bool { return math.Abs(plan-engine) > 1e-9*engine }
				if off(pl.Time.TPBytes, tpB) || off(pl.Time.DPBytes, dpB) || pl.Time.Collectives != calls {
					t.Errorf("%s tp %d dp %d accum %d sp %v recompute %s: plan sends %.0f B in tp, %.0f B in dp, %d collectives a step; the engine %.0f, %.0f, %d",
						model, p.tp, p.dp, p.accum, p.sp, mode, pl.Time.TPBytes, pl.Time.DPBytes, pl.Time.Collectives, tpB, dpB, calls)
				}
			}
		}
	}
}

// bf16 on a GPU prices the GEMMs at the bf16 peak and adds the operand
// conversion as an elementwise kernel: 4 bytes read and 2 written for each
// element of each product's two operands, each time it runs (summed here
// from StepGemms); and it plans GPT-2 124M faster than fp32, as the H200
// measured (bench/results/gpu-2026-11-27-h200: 0.157 s against 0.364 s at
// 16 x 1024).
func TestGPUBF16Time(t *testing.T) {
	h200, err := LookupDevice("h200")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("gpt2-124m"); err != nil {
		t.Fatal(err)
	}
	// The unfused attention, whose every product cuBLAS runs (and the
	// measurements' path).
	cfg.BatchSize, cfg.Seq, cfg.Device, cfg.Attention = 16, 1024, "cuda", "unfused"
	plans := map[string]*Plan{}
	for _, accum := range []int{1, 2} {
		for _, prec := range []string{"fp32", "tf32", "bf16"} {
			cfg.Precision, cfg.GradAccum = prec, accum
			p, err := New(Request{Config: cfg, Vocab: 50257, Device: h200})
			if err != nil {
				t.Fatal(err)
			}
			plans[fmt.Sprint(prec, accum)] = p
		}
	}
	cfg.GradAccum = 1
	gs, err := StepGemms(cfg, 50257)
	if err != nil {
		t.Fatal(err)
	}
	var elems float64
	for _, g := range gs {
		elems += float64(g.Count * max(g.Batch, 1) * (g.M*g.K + g.K*g.N))
	}
	// Less the weights' bfloat16 copies, read in place: each the B operand
	// of its layer's forward and input-gradient products.
	ps, err := spec.Params(cfg, 50304, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range spec.LocalElems(ps) {
		if ps[i].Product {
			elems -= 2 * float64(n)
		}
	}
	// And the MLP's hidden activation and the two layer norms' outputs of
	// each block and ln_f's, stored as bf16: each the A operand of the next
	// layer's forward, the B of its weight gradient.
	elems -= 2 * float64(cfg.BatchSize*cfg.Seq*(cfg.Layers*(cfg.Hidden()+2*cfg.Dim)+cfg.Dim))
	// And Q, K and V, stored as bf16 (c_attn's output): Q and K read by
	// the scores, V by the output, V, K and Q again by the backward; and
	// the heads' output y, c_proj's A forward and B of its weight gradient.
	elems -= (6 + 2) * float64(cfg.Layers*cfg.BatchSize*cfg.Seq*cfg.Dim)
	// And the LM head's logits, stored as bf16 with their gradient written
	// over them: the A operand of the head's input- and weight-gradient
	// products; likewise the MLP's hidden gradient, c_fc's.
	elems -= 2 * float64(cfg.BatchSize*cfg.Seq*50304)
	elems -= 2 * float64(cfg.Layers*cfg.BatchSize*cfg.Seq*cfg.Hidden())
	// And the attention's probabilities P, stored as bf16 from float32
	// scores: the A operand of O = P V and of dV = P^T dO; and the
	// scores' gradient dS, stored as bf16: the A operand of dQ = dS K and
	// of dK = dS^T Q.
	elems -= 2 * 2 * float64(cfg.Layers*cfg.BatchSize*cfg.Heads*cfg.Seq*cfg.Seq)
	// And the heads' output's gradient dO, stored as bf16: the A operand
	// of dP = dO V^T, the B of dV = P^T dO; and c_attn's output gradient
	// (3C), the A operand of its input- and weight-gradient products.
	elems -= (2 + 2*3) * float64(cfg.Layers*cfg.BatchSize*cfg.Seq*cfg.Dim)
	// And the two output projections' gradients (the residual stream's,
	// stored as bf16), the A operand of each one's input- and
	// weight-gradient products.
	elems -= 2 * 2 * float64(cfg.Layers*cfg.BatchSize*cfg.Seq*cfg.Dim)
	for _, accum := range []int{1, 2} {
		bf, tf := plans[fmt.Sprint("bf16", accum)].Time, plans[fmt.Sprint("tf32", accum)].Time
		if want := tf.ComputeS * h200.TF32Flops / h200.BF16Flops; math.Abs(bf.ComputeS-want) > 1e-9*want {
			t.Errorf("%d micro-batches: bf16 GEMMs %g s, want %g (tf32's at the bf16 peak)", accum, bf.ComputeS, want)
		}
		// Less the 2 bytes an element of those activations, of the MLP's
		// pre-activation (fc's output) and hidden gradient, of c_attn's
		// (3C) and its gradient, of y and its gradient, of the residual
		// stream (r and out, and its first value, wpe's output) and its
		// gradient (the model's dx), of the norms' outputs' gradients (a
		// block's dh, the model's), stored as bf16, and of the logits and
		// the attention's probabilities and scores' gradient, that the
		// elementwise kernels do not touch.
		halved := float64(activationTouches * 2 * cfg.BatchSize * cfg.Seq * (cfg.Layers*(3*cfg.Hidden()+13*cfg.Dim+2*cfg.Heads*cfg.Seq) + 4*cfg.Dim + 50304))
		if got, want := bf.MemoryS-tf.MemoryS, float64(accum)*(6*elems-halved)/h200.MemBandwidth; math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%d micro-batches: bf16's memory time less tf32's %g s, want %g (its conversions, 6 bytes x %g operand elements a micro-batch, less the halved activations: negative once they outweigh them)", accum, got, want, elems)
		}
	}
	// Measured: tf32 0.1375 s < bf16 0.1569 s < fp32 0.3640 s, when bf16
	// converted every operand; with the weights, the activations and the
	// largest gradients stored as bf16 the plan puts bf16 ahead of tf32
	// (to re-measure on a lent GPU), both well ahead of fp32.
	bf, tf, fp := plans["bf161"].Time, plans["tf321"].Time, plans["fp321"].Time
	if !(tf.StepS < fp.StepS/2 && bf.StepS < tf.StepS) {
		t.Errorf("steps: tf32 %g s, bf16 %g, fp32 %g: want bf16 ahead of tf32, both under half of fp32", tf.StepS, bf.StepS, fp.StepS)
	}
}

// At bf16 every operand of a GPT's products is stored as bf16 (the
// unfused attention's (T,T) probabilities and scores' gradient among
// them, the output projections' gradients rounded by their layers): the
// operand scratch converts none, and the workspace is fp32's. An unfused
// grouped-query Llama keeps its Q, K, V gradient in float32
// (parallel.QKVGradDType): the scratch holds that A operand, (B x T) x
// (heads + 2 kv heads) x head size in bf16, the largest converted.
func TestGPUBF16ScratchAttention(t *testing.T) {
	h200, err := LookupDevice("h200")
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"gpt", "llama"} {
		cfg := config.DefaultConfig()
		cfg.Model, cfg.Layers, cfg.Dim, cfg.Heads = model, 2, 64, 4
		cfg.BatchSize, cfg.Seq, cfg.Device, cfg.Attention = 8, 1024, "cuda", "unfused"
		want := int64(0)
		if model == "llama" {
			cfg.KVHeads = 2
			want = 2 * int64(cfg.BatchSize*cfg.Seq*(cfg.Heads+2*cfg.KVHeads)*(cfg.Dim/cfg.Heads))
		}
		work := map[string]int64{}
		for _, prec := range []string{"fp32", "bf16"} {
			cfg.Precision = prec
			p, err := New(Request{Config: cfg, Vocab: 64, Device: h200})
			if err != nil {
				t.Fatal(err)
			}
			work[prec] = p.Memory.Workspace
		}
		if got := work["bf16"] - work["fp32"]; got != want {
			t.Errorf("%s: bf16 operand scratch %d B, want %d", model, got, want)
		}
	}
}

// On a GPU the plan's memory is the H100's measured peak of
// bench/results/gpu-2026-11-26-h100: exact in fp32, within 1% in bf16
// (whose operand scratch the device grows by doubling). Those runs
// predate the fused attention, so the plan is asked for the unfused one,
// and bf16's storage: since, the weights' bf16 copies add 2 bytes a
// product weight and the MLP's hidden activation and pre-activation, the
// fused Q,K,V projection's output, the heads' output and the layer norms'
// outputs (ln_f's too), stored as bf16, take 2 bytes an element fewer,
// which the measured bf16 peak is moved by; and the fused classifier
// writes the logits' gradient over them and the MLP's GELU backward runs
// in place, so both peaks lose the (B,T,V) float32 logits' gradient and
// the (B,T,4C) scratch of GELU's input gradient those runs allocated.
// At bf16 the logits (so their gradient) are stored as bf16, and so is
// the MLP's hidden gradient (B,T,4C), which the blocks share: the operand
// scratch converts neither, its A buffer shrinking from the (B,T,V)
// gradient to the next largest float32 A operand, c_attn's output
// gradient (B,T,3C). And the blocks' two projections now write
// into one buffer each that all the blocks share (their outputs go
// straight into the residual adds): both peaks lose 2 (B,T,C) float32
// buffers for each block but one. And at bf16 the unfused attention keeps
// its probabilities as bf16 (B,H,T,T) a block, 2 bytes an element fewer,
// and the scores' gradient (B,H,T,T), the blocks' shared scratch; and the
// heads' output gradient (B,T,C) and c_attn's (B,T,3C), shared scratch
// too; each block's residual stream (r and out, (B,T,C) each) is bf16,
// and so is its gradient (the model's dx, (B,T,C)), which the output
// projections read as it is: no product converts an operand and the
// operand scratch is empty; the stream's first value, wpe's output
// (B,T,C), is bf16, and so are the norms' outputs' gradients (the blocks'
// shared dh, the model's, (B,T,C) each). And the blocks run the residual
// path in place in the model's dx: both peaks lose the blocks' dr and the
// model's dy, (B,T,C) float32 each.
func TestGPUPeakMatchesMeasured(t *testing.T) {
	h100, err := LookupDevice("h100-80")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		precision string
		measured  int64 // bench step's peak_bytes
		tol       float64
	}{{"fp32", 31743980720, 1e-4}, {"bf16", 33543328176, 0.01}} {
		cfg := config.DefaultConfig()
		cfg.Model = "gpt"
		if err := cfg.ApplyPreset("gpt2-124m"); err != nil {
			t.Fatal(err)
		}
		cfg.BatchSize, cfg.Seq, cfg.Precision, cfg.Device, cfg.Attention = 16, 1024, c.precision, "cuda", "unfused"
		p, err := New(Request{Config: cfg, Vocab: 50257, Device: h100})
		if err != nil {
			t.Fatal(err)
		}
		got := p.Memory.EnginePeak
		c.measured -= 4 * int64(cfg.BatchSize*cfg.Seq*(50304+cfg.Hidden()))
		c.measured -= 4 * 2 * int64((cfg.Layers-1)*cfg.BatchSize*cfg.Seq*cfg.Dim)
		c.measured -= 4 * 2 * int64(cfg.BatchSize*cfg.Seq*cfg.Dim)
		if c.precision == "bf16" {
			ps, err := spec.Params(cfg, 50304, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range spec.LocalElems(ps) {
				if ps[i].Product {
					c.measured += 2 * n
				}
			}
			c.measured -= 2 * int64(cfg.BatchSize*cfg.Seq*(cfg.Layers*(2*cfg.Hidden()+6*cfg.Dim)+cfg.Dim))
			c.measured -= 2 * 2 * int64(cfg.BatchSize*cfg.Seq*50304)
			c.measured -= 2 * 4 * int64(cfg.BatchSize*cfg.Seq*cfg.Dim)
			c.measured -= 2 * int64(cfg.BatchSize*cfg.Seq*4*cfg.Dim)
			c.measured -= 2 * 2 * int64(cfg.Layers*cfg.BatchSize*cfg.Seq*cfg.Dim)
			c.measured -= 2 * int64(cfg.Layers*cfg.BatchSize*cfg.Heads*cfg.Seq*cfg.Seq)
			c.measured -= 2 * int64(cfg.BatchSize*cfg.Seq*cfg.Hidden())
			c.measured -= 2 * int64(cfg.BatchSize*cfg.Heads*cfg.Seq*cfg.Seq)
		}
		if d := math.Abs(float64(got-c.measured)) / float64(c.measured); d > c.tol {
			t.Errorf("%s: plan %d B, measured %d B on the H100 (%.3f%% off, want within %.2g%%)", c.precision, got, c.measured, 100*d, 100*c.tol)
		}
	}
}

// TestCommKindsMatchEngine prices each kind of collective at its own
// bandwidth (all-reduces 2 GB/s, all-gathers 1, reduce-scatters 0.5, no
// latency or skew): the plan's comm time is then the engine's bytes of
// each kind over one step (nccl.Stats) at those bandwidths, with sequence
// parallelism's all-gathers and reduce-scatters and ZeRO-1's.
func TestCommKindsMatchEngine(t *testing.T) {
	const vocab = 1000
	now := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	comm := &CommRates{Format: CommRatesFormat, Fits: []CommFit{{Path: PathShm, NRanks: 2, BusGBs: 2, GatherGBs: 1, ScatterGBs: 0.5, CPU: "Test CPU", Measured: now}}}
	dev := hostCPU(Share{TasksPerNode: 2, Launcher: LaunchLocal}, Machine{NumCPU: 2, Mem: 8 * gib, CPU: "Test CPU", Load: -1, Now: now}, testRates(), nil, comm)
	for _, model := range []string{"bert", "gpt"} {
		for _, p := range []commLayout{
			{2, 1, 1, true, 0, ""}, {2, 1, 2, true, 0, ""}, {2, 1, 1, false, 0, ""}, {1, 2, 1, false, 1, ""}, {1, 2, 1, false, 0, ""},
			{2, 1, 1, true, 0, "full"}, // the forward's all-gathers and reduce-scatters again
		} {
			cfg := p.tinyConfig(t, model)
			pl, err := New(Request{Config: cfg, Vocab: vocab, Device: dev})
			if err != nil {
				t.Fatal(err)
			}
			stats := commStatsPerStep(t, cfg, vocab)
			var want float64
			for _, s := range stats {
				// 2 ranks a group: an all-reduce sends its buffer, an
				// all-gather half the gathered one, a reduce-scatter the
				// block it receives.
				want += float64(s.AllReduce.Bytes)/2e9 + float64(s.AllGather.Bytes)/2/1e9 + float64(s.ReduceScatter.Bytes)/0.5e9
			}
			if got := pl.Time.CommS; math.Abs(got-want) > 1e-9*want {
				t.Errorf("%s tp %d dp %d accum %d sp %v zero %d: plan comm %.9f s, the engine's bytes of each kind at their bandwidths %.9f s",
					model, p.tp, p.dp, p.accum, p.sp, p.zero, got, want)
			}
		}
	}
}

// TestTurnsOverlapWork checks that ranks taking turns on shared cores wait
// in their collectives while the others work: the comm grows by the turns,
// the step does not, and the turns never outgrow the others' share of the
// work.
func TestTurnsOverlapWork(t *testing.T) {
	now := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	m := Machine{NumCPU: 2, Mem: 8 * gib, CPU: "Test CPU", Load: -1, Now: now}
	cfg := commLayout{tp: 2, dp: 2, accum: 1}.tinyConfig(t, "gpt")
	shared := hostCPU(Share{TasksPerNode: 4, Launcher: LaunchLocal}, m, testRates(), nil, nil)
	if shared.Cores != 0.5 || shared.Wait == 0 {
		t.Fatalf("4 ranks on 2 cores: %v cores a rank, a wait of %v s", shared.Cores, shared.Wait)
	}
	for _, wait := range []float64{shared.Wait, 1} { // 1 s: the cap
		d := shared
		d.Wait = wait
		with, err := New(Request{Config: cfg, Vocab: 256, Device: d})
		if err != nil {
			t.Fatal(err)
		}
		d.Wait = 0
		without, err := New(Request{Config: cfg, Vocab: 256, Device: d})
		if err != nil {
			t.Fatal(err)
		}
		a, b := with.Time, without.Time
		work := a.ComputeS + a.MemoryS
		want := min(float64(a.Collectives)*wait, work*0.5)
		if a.TurnS <= 0 || math.Abs(a.TurnS-want) > 1e-12 || b.TurnS != 0 {
			t.Errorf("wait %v: turns %v s, want %v (%d collectives, %v s of work); %v without a wait", wait, a.TurnS, want, a.Collectives, work, b.TurnS)
		}
		if math.Abs(a.CommS-b.CommS-a.TurnS) > 1e-12 || math.Abs(a.StepS-b.StepS) > 1e-12 {
			t.Errorf("wait %v: comm %v s against %v, step %v against %v: the turns must add to the comm only", wait, a.CommS, b.CommS, a.StepS, b.StepS)
		}
	}
}

// ZeRO-3 moves 1.5 times the all-reduce's bytes for the blocks (ZeRO,
// Rajbhandari et al. 2019, section 7.2.2): a reduce-scatter of their
// gradients and two all-gathers of their values (before the forward and
// before the backward) where an all-reduce is a reduce-scatter and one
// all-gather. Measured by the engine's counters over one step at dp 2 and
// dp 4: ZeRO-3 sends exactly half the blocks' all-reduce more than ZeRO-1
// (whose reduce-scatter and all-gather are the all-reduce's bytes), and
// the plan says the same.
func TestZeRO3MovesOneAndAHalfAllReduces(t *testing.T) {
	const vocab = 1000
	for _, dp := range []int{2, 4} {
		cfg := commLayout{tp: 1, dp: dp, accum: 1}.tinyConfig(t, "gpt")
		cfg.Zero = 1
		_, one, _ := commPerStep(t, cfg, vocab)
		cfg.Zero = 3
		_, three, _ := commPerStep(t, cfg, vocab)
		vp, err := parallel.PadVocab(vocab, 1)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := newShapes(cfg, vp, 0, cfg.Layers, cfg.NTasks, false)
		if err != nil {
			t.Fatal(err)
		}
		var blocks int64 // the blocks' padded gradients
		for _, b := range sh.buckets {
			if b.Block {
				blocks += (b.Elems + int64(dp) - 1) / int64(dp) * int64(dp)
			}
		}
		h := float64(dp-1) / float64(dp)
		allReduce := 2 * h * float64(blocks) * f32
		if got := three - one; got != allReduce/2 {
			t.Errorf("dp %d: ZeRO-3 sends %.0f B a step more than ZeRO-1, want half the blocks' all-reduce, %.0f B", dp, got, allReduce/2)
		}
		pl, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		if pl.Time.DPBytes != three {
			t.Errorf("dp %d: the plan sends %.0f B in dp at zero 3, the engine %.0f", dp, pl.Time.DPBytes, three)
		}
		t.Logf("dp %d: the blocks' all-reduce %.0f B; ZeRO-3 %.0f B over ZeRO-1's: x%.2f for the blocks", dp, allReduce, three-one, (allReduce+three-one)/allReduce)
	}
}

// A 7B-class Llama (Llama 2 7B's shape: 32 layers of dim 4096, 32 heads,
// SwiGLU of 11008, a vocabulary of 32000; 6.7e9 parameters) on 8 H100s of
// 80 GB, 8-way data parallel, full recomputation, one sequence of 4096 a
// rank: fp32 Adam training takes 16 bytes a parameter, 108 GB whole, and
// does not fit replicated. ZeRO-1 leaves the weights and gradients whole
// on every rank (8 bytes a parameter); ZeRO-2 the weights; ZeRO-3 shards
// the blocks' values, gradients and moments (16/8 bytes a parameter) and
// keeps one block's gathered values and gradients, and the embeddings and
// the head whole (their moments sharded): 28.6 GB a rank.
func TestPlan7BFitsAtZero3(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model, cfg.Layers, cfg.Dim, cfg.Heads, cfg.KVHeads, cfg.FFN = "llama", 32, 4096, 32, 32, 11008
	cfg.Seq, cfg.BatchSize, cfg.NTasks, cfg.TP, cfg.Recompute, cfg.Device = 4096, 1, 8, 1, "full", "cuda"
	dev, err := LookupDevice("h100-80")
	if err != nil {
		t.Fatal(err)
	}
	const vocab = 32000
	n := spec.ParamCount(cfg, vocab)
	if n < 6.5e9 || n > 7e9 {
		t.Fatalf("%d parameters, want a 7B-class model", n)
	}
	last := int64(0)
	for zero, fits := range []bool{false, true, true, true} {
		c := cfg
		c.Zero = zero
		p, err := New(Request{Config: c, Vocab: vocab, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("zero %d: %.1f GB a rank (params %.1f, grads %.1f, optimizer %.1f), fits %v", zero, float64(p.Memory.Total)/1e9,
			float64(p.Memory.Params)/1e9, float64(p.Memory.Grads)/1e9, float64(p.Memory.Optimizer)/1e9, p.Fits)
		if p.Fits != fits {
			t.Errorf("zero %d: fits %v, want %v (%d B a rank of %d)", zero, p.Fits, fits, p.Memory.Total, dev.MemBytes)
		}
		if zero > 0 && p.Memory.Total >= last {
			t.Errorf("zero %d: %d B a rank, not less than zero %d's %d", zero, p.Memory.Total, zero-1, last)
		}
		last = p.Memory.Total
		if zero == 3 {
			// 16/dp bytes a parameter of the blocks, one block's values
			// and gradients gathered, and the embeddings' and the head's
			// whole with their moments sharded.
			block := int64(4*4096*4096 + 3*4096*11008 + 2*4096)
			root := n - 32*block
			want := 4 * (2*(root+block) + 2*(n-root)/8 + 2*n/8)
			if got := p.Memory.Params + p.Memory.Grads + p.Memory.Optimizer; math.Abs(float64(got-want)) > float64(4*4*32*8) {
				t.Errorf("zero 3: %d B of parameters, gradients and moments, want about %d (16/8 bytes a parameter, one block whole)", got, want)
			}
		}
	}
}

// Hybrid sharding (--zero-group 2 at dp 4) is planned exactly: the engine
// peak of every rank to the byte (the ZeRO state cut over 2 ranks, not 4)
// and the data-parallel traffic to the byte (the reduce-scatters and
// all-gathers over the group of 2, each range then averaged over the 2
// replicas), at ZeRO-1, -2 and -3.
func TestHybridShardingPlanned(t *testing.T) {
	const vocab = 1000
	for _, zero := range []int{1, 2, 3} {
		cfg := commLayout{tp: 1, dp: 4, accum: 2, zero: zero}.tinyConfig(t, "gpt")
		cfg.ZeroGroup = "2"
		pl, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		for r, got := range measureRanks(t, cfg, vocab) {
			if got != pl.Memory.EnginePeak {
				t.Errorf("zero %d group 2, rank %d: engine peak %d B, the plan's %d B", zero, r, got, pl.Memory.EnginePeak)
			}
		}
		_, dpB, calls := commPerStep(t, cfg, vocab)
		if pl.Time.DPBytes != dpB || pl.Time.Collectives != calls {
			t.Errorf("zero %d group 2: the plan sends %.0f B in dp in %d collectives, the engine %.0f in %d", zero, pl.Time.DPBytes, pl.Time.Collectives, dpB, calls)
		}
		whole := cfg
		whole.ZeroGroup = ""
		pw, err := New(Request{Config: whole, Vocab: vocab, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("zero %d: %d B a rank in groups of 2, %d B over all 4", zero, pl.Memory.EnginePeak, pw.Memory.EnginePeak)
	}
}

// On a GPU at bf16 the plan counts the fused attention's buffers, as the
// engine allocates them there: each block's (B,nh,T,T) probabilities
// become (B,nh,T) log-sum-exps, so GPT-2 124M at 8 x 1024 needs less by
// at least the probabilities of its 12 blocks; with attention unfused,
// or at fp32, the plan is the unfused one.
func TestPlanCountsFusedAttention(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model, cfg.Preset, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.BatchSize = "gpt", "gpt2-124m", 12, 768, 12, 1024, 8
	cfg.Device, cfg.Precision = "cuda", "bf16"
	dev, err := LookupDevice("h100-80")
	if err != nil {
		t.Fatal(err)
	}
	plan := func(c config.Config) *Plan {
		p, err := New(Request{Config: c, Vocab: 50257, Device: dev})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	total := func(c config.Config) int64 { return plan(c).Memory.Total }
	unfusedCfg, fp32 := cfg, cfg
	unfusedCfg.Attention, fp32.Precision = "unfused", "fp32"
	fused, unfused := total(cfg), total(unfusedCfg)
	probs := int64(12 * 8 * 12 * 1024 * 1024 * 2) // bf16
	t.Logf("fused %.2f GB, unfused %.2f GB", float64(fused)/1e9, float64(unfused)/1e9)
	if unfused-fused < probs {
		t.Errorf("fused attention saves %d B, want at least the blocks' probabilities, %d B", unfused-fused, probs)
	}
	fp32Unfused := fp32
	fp32Unfused.Attention = "unfused"
	if f, u := total(fp32), total(fp32Unfused); f != u {
		t.Errorf("fp32 plans %d B, fp32 unfused %d B: fp32 must plan the unfused attention", f, u)
	}
	// Time: the fused kernels' nine products a block over the causal
	// tiles (17 of 32 at 1024 tokens) instead of six full ones, and no
	// bf16 conversion of attention's operands.
	pf, pu := plan(cfg), plan(unfusedCfg)
	attnUnfused := 12 * 6 * 2.0 * 8 * 12 * 1024 * 1024 * 64
	attnFused := 12 * 9 * (17.0 / 32) * 2 * 8 * 12 * 1024 * 1024 * 64
	if d := pu.Time.GemmFlops - pf.Time.GemmFlops; math.Abs(d-(attnUnfused-attnFused)) > 1e-6*pu.Time.GemmFlops {
		t.Errorf("GEMM FLOPs fused %.4g, unfused %.4g: %.4g apart, want %.4g", pf.Time.GemmFlops, pu.Time.GemmFlops, d, attnUnfused-attnFused)
	}
	if pf.Time.StepS >= pu.Time.StepS {
		t.Errorf("step fused %.4f s, unfused %.4f s: the fused attention converts and moves less", pf.Time.StepS, pu.Time.StepS)
	}
	t.Logf("step fused %.4f s, unfused %.4f s", pf.Time.StepS, pu.Time.StepS)
}
