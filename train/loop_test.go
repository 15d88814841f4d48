package train

import (
	"context"
	"math"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/internal/traintest"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// runInProcess trains cfg on cfg.NTasks in-process ranks and returns rank
// 0's result.
func runInProcess(t *testing.T, cfg config.Config, runDir string) *Result {
	t.Helper()
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var res0 *Result
	err = nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		res, err := Run(context.Background(), cfg, c, Options{Data: ds, RunDir: runDir})
		if c.Rank() == 0 {
			mu.Lock()
			res0 = res
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return res0
}

// The tests' shared model, text and NumPy (package traintest).
var (
	smallConfig = traintest.SmallConfig
	textFile    = traintest.TextFile
	numpyPython = traintest.NumpyPython
)

// The Hugging Face tokenizer fixtures of package tokenizer, described in
// tokenizer/testdata/hf/README.md.
const (
	tinyHF        = "tokenizer/testdata/hf/tiny"         // byte b is id b, four merges, <|eot|> (260) and <pad>
	templateHF    = "tokenizer/testdata/hf/template"     // tiny's, <|begin_of_text|> (262) before each sequence
	templateEOTHF = "tokenizer/testdata/hf/template-eot" // template's, <|eot|> after each sequence too
)

// TestLossCurveEquivalence trains the same model on the same data from the
// same seed at tp=1, tp=2 and dp=2 (global batch held fixed): the loss
// curves must agree to float32 tolerance over 20 steps.
func TestLossCurveEquivalence(t *testing.T) {
	for _, model := range []string{"bert", "gpt"} {
		t.Run(model, func(t *testing.T) {
			base := smallConfig(model)
			if model == "gpt" {
				base.Data = textFile(t)
			}
			layouts := []struct {
				name                 string
				ntasks, tp, b, accum int
			}{
				{"tp1", 1, 1, 16, 1}, {"tp2", 2, 2, 16, 1}, {"dp2", 2, 1, 8, 1}, {"tp2dp2", 4, 2, 8, 1},
				{"accum2", 1, 1, 8, 2}, {"tp2dp2accum2", 4, 2, 4, 2},
			}
			var ref []float64
			for _, l := range layouts {
				if testing.Short() && l.ntasks > 2 {
					continue
				}
				cfg := base
				cfg.NTasks, cfg.TP, cfg.BatchSize, cfg.GradAccum = l.ntasks, l.tp, l.b, l.accum
				res := runInProcess(t, cfg, "")
				if len(res.Losses) != 20 {
					t.Fatalf("%s: %d steps", l.name, len(res.Losses))
				}
				if ref == nil {
					ref = res.Losses
					if !(ref[19] < ref[0]) {
						t.Errorf("%s: loss did not fall: %v", l.name, ref)
					}
					continue
				}
				worst := 0.0
				for i, v := range res.Losses {
					worst = math.Max(worst, math.Abs(v-ref[i]))
					if d := math.Abs(v - ref[i]); d > 1e-5*math.Max(1, math.Abs(ref[i])) {
						t.Errorf("%s step %d: loss %.7f, tp1 %.7f (diff %.2g)", l.name, i+1, v, ref[i], d)
					}
				}
				t.Logf("%s: losses %.4f -> %.4f, largest difference from tp1 %.2g", l.name, res.Losses[0], res.Losses[19], worst)
			}
		})
	}
}

// TestMetricsFiles checks that every rank writes run, step, eval and end
// lines.
func TestMetricsFiles(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.NTasks, cfg.TP, cfg.Steps, cfg.EvalEvery = 2, 2, 4, 2
	dir := t.TempDir()
	runInProcess(t, cfg, dir)
	for r := 0; r < 2; r++ {
		b, err := os.ReadFile(metrics.RankFile(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, want := range []string{`"type":"run"`, `"type":"step","step":4`, `"type":"eval","step":2`, `"type":"eval","step":4`, `"status":"completed"`, `"comm_s"`, `"mem_peak_bytes"`} {
			if !strings.Contains(s, want) {
				t.Errorf("rank %d file lacks %s:\n%s", r, want, s)
			}
		}
	}
}

func TestRunErrors(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.Samples, cfg.BatchSize = 10, 8
	cfg.NTasks, cfg.TP = 2, 1
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		_, err := Run(context.Background(), cfg, c, Options{})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "no full step") {
		t.Fatalf("err = %v", err)
	}
}

// TestPaddedVocabEquivalence uses GPT-2's vocabulary, which pads to 50304
// rows at tp=1 and 50432 at tp=2: the padding ids are masked out of the
// loss, so the curves still agree.
func TestPaddedVocabEquivalence(t *testing.T) {
	cfg := smallConfig("gpt")
	cfg.Data, cfg.Tokenizer = textFile(t), "gpt2"
	cfg.Steps, cfg.BatchSize = 5, 4
	var ref []float64
	for _, tp := range []int{1, 2} {
		cfg.NTasks, cfg.TP = tp, tp
		res := runInProcess(t, cfg, "")
		if ref == nil {
			ref = res.Losses
			continue
		}
		for i, v := range res.Losses {
			if d := math.Abs(v - ref[i]); d > 1e-5*math.Max(1, math.Abs(ref[i])) {
				t.Errorf("tp2 step %d: loss %.7f, tp1 %.7f", i+1, v, ref[i])
			}
		}
	}
	if !(ref[0] > 10 && ref[0] < 11.5) {
		t.Errorf("first loss %.3f, want about ln(50257) = 10.8", ref[0])
	}
}

// TestRunLineHost checks that the run line records the host the caller
// names (Options.Host, the Slurm node name) and this machine's name when
// none is given.
func TestRunLineHost(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.Steps = 1
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Hostname()
	for _, tc := range []struct{ host, want string }{{"r14i3n7", "r14i3n7"}, {"", self}} {
		dir := t.TempDir()
		err := nccl.RunInProcess(1, func(c nccl.Comm) error {
			_, err := Run(context.Background(), cfg, c, Options{Data: ds, RunDir: dir, Host: tc.host})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		l, err := metrics.ReadRank(metrics.RankFile(dir, 0))
		if err != nil {
			t.Fatal(err)
		}
		if l.Info == nil {
			t.Fatalf("Options.Host %q: no run line", tc.host)
		}
		if l.Info.Host != tc.want {
			t.Errorf("Options.Host %q: run line host %q, want %q", tc.host, l.Info.Host, tc.want)
		}
	}
}
