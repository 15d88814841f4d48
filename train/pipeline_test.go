package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// TestPipelineLossCurves trains the same model from the same seed on the
// same data with the blocks split over 2 pipeline stages (alone, with
// tp 2, with dp 2 x tp 2, with sp, with ZeRO-1) and 4, and at tp 1 with as
// many accumulated micro-batches: the loss curves agree to 1e-6 relative
// over 20 steps, and so do the final validations. At the same tp and dp
// the number of stages changes nothing, bit for bit: every stage runs the
// same kernels on the same micro-batches in the same order, and the loss
// and the norm travel exactly. BERT's curves then equal tp1's; GPT's
// equal each other's but not tp1's, whose tied embedding adds the head's
// and the embedding's gradients per micro-batch in one buffer, where a
// pipeline sums each over the step on its own stage and then adds them.
func TestPipelineLossCurves(t *testing.T) {
	for _, model := range []string{"gpt", "bert"} {
		t.Run(model, func(t *testing.T) {
			base := smallConfig(model)
			base.Layers, base.CkptEvery = 4, -1
			if model == "gpt" {
				base.Data = textFile(t)
			}
			layouts := []struct {
				name                        string
				ntasks, pp, tp, b, micro, a int
				sp                          bool
				zero                        int
				split                       string
			}{
				{"tp1", 1, 1, 1, 4, 0, 4, false, 0, ""},
				{"pp2", 2, 2, 1, 4, 4, 1, false, 0, ""},
				{"pp4", 4, 4, 1, 4, 4, 1, false, 0, ""},
				{"pp2split31", 2, 2, 1, 4, 4, 1, false, 0, "3,1"},
				{"pp2tp2", 4, 2, 2, 4, 4, 1, false, 0, ""},
				{"pp2tp2sp", 4, 2, 2, 4, 4, 1, true, 0, ""},
				{"pp2dp2zero1", 4, 2, 1, 2, 4, 1, false, 1, ""},
				{"pp2dp2tp2", 8, 2, 2, 2, 4, 1, false, 0, ""},
				{"pp2dp2tp2spzero1", 8, 2, 2, 2, 4, 1, true, 1, ""},
				{"pp2dp2zero2", 4, 2, 1, 2, 4, 1, false, 2, ""},
				{"pp2dp2tp2spzero2", 8, 2, 2, 2, 4, 1, true, 2, ""},
				{"pp2dp2zero3", 4, 2, 1, 2, 4, 1, false, 3, ""},
				{"pp2dp2tp2spzero3", 8, 2, 2, 2, 4, 1, true, 3, ""},
			}
			exact := map[string]string{"pp4": "pp2", "pp2split31": "pp2"}
			if model == "bert" {
				exact = map[string]string{"pp2": "tp1", "pp4": "tp1", "pp2split31": "tp1"}
			}
			curves := map[string][]float64{}
			var ref []float64
			var refEval EvalResult
			for _, l := range layouts {
				if testing.Short() && l.ntasks > 4 {
					continue
				}
				cfg := base
				cfg.NTasks, cfg.PP, cfg.TP, cfg.BatchSize, cfg.MicroBatches, cfg.GradAccum, cfg.SP, cfg.Zero, cfg.PPSplit = l.ntasks, l.pp, l.tp, l.b, l.micro, l.a, l.sp, l.zero, l.split
				res := runInProcess(t, cfg, "")
				if len(res.Losses) != 20 {
					t.Fatalf("%s: %d steps", l.name, len(res.Losses))
				}
				if len(res.Evals) != 1 {
					t.Fatalf("%s: %d validations, want 1", l.name, len(res.Evals))
				}
				curves[l.name] = res.Losses
				if same := exact[l.name]; same != "" {
					bitIdentical(t, l.name, res.Losses, same, curves[same])
				}
				if ref == nil {
					ref, refEval = res.Losses, res.Evals[0]
					if !(ref[19] < ref[0]) {
						t.Errorf("%s: loss did not fall: %v", l.name, ref)
					}
					continue
				}
				e := res.Evals[0]
				if d := math.Abs(e.Loss-refEval.Loss) / refEval.Loss; d > 1e-6 || (model == "bert" && e.Accuracy != refEval.Accuracy) {
					t.Errorf("%s: validation loss %.8f accuracy %v, tp1 %.8f %v", l.name, e.Loss, e.Accuracy, refEval.Loss, refEval.Accuracy)
				}
				sameCurve(t, l.name, res.Losses, ref)
			}
		})
	}
}

// TestPipelineRefused checks that what a pipeline cannot run fails
// Validate with one line naming the setting.
func TestPipelineRefused(t *testing.T) {
	for _, tc := range []struct {
		set  func(*config.Config)
		want string
	}{
		{func(c *config.Config) { c.Layers = 3 }, "layers 3 is not a multiple of pp 2"},
		{func(c *config.Config) { c.PPSplit = "3,2" }, "holds 5 blocks, the model has layers 4"},
		{func(c *config.Config) { c.PPSplit = "4" }, "names 1 stages, pp is 2"},
		{func(c *config.Config) { c.PPSplit = "4,0" }, "stage 1 has \"0\" blocks"},
		{func(c *config.Config) { c.PP, c.NTasks, c.MicroBatches, c.PPSplit = 1, 1, 0, "4" }, "pp_split needs pp > 1"},
		{func(c *config.Config) { c.MicroBatches = 1 }, "micro_batches 1 is fewer than pp 2"},
		{func(c *config.Config) { c.NTasks = 3 }, "ntasks 3 is not a multiple of pp 2 x tp 1"},
		{func(c *config.Config) { c.GradAccum = 2 }, "use --micro-batches"},
		{func(c *config.Config) { c.Zero = 1 }, "zero 1 needs a data-parallel degree > 1"},
		{func(c *config.Config) { c.PP, c.NTasks = 1, 1 }, "micro_batches needs pp > 1"},
		{func(c *config.Config) { c.PP = -1 }, "must not be negative"},
	} {
		cfg := smallConfig("gpt")
		cfg.NTasks, cfg.PP, cfg.Layers, cfg.MicroBatches = 2, 2, 4, 2
		if err := cfg.Validate(); err != nil {
			t.Fatalf("the base config: %v", err)
		}
		tc.set(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("want one line with %q, got %v", tc.want, err)
		}
	}
	cfg := smallConfig("gpt")
	cfg.NTasks, cfg.PP, cfg.Layers, cfg.MicroBatches, cfg.Device = 2, 2, 4, 2, "cuda"
	if err := cfg.Validate(); err != nil {
		t.Errorf("a pipeline on cuda: %v", err)
	}
}

// TestPipelineMetrics checks the step lines of every stage: the measured
// bubble beside the 1F1B theory, and the stage in the run line.
func TestPipelineMetrics(t *testing.T) {
	cfg := smallConfig("gpt")
	cfg.Data = textFile(t)
	cfg.NTasks, cfg.PP, cfg.Layers, cfg.MicroBatches, cfg.CkptEvery, cfg.Steps, cfg.BatchSize = 2, 2, 2, 4, -1, 5, 4
	dir := t.TempDir()
	runInProcess(t, cfg, dir)
	for r := 0; r < 2; r++ {
		b, err := os.ReadFile(metrics.RankFile(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		var steps int
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var v map[string]any
			if err := json.Unmarshal([]byte(line), &v); err != nil {
				t.Fatal(err)
			}
			switch v["type"] {
			case "run":
				if v["pp"] != 2.0 || (r == 1 && v["pp_rank"] != 1.0) {
					t.Errorf("rank %d run line: pp %v pp_rank %v", r, v["pp"], v["pp_rank"])
				}
			case "step":
				steps++
				bubble, _ := v["bubble"].(float64)
				if v["bubble_theory"] != 0.2 || bubble < 0 || bubble >= 1 {
					t.Errorf("rank %d step line: bubble %v, theory %v (want 0.2)", r, v["bubble"], v["bubble_theory"])
				}
			}
		}
		if steps != 5 {
			t.Errorf("rank %d: %d step lines", r, steps)
		}
	}
	// The summary, from the steps kept and streamed: a bubble per stage.
	run, err := metrics.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := metrics.Summarize(run)
	streamed, _, err := metrics.ReadSummary(dir, metrics.NoCurves)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []metrics.Summary{kept, streamed} {
		if len(s.Bubble) != 2 || s.Bubble[1].Stage != 1 || s.Bubble[1].Theory != 0.2 || !(s.Bubble[0].Measured >= 0 && s.Bubble[0].Measured < 1) {
			t.Errorf("summary bubble %+v, want 2 stages, theory 0.2", s.Bubble)
		}
		if s.Config.PP != 2 || s.Config.DP != 1 || s.SamplesPerS != kept.SamplesPerS {
			t.Errorf("summary: pp %d dp %d, samples/s %v (kept %v)", s.Config.PP, s.Config.DP, s.SamplesPerS, kept.SamplesPerS)
		}
	}
}

// killComm is a rank's communicator that dies (its sends fail, so its
// Run returns) at its n-th point-to-point send, as a stage killed in the
// middle of a step.
type killComm struct {
	nccl.Comm
	left *atomic.Int64
}

func (c killComm) Send(buf []float32, to int) error {
	if c.left.Add(-1) == 0 {
		return errors.New("killed")
	}
	return c.Comm.Send(buf, to)
}

func (c killComm) Group(ranks []int) (nccl.Comm, error) {
	g, err := c.Comm.Group(ranks)
	if err != nil {
		return nil, err
	}
	return killComm{g, c.left}, nil
}

// TestPipelineStageKilled kills stage 1 (ranks 2 and 3 of pp 2 x tp 2) in
// the middle of step 2: every rank fails, and stage 0's ranks name their
// neighbour on the killed stage.
func TestPipelineStageKilled(t *testing.T) {
	cfg := smallConfig("gpt")
	cfg.Data = textFile(t)
	cfg.NTasks, cfg.PP, cfg.TP, cfg.Layers, cfg.MicroBatches, cfg.CkptEvery, cfg.Steps, cfg.BatchSize = 4, 2, 2, 2, 4, -1, 5, 4
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 4)
	nccl.RunInProcess(4, func(c nccl.Comm) error {
		if c.Rank() >= 2 {
			left := &atomic.Int64{}
			left.Store(4 + 2) // step 1 sends 4 gradients; die in step 2
			c = killComm{c, left}
		}
		_, errs[c.Rank()] = Run(context.Background(), cfg, c, Options{Data: ds})
		return errs[c.Rank()]
	})
	for r, err := range errs {
		want := "killed"
		if r < 2 {
			want = fmt.Sprintf("rank %d", r+2)
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "step 2") {
			t.Errorf("rank %d: want an error at step 2 naming %q, got %v", r, want, err)
		}
	}
}

// TestPipelineResumeAtOtherLayout saves a pp 2 x tp 2 run every 5 steps:
// resuming from step 5 at the same tp with another number of stages (pp
// 4) gives the uninterrupted losses bit for bit, as at the same layout;
// at pp 1 (as many accumulated micro-batches; the tied embedding adds its
// gradients in another order, see TestPipelineLossCurves) and at another
// tp, to 1e-6 relative. The checkpoint is laid out as at pp 1.
func TestPipelineResumeAtOtherLayout(t *testing.T) {
	cfg, ds := gptConfig(t, 4, 2)
	cfg.PP, cfg.Layers, cfg.BatchSize, cfg.MicroBatches, cfg.CkptEvery = 2, 4, 4, 4, 5
	full := t.TempDir()
	res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: full} })
	if err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	names, _ := filepath.Glob(filepath.Join(from, "*"))
	var base []string
	for _, n := range names {
		base = append(base, filepath.Base(n))
	}
	if got := strings.Join(base, " "); got != "model-tp0-of-2.safetensors model-tp1-of-2.safetensors optim-tp0-dp0.safetensors optim-tp1-dp0.safetensors state.json" {
		t.Fatalf("checkpoint files: %s", got)
	}
	// eval and generate take the pipeline's checkpoint at pp 1.
	if err := nccl.RunInProcess(1, func(c nccl.Comm) error {
		e, err := EvaluateSource(context.Background(), c, EvalOptions{Source: from, Data: cfg.Data, Seq: 16, BatchSize: 4, Device: "cpu"})
		if err == nil && !(e.Loss > 0) {
			err = fmt.Errorf("eval loss %v", e.Loss)
		}
		return err
	}); err != nil {
		t.Fatalf("eval of the pipeline's checkpoint: %v", err)
	}
	want := res[0].Losses[5:]
	for _, l := range []struct {
		name                      string
		ntasks, pp, tp, micro, ga int
		exact                     bool
	}{
		{"pp2tp2", 4, 2, 2, 4, 1, true},
		{"pp4tp2", 8, 4, 2, 4, 1, true},
		{"pp1tp2", 2, 1, 2, 0, 4, false},
		{"pp4", 4, 4, 1, 4, 1, false},
	} {
		c := cfg
		c.NTasks, c.PP, c.TP, c.MicroBatches, c.GradAccum = l.ntasks, l.pp, l.tp, l.micro, l.ga
		dir := t.TempDir()
		resumed, err := runRanks(t, c, ds, func(int) Options { return Options{RunDir: dir, Resume: from} })
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		got := resumed[0].Losses
		if resumed[0].Start != 5 || len(got) != len(want) {
			t.Fatalf("%s: resumed at %d with %d losses, want 5 and %d", l.name, resumed[0].Start, len(got), len(want))
		}
		for i := range got {
			d := math.Abs(got[i]-want[i]) / math.Abs(want[i])
			if (l.exact && got[i] != want[i]) || d > 1e-6 {
				t.Errorf("%s step %d: resumed loss %.8f, uninterrupted %.8f", l.name, 6+i, got[i], want[i])
			}
		}
	}
}

// TestPipelineZeroResume saves a pp 2 x dp 2 run with ZeRO-1: the
// checkpoint has one optimizer file per DP rank, as without a pipeline;
// resumed at the same layout it gives the uninterrupted losses bit for
// bit, at pp 1 (one rank) and at pp 4 to 1e-6.
func TestPipelineZeroResume(t *testing.T) {
	cfg, ds := gptConfig(t, 4, 1)
	cfg.PP, cfg.Layers, cfg.BatchSize, cfg.MicroBatches, cfg.CkptEvery, cfg.Zero, cfg.Steps, cfg.EvalEvery = 2, 4, 2, 4, 5, 1, 8, 0
	full := t.TempDir()
	res, err := runRanks(t, cfg, ds, func(int) Options { return Options{RunDir: full} })
	if err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(rundir.Dir(full).Ckpt(), "step-000005")
	names, _ := filepath.Glob(filepath.Join(from, "*"))
	var base []string
	for _, n := range names {
		base = append(base, filepath.Base(n))
	}
	if got := strings.Join(base, " "); got != "model-tp0-of-1.safetensors optim-tp0-dp0.safetensors optim-tp0-dp1.safetensors state.json" {
		t.Fatalf("checkpoint files: %s", got)
	}
	want := res[0].Losses[5:]
	for _, l := range []struct {
		name                            string
		ntasks, pp, b, micro, ga, zero1 int
		exact                           bool
	}{
		{"pp2dp2zero1", 4, 2, 2, 4, 1, 1, true},
		{"pp1", 1, 1, 4, 0, 4, 0, false},
		{"pp4", 4, 4, 4, 4, 1, 0, false},
	} {
		c := cfg
		c.NTasks, c.PP, c.BatchSize, c.MicroBatches, c.GradAccum, c.Zero = l.ntasks, l.pp, l.b, l.micro, l.ga, l.zero1
		dir := t.TempDir()
		resumed, err := runRanks(t, c, ds, func(int) Options { return Options{RunDir: dir, Resume: from} })
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		got := resumed[0].Losses
		if resumed[0].Start != 5 || len(got) != len(want) {
			t.Fatalf("%s: resumed at %d with %d losses, want 5 and %d", l.name, resumed[0].Start, len(got), len(want))
		}
		for i := range got {
			if d := math.Abs(got[i]-want[i]) / want[i]; (l.exact && got[i] != want[i]) || d > 1e-6 {
				t.Errorf("%s step %d: resumed loss %.8f, uninterrupted %.8f", l.name, 6+i, got[i], want[i])
			}
		}
	}
}
