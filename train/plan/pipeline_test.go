package plan

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/config"
)

// pipelineConfig is the tiny preset split over pp stages of dp x tp ranks
// running micro micro-batches of 4 a step.
func pipelineConfig(t *testing.T, model string, pp, dp, tp, micro int) config.Config {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Model = model
	if err := cfg.ApplyPreset("tiny"); err != nil {
		t.Fatal(err)
	}
	if model == "llama" {
		cfg.KVHeads, cfg.FFN = 2, 160 // grouped heads, whole groups a rank at tp 2
	}
	cfg.PP, cfg.TP, cfg.NTasks, cfg.MicroBatches, cfg.BatchSize = pp, tp, pp*dp*tp, micro, 4
	cfg.Steps, cfg.EvalSamples, cfg.Device, cfg.CkptEvery = 1, 4, "cpu", -1
	return cfg
}

// TestPlanPipeline: at pp 2 a rank's figures are one stage's: stage s
// holds its half of the blocks' saved activations for pp-s micro-batches
// in flight beside one backward scratch, the largest being the first;
// Memory is the stage that needs the most and Time the slowest stage's,
// with the bubble; and the plan says what it leaves out.
func TestPlanPipeline(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("bert-large"); err != nil {
		t.Fatal(err)
	}
	h100, _ := LookupDevice("h100")
	cfg.CkptEvery = -1
	p1, err := New(Request{Config: cfg, Vocab: 30522, Device: h100})
	if err != nil {
		t.Fatal(err)
	}
	cfg.PP, cfg.NTasks, cfg.MicroBatches = 2, 2, 4
	p2, err := New(Request{Config: cfg, Vocab: 30522, Device: h100})
	if err != nil {
		t.Fatal(err)
	}
	if len(p1.Stages) != 0 || len(p2.Stages) != 2 || p2.DP != 1 {
		t.Fatalf("stages: %d at pp 1, %d at pp 2 (dp %d)", len(p1.Stages), len(p2.Stages), p2.DP)
	}
	m1 := p1.Memory
	saved, scratch := m1.SavedPerBlock, m1.ActivationsPerBlock-m1.SavedPerBlock
	for _, st := range p2.Stages {
		m := st.Memory
		if want := int64(cfg.Layers/2)*int64(2-st.Stage)*saved + scratch; st.InFlight != 2-st.Stage || st.Blocks != cfg.Layers/2 || m.Blocks != want || m.SavedPerBlock != saved {
			t.Errorf("stage %d: %d blocks, %d in flight, blocks' activations %d B; want %d, %d, %d B", st.Stage, st.Blocks, st.InFlight, m.Blocks, cfg.Layers/2, 2-st.Stage, want)
		}
		if m.Params >= m1.Params || st.Time.Bubble != parallel.BubbleFraction(2, 4) {
			t.Errorf("stage %d: params %d B (pp 1 %d B), bubble %v", st.Stage, m.Params, m1.Params, st.Time.Bubble)
		}
		if m.Total > p2.Memory.Total || st.Time.StepS > p2.Time.StepS {
			t.Errorf("stage %d needs %d B, takes %g s; the plan says %d B, %g s", st.Stage, m.Total, st.Time.StepS, p2.Memory.Total, p2.Time.StepS)
		}
	}
	if s := p2.Stages; s[0].Memory.Blocks <= s[1].Memory.Blocks {
		t.Errorf("stage 0 holds %d B of activations, stage 1 %d B: want the first the largest", s[0].Memory.Blocks, s[1].Memory.Blocks)
	}
	if !strings.Contains(strings.Join(p2.Notes, " "), "1F1B bubble") {
		t.Errorf("pp 2 notes do not name the bubble: %q", p2.Notes)
	}
}

// TestPipelineBubble: the plan's bubble is the 1F1B idle share
// (p-1)/(m+p-1) on every stage, and the step adds the time it stretches
// the micro-batches' work by, (p-1)/m of it.
func TestPipelineBubble(t *testing.T) {
	for _, c := range []struct{ pp, micro int }{{2, 2}, {2, 4}, {2, 8}, {4, 4}, {4, 16}} {
		cfg := pipelineConfig(t, "gpt", c.pp, 1, 1, c.micro)
		cfg.Layers = 4
		p, err := New(Request{Config: cfg, Vocab: 1000, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		want := float64(c.pp-1) / float64(c.micro+c.pp-1)
		for _, st := range append(p.Stages, Stage{Stage: -1, Time: p.Time}) {
			tm := st.Time
			if tm.Bubble != want {
				t.Errorf("pp %d m %d stage %d: bubble %v, want (p-1)/(m+p-1) = %v", c.pp, c.micro, st.Stage, tm.Bubble, want)
			}
			if got := tm.ComputeS + tm.MemoryS + tm.CommS + tm.BubbleS; math.Abs(got-tm.StepS) > 1e-12*tm.StepS || !(tm.BubbleS > 0) {
				t.Errorf("pp %d m %d stage %d: step %g s, its parts add up to %g s (bubble %g s)", c.pp, c.micro, st.Stage, tm.StepS, got, tm.BubbleS)
			}
			// The bubble stretches what is done per micro-batch, not the
			// optimizer: less than (p-1)/m of the rest of the step.
			if rest := tm.StepS - tm.BubbleS; tm.BubbleS >= rest*float64(c.pp-1)/float64(c.micro) {
				t.Errorf("pp %d m %d stage %d: bubble %g s of a %g s step without it", c.pp, c.micro, st.Stage, tm.BubbleS, rest)
			}
		}
	}
}

// TestPipelineMemoryMatchesEngine is TestPeakMemoryMatchesEngine for a
// pipeline: each stage's predicted engine peak is what the engine counts
// on that stage's ranks after a real step, to the byte, for both models at
// pp 2 and 4, with tp 2, sequence parallelism, an uneven split, and dp 2
// with ZeRO-1.
func TestPipelineMemoryMatchesEngine(t *testing.T) {
	const vocab = 1000
	var table strings.Builder
	fmt.Fprintf(&table, "%-5s %3s %3s %3s %5s %-10s %5s %14s %14s %14s\n", "model", "pp", "dp", "tp", "micro", "mode", "stage", "activations B", "predicted B", "measured B")
	for _, c := range []struct {
		model             string
		pp, dp, tp, micro int
		sp                bool
		zero              int
		split             string
		bf16              bool // precision bf16: weight copies, bf16 activations
	}{
		{"gpt", 2, 1, 1, 4, false, 0, "", false},
		{"bert", 2, 1, 1, 4, false, 0, "", false},
		{"gpt", 4, 1, 1, 4, false, 0, "", false},
		{"gpt", 2, 1, 1, 4, false, 0, "3,1", false},
		{"gpt", 2, 1, 2, 4, false, 0, "", false},
		{"gpt", 2, 1, 2, 2, true, 0, "", false},
		{"bert", 2, 1, 2, 4, true, 0, "", false},
		{"gpt", 2, 2, 1, 2, false, 1, "", false},
		{"llama", 2, 1, 1, 4, false, 0, "", false},
		{"llama", 2, 1, 2, 2, true, 0, "", false},
		{"llama", 2, 2, 1, 2, false, 1, "", false},
		{"gpt", 2, 2, 1, 2, false, 2, "", false},
		{"llama", 2, 2, 2, 2, true, 2, "", false},
		{"gpt", 2, 2, 1, 2, false, 3, "", false},
		{"llama", 2, 2, 2, 2, true, 3, "", false},
		{"gpt", 2, 1, 1, 4, false, 0, "", true},
		{"llama", 2, 1, 2, 2, false, 0, "", true},
		{"bert", 2, 1, 2, 4, true, 0, "", true},
	} {
		cfg := pipelineConfig(t, c.model, c.pp, c.dp, c.tp, c.micro)
		cfg.SP, cfg.Zero, cfg.PPSplit = c.sp, c.zero, c.split
		if c.bf16 {
			cfg.Precision = "bf16"
		}
		if c.pp == 4 || c.split != "" {
			cfg.Layers = 4
		}
		p, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		mode := c.split
		if c.sp {
			mode += "+sp"
		}
		if c.zero > 0 {
			mode += fmt.Sprintf("+zero%d", c.zero)
		}
		if c.bf16 {
			mode += "+bf16"
		}
		peaks := measureRanks(t, cfg, vocab)
		for r, got := range peaks {
			st := p.Stages[r/(c.dp*c.tp)]
			want := st.Memory.EnginePeak
			fmt.Fprintf(&table, "%-5s %3d %3d %3d %5d %-10s %5d %14d %14d %14d\n", c.model, c.pp, c.dp, c.tp, c.micro, mode, st.Stage, st.Memory.Blocks, want, got)
			if want != got {
				t.Errorf("%s pp %d dp %d tp %d %s rank %d (stage %d): predicted peak %d B, the engine's %d B: %+d B", c.model, c.pp, c.dp, c.tp, mode, r, st.Stage, want, got, want-got)
			}
		}
	}
	t.Logf("engine peak per rank of each stage, predicted against measured:\n%s", table.String())
}

// sendSpy is a communicator that keeps every group made from it or from
// its groups, so that a test can read the point-to-point traffic of the
// pipeline's links (groups of the pipeline's group).
type sendSpy struct {
	nccl.Comm
	mu     *sync.Mutex
	groups *[]nccl.Comm
}

// Group implements nccl.Comm.
func (s sendSpy) Group(ranks []int) (nccl.Comm, error) {
	c, err := s.Comm.Group(ranks)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	*s.groups = append(*s.groups, c)
	s.mu.Unlock()
	return sendSpy{c, s.mu, s.groups}, nil
}

// sentPerStep is what every rank sends point-to-point in one optimizer
// step of cfg, bytes and messages: the difference of a 3-step and a 1-step
// run (both end with one validation batch), halved.
func sentPerStep(t *testing.T, cfg config.Config, vocab int) (bytes, sends []int64) {
	t.Helper()
	run := func(steps int) (bytes, sends []int64) {
		c := cfg
		c.Steps, c.EvalEvery = steps, 0
		data := randomData(c, vocab, c.BatchSize*c.Micro()*c.DP()*steps)
		val := randomData(c, vocab, c.BatchSize*c.DP())
		data.Val = val.Train
		bytes, sends = make([]int64, c.NTasks), make([]int64, c.NTasks)
		err := nccl.RunInProcess(c.NTasks, func(w nccl.Comm) error {
			var mu sync.Mutex
			var groups []nccl.Comm
			_, err := train.Run(context.Background(), c, sendSpy{w, &mu, &groups}, train.Options{Device: tensor.NewCPU(), Data: data})
			for _, g := range append(groups, w) {
				s := g.Stats().Send
				bytes[w.Rank()] += s.Bytes
				sends[w.Rank()] += s.Calls
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s pp %d tp %d: %v", c.Model, c.PP, c.TP, err)
		}
		return bytes, sends
	}
	b1, s1 := run(1)
	b3, s3 := run(3)
	for r := range b1 {
		b3[r], s3[r] = (b3[r]-b1[r])/2, (s3[r]-s1[r])/2
	}
	return b3, s3
}

// TestPipelineTransfersMatchEngine checks the plan's point-to-point
// traffic against the engine's counters: the bytes and the messages every
// rank sends its neighbour stages in a step (each micro-batch's
// activations forward, the gradient of its input backward; T/tp positions
// of them under sequence parallelism; at bf16 both 2 bytes an element).
func TestPipelineTransfersMatchEngine(t *testing.T) {
	const vocab = 1000
	for _, c := range []struct {
		model         string
		pp, tp, micro int
		sp, bf16      bool
	}{
		{"gpt", 2, 1, 4, false, false},
		{"gpt", 4, 1, 6, false, false},
		{"bert", 2, 2, 2, false, false},
		{"gpt", 2, 2, 3, true, false},
		{"gpt", 4, 1, 6, false, true},
		{"llama", 2, 2, 3, true, true},
		{"bert", 2, 1, 2, false, true},
	} {
		cfg := pipelineConfig(t, c.model, c.pp, 1, c.tp, c.micro)
		cfg.SP, cfg.Layers = c.sp, 4
		if c.bf16 {
			cfg.Precision = "bf16"
		}
		p, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
		if err != nil {
			t.Fatal(err)
		}
		bytes, sends := sentPerStep(t, cfg, vocab)
		for r := range bytes {
			tm := p.Stages[r/c.tp].Time
			if int64(tm.PPBytes) != bytes[r] || int64(tm.Transfers) != sends[r] {
				t.Errorf("%s pp %d tp %d m %d sp %v bf16 %v rank %d: plan sends %.0f B in %d transfers a step, the engine %d B in %d",
					c.model, c.pp, c.tp, c.micro, c.sp, c.bf16, r, tm.PPBytes, tm.Transfers, bytes[r], sends[r])
			}
		}
	}
}

// TestRecomputeMemoryMatchesEngine is TestPeakMemoryMatchesEngine with
// activation recomputation: every rank's predicted engine peak is what the
// engine counts after a real step, to the byte, for both models under
// selective and full recomputation, unsharded, at tp 2, tp 2 with
// sequence parallelism and on a 2-stage pipeline; and each recomputation
// needs less than none, full the least.
func TestRecomputeMemoryMatchesEngine(t *testing.T) {
	const vocab = 1000
	for _, model := range []string{"gpt", "bert", "llama"} {
		for _, c := range []struct {
			name   string
			pp, tp int
			sp     bool
			bf16   bool // precision bf16: weight copies, bf16 activations
		}{{"tp1", 1, 1, false, false}, {"tp2", 1, 2, false, false}, {"tp2+sp", 1, 2, true, false}, {"pp2", 2, 1, false, false},
			{"tp1 bf16", 1, 1, false, true}, {"tp2+sp bf16", 1, 2, true, true}} {
			var peaks []int64
			for _, mode := range []string{"none", "selective", "full"} {
				cfg := pipelineConfig(t, model, c.pp, 1, c.tp, 4)
				cfg.Layers, cfg.SP, cfg.Recompute = 4, c.sp, mode
				if c.bf16 {
					cfg.Precision = "bf16"
				}
				if c.pp == 1 {
					cfg.PP, cfg.MicroBatches = 0, 0
				}
				p, err := New(Request{Config: cfg, Vocab: vocab, Device: CPU(0, 0, 0, "")})
				if err != nil {
					t.Fatal(err)
				}
				for r, got := range measureRanks(t, cfg, vocab) {
					want := p.Memory.EnginePeak
					if len(p.Stages) > 0 {
						want = p.Stages[r/c.tp].Memory.EnginePeak
					}
					if want != got {
						t.Errorf("%s %s recompute %s rank %d: predicted peak %d B, the engine's %d B: %+d B", model, c.name, mode, r, want, got, want-got)
					}
				}
				peaks = append(peaks, p.Memory.EnginePeak)
			}
			if !(peaks[2] < peaks[1] && peaks[1] < peaks[0]) {
				t.Errorf("%s %s: peaks without recomputation, selective, full: %v: want each below the one before", model, c.name, peaks)
			}
			t.Logf("%s %s: engine peak per rank without recomputation, selective, full: %v B", model, c.name, peaks)
		}
	}
}
