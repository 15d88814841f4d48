package train

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
)

// tinyGPT2 writes a GPT-2 of spec with random weights (exact in BF16) into
// a Hugging Face directory under t's temp dir, as opt says.
func tinyGPT2(t *testing.T, spec interop.Spec, opt interop.HFOptions) string {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 3))
	var tensors []ckpt.Tensor
	for _, x := range interop.GPT2Tensors(spec) {
		shape := x.Shape
		if x.Conv1D {
			shape = []int{x.Shape[1], x.Shape[0]}
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = float32(r.IntN(161)-80) / 1024
			if strings.Contains(x.Name, "ln_") && strings.HasSuffix(x.Name, ".weight") {
				vals[i] = 1 + float32(r.IntN(17)-8)/64
			}
		}
		tensors = append(tensors, ckpt.Tensor{Name: x.Name, Shape: shape, Data: vals})
	}
	dir := filepath.Join(t.TempDir(), "gpt2")
	if err := interop.WriteHF(dir, spec, tensors, opt); err != nil {
		t.Fatal(err)
	}
	return dir
}

var tinyGPT2Spec = interop.Spec{Model: "gpt", Layers: 2, Dim: 32, Heads: 4, Positions: 64, Vocab: 300}

// initEval is the validation loss, at step 0, of cfg started from its
// init_from at tp = ntasks (rank 0's; all ranks agree).
func initEval(t *testing.T, cfg config.Config, tp int) float64 {
	t.Helper()
	cfg.NTasks, cfg.TP = tp, tp
	ds, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	losses := make([]float64, tp)
	err = nccl.RunInProcess(tp, func(c nccl.Comm) error {
		tr, err := newTrainer(cfg, c, Options{Data: ds}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		if err := tr.resumeIfAny(Options{}); err != nil {
			return err
		}
		e, err := tr.evaluate(0)
		losses[c.Rank()] = e.Loss
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return losses[0]
}

// TestInitFromEqualLossAtEveryTP: a tiny Hugging Face GPT-2 (one F32 file,
// and three BF16 shards with an index and GPT2LMHeadModel's names) gives
// the same validation loss at tp 1, 2 and 4, a loss of its weights and not
// of a random init; the config takes the file's shape (positions 64 with
// seq 16).
func TestInitFromEqualLossAtEveryTP(t *testing.T) {
	text := textFile(t)
	var ref float64
	for i, opt := range []interop.HFOptions{{}, {Shards: 3, DType: "BF16", Prefix: "transformer."}} {
		cfg := smallConfig("gpt")
		cfg.Data, cfg.EvalSamples = text, 8
		cfg.InitFrom = tinyGPT2(t, tinyGPT2Spec, opt)
		cfg.Layers, cfg.Dim = 1, 16 // the file's shape wins over the defaults
		if err := ApplyInitFrom(&cfg, nil); err != nil {
			t.Fatal(err)
		}
		if cfg.Layers != 2 || cfg.Dim != 32 || cfg.Positions != 64 || cfg.Vocab != 300 {
			t.Fatalf("config after ApplyInitFrom: %+v", cfg)
		}
		for _, tp := range []int{1, 2, 4} {
			loss := initEval(t, cfg, tp)
			if i == 0 && tp == 1 {
				ref = loss
				random := cfg
				random.InitFrom = ""
				if r := initEval(t, random, 1); math.Abs(r-loss) < 1e-3 {
					t.Errorf("loss %g from the file equals the random init's %g", loss, r)
				}
				continue
			}
			if math.Abs(loss-ref) > 1e-5 {
				t.Errorf("%+v tp %d: eval loss %.7f, tp 1 single file %.7f", opt, tp, loss, ref)
			}
		}
	}
}

// TestInitFromLLMC: an llm.c checkpoint of the same weights as a Hugging
// Face directory gives the same validation loss, at tp 1 and 2.
func TestInitFromLLMC(t *testing.T) {
	dir := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})
	w, err := interop.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string][]float32{}
	for _, x := range interop.GPT2Tensors(tinyGPT2Spec) {
		if ours[x.Name], err = w.Load(x.Name, x.Shape, parallel.Shard{Parts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	bin := filepath.Join(t.TempDir(), "gpt2_tiny.bin")
	if err := interop.WriteLLMC(bin, tinyGPT2Spec, ours); err != nil {
		t.Fatal(err)
	}
	cfg := smallConfig("gpt")
	cfg.Data, cfg.EvalSamples = textFile(t), 8
	losses := map[string]float64{}
	for _, src := range []string{dir, bin} {
		cfg.InitFrom = src
		if err := ApplyInitFrom(&cfg, nil); err != nil {
			t.Fatal(err)
		}
		for _, tp := range []int{1, 2} {
			losses[fmt.Sprint(filepath.Base(src), tp)] = initEval(t, cfg, tp)
		}
	}
	ref := losses["gpt21"]
	for k, l := range losses {
		if math.Abs(l-ref) > 1e-5 {
			t.Errorf("%s: eval loss %.7f, the Hugging Face dir's at tp 1 %.7f", k, l, ref)
		}
	}
}

// TestInitFromRejections: a flag that contradicts the file, a config whose
// shape differs from the file's (train.toml edited), a data vocabulary the
// file cannot embed.
func TestInitFromRejections(t *testing.T) {
	dir := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})
	cfg := smallConfig("gpt")
	cfg.InitFrom = dir
	cfg.Dim = 48
	err := ApplyInitFrom(&cfg, func(key string) bool { return key == "dim" })
	if err == nil || !strings.Contains(err.Error(), "--dim 48 contradicts "+filepath.Join(dir, "config.json")) || !strings.Contains(err.Error(), "dim 32") {
		t.Errorf("--dim 48 against a dim-32 file: %v", err)
	}
	cfg = smallConfig("gpt")
	cfg.InitFrom = dir
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	cfg.Data = textFile(t)
	cfg.Heads = 8 // as if train.toml were edited after submission
	err = nccl.RunInProcess(1, func(c nccl.Comm) error {
		tr, err := newTrainer(cfg, c, Options{}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		return tr.resumeIfAny(Options{})
	})
	if err == nil || !strings.Contains(err.Error(), "has heads 4, this run's config has 8") {
		t.Errorf("heads 8 against a 4-head file: %v", err)
	}
	cfg.Heads, cfg.Vocab = 4, 0
	small := tinyGPT2(t, interop.Spec{Model: "gpt", Layers: 1, Dim: 8, Heads: 2, Positions: 16, Vocab: 100}, interop.HFOptions{})
	cfg.InitFrom = small
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := data.Prepare(cfg); err == nil || !strings.Contains(err.Error(), fmt.Sprint("vocab 100 is smaller than the byte tokenizer's 256")) {
		t.Errorf("a 100-id file with the byte tokenizer: %v", err)
	}
}

// checkInitFrom compares every model field of a Llama directory with the
// run's config, Llama 3's rope scaling factors and original length
// included: a train.toml edited after submission fails, naming the key.
func TestCheckInitFromLlamaFields(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("llama-tiny"); err != nil {
		t.Fatal(err)
	}
	cfg.NormEps, cfg.RopeTheta, cfg.RopeFactor, cfg.RopeLowFreq, cfg.RopeHighFreq, cfg.RopeOriginalSeq = 1e-6, 500000, 8, 1, 4, 16
	spec := interop.LlamaSpec(cfg, 320)
	if err := checkInitFrom(cfg, 320, spec); err != nil {
		t.Fatalf("the run's own spec: %v", err)
	}
	for _, tc := range []struct {
		key    string
		change func(s *interop.Spec)
	}{
		{"rope_factor", func(s *interop.Spec) { s.RopeFactor = 32 }},
		{"rope_low_freq", func(s *interop.Spec) { s.RopeLowFreq = 2 }},
		{"rope_high_freq", func(s *interop.Spec) { s.RopeHighFreq = 8 }},
		{"rope_original_seq", func(s *interop.Spec) { s.RopeOriginalSeq = 8192 }},
		{"norm_eps", func(s *interop.Spec) { s.NormEps = 1e-5 }},
	} {
		s := spec
		tc.change(&s)
		if err := checkInitFrom(cfg, 320, s); err == nil || !strings.Contains(err.Error(), " has "+tc.key+" ") {
			t.Errorf("%s differs: %v", tc.key, err)
		}
	}
}

// A Hugging Face directory with a tokenizer.json gives the run its
// tokenizer (unless GPT-2's vocabulary says GPT-2's BPE), and a text is
// read with it.
func TestInitFromReadsTokenizerJSON(t *testing.T) {
	dir := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{}) // vocab 300
	if err := os.CopyFS(dir, os.DirFS(tinyHF)); err != nil {
		t.Fatal(err)
	}
	cfg := smallConfig("gpt")
	cfg.InitFrom, cfg.Tokenizer, cfg.Vocab = dir, "", 0
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	if cfg.Tokenizer != "hf" || cfg.VocabFile != filepath.Join(dir, "tokenizer.json") {
		t.Fatalf("tokenizer %q, vocab_file %q: want hf and the directory's tokenizer.json", cfg.Tokenizer, cfg.VocabFile)
	}
	cfg.Data = textFile(t)
	d, err := data.Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Tokenizer.Name() != "hf" || d.Vocab != 300 {
		t.Errorf("tokenizer %s, vocab %d: want hf and the model's 300", d.Tokenizer.Name(), d.Vocab)
	}
}
