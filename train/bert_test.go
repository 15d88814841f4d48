package train

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
)

var tinyBERTSpec = interop.Spec{Model: "bert", Arch: "hf", Layers: 2, Dim: 32, Heads: 4, Positions: 64, Vocab: 300, TypeVocab: 2}

// tinyBERT writes a BERT of spec with random weights into a Hugging Face
// directory (BertForSequenceClassification's names, one file), without the
// classifier when head is false.
func tinyBERT(t *testing.T, spec interop.Spec, head bool) string {
	return tinyBERTAs(t, spec, head, interop.HFOptions{Prefix: "bert."})
}

// tinyBERTAs is tinyBERT written as opt says.
func tinyBERTAs(t *testing.T, spec interop.Spec, head bool, opt interop.HFOptions) string {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.Arch, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Positions, cfg.BatchSize, cfg.Seq = "hf", spec.Layers, spec.Dim, spec.Heads, spec.Positions, 1, 8
	m, err := newBERT(cfg, spec.Vocab, nil, tensor.NewCPU())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(4, 4))
	var tensors []ckpt.Tensor
	for _, p := range m.Params() {
		shape := append([]int(nil), p.Full...)
		if strings.HasPrefix(p.Name, "embeddings.word_embeddings") {
			shape[0] = spec.Vocab
		}
		vals := make([]float32, prodInts(shape))
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * 0.05)
			if strings.Contains(p.Name, "LayerNorm.weight") {
				vals[i] += 1
			}
		}
		tensors = append(tensors, ckpt.Tensor{Name: p.Name, Shape: shape, Data: vals})
	}
	dir := filepath.Join(t.TempDir(), "bert")
	if err := interop.WriteHFBERT(dir, spec, tensors, opt); err != nil {
		t.Fatal(err)
	}
	if !head {
		path := filepath.Join(dir, interop.HFModel)
		f, err := ckpt.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var keep []ckpt.Tensor
		for _, e := range f.Tensors {
			if !strings.HasPrefix(e.Name, "classifier.") {
				x, _ := f.Tensor(e.Name)
				keep = append(keep, x)
			}
		}
		if err := ckpt.WriteFile(path, keep, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func prodInts(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// TestInitFromBERTEqualAtEveryTP: a tiny Hugging Face BERT, with its
// classifier or without (a new head), gives the same validation loss at
// tp 1, 2 and 4, and in three shards with an index; the config takes
// BERT's shape and layout.
func TestInitFromBERTEqualAtEveryTP(t *testing.T) {
	for _, head := range []bool{true, false} {
		cfg := smallConfig("bert")
		cfg.EvalSamples = 24
		cfg.InitFrom = tinyBERT(t, tinyBERTSpec, head)
		if err := ApplyInitFrom(&cfg, nil); err != nil {
			t.Fatal(err)
		}
		if cfg.Arch != "hf" || cfg.Positions != 64 || cfg.Vocab != 300 || cfg.Tokenizer != "wordpiece" {
			t.Fatalf("config after ApplyInitFrom: %+v", cfg)
		}
		ref := initEval(t, cfg, 1)
		for _, tp := range []int{2, 4} {
			if l := initEval(t, cfg, tp); math.Abs(l-ref) > 1e-5 {
				t.Errorf("head %v tp %d: eval loss %.7f, tp 1 %.7f", head, tp, l, ref)
			}
		}
		if !head {
			continue
		}
		// The same weights as BertModel's unprefixed names in 3 shards.
		cfg.InitFrom = tinyBERTAs(t, tinyBERTSpec, true, interop.HFOptions{Shards: 3})
		if l := initEval(t, cfg, 2); math.Abs(l-ref) > 1e-5 {
			t.Errorf("sharded: eval loss %.7f at tp 2, one file at tp 1 %.7f", l, ref)
		}
	}
}

// TestBERTGradients: the post-LN BERT's gradients match finite
// differences of its loss, for a weight of every kind of layer.
func TestBERTGradients(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.Arch, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.BatchSize = "hf", 2, 16, 2, 8, 3
	dev := tensor.NewCPU()
	m, err := newBERT(cfg, 50, nil, dev)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(8, 8))
	// Weights of BERT's scale, and the pooler's tanh well off its linear
	// part, so that every term of the gradient shows.
	for _, p := range m.Params() {
		vals := make([]float32, p.Data.Len())
		dev.CopyToHost(vals, p.Data)
		for i := range vals {
			vals[i] += float32(r.NormFloat64() * 0.1)
			if p.Name == "pooler.dense.bias" {
				vals[i] = 1.2
			}
		}
		dev.CopyFromHost(p.Data, vals)
	}
	b := &data.Batch{B: 3, T: 8, Tokens: make([]int32, 24), Labels: []int32{0, 1, 1}, Lengths: []int32{8, 5, 3}}
	for i := range b.Tokens {
		b.Tokens[i] = int32(r.IntN(50))
	}
	m.MarkGradsStale()
	if _, err := m.Forward(b, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(1); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		l, err := m.Forward(b, false)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, p := range m.Params() {
		n := p.Data.Len()
		grad := make([]float32, n)
		vals := make([]float32, n)
		dev.CopyToHost(grad, p.Grad)
		dev.CopyToHost(vals, p.Data)
		i := r.IntN(n)
		if strings.HasPrefix(p.Name, "embeddings.word_embeddings") {
			i = int(b.Tokens[0])*cfg.Dim + r.IntN(cfg.Dim)
		}
		if strings.HasPrefix(p.Name, "embeddings.token_type") {
			i = r.IntN(cfg.Dim) // row 0: the type every token has
		}
		const eps = 1e-2
		at := func(v float32) float64 {
			vals[i] = v
			dev.CopyFromHost(p.Data, vals)
			return loss()
		}
		v := vals[i]
		num := (at(v+eps) - at(v-eps)) / (2 * eps)
		at(v)
		if d := math.Abs(num - float64(grad[i])); d > 2e-3+0.05*math.Abs(num) {
			t.Errorf("%s[%d]: gradient %.6f, finite difference %.6f", p.Name, i, grad[i], num)
		}
	}
}

// TestBERTLearnsAndExports: the hf BERT trains on the synthetic set at tp 2
// (its loss falls), and ckpt's merge written by WriteHFBERT is read back
// by init_from to the same validation loss.
func TestBERTLearnsAndExports(t *testing.T) {
	cfg := smallConfig("bert")
	cfg.InitFrom = tinyBERT(t, tinyBERTSpec, false)
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		t.Fatal(err)
	}
	cfg.NTasks, cfg.TP, cfg.Steps, cfg.EvalEvery, cfg.LR, cfg.Samples = 2, 2, 30, 30, 1e-3, 480
	runDir := t.TempDir()
	var res *Result
	err := nccl.RunInProcess(2, func(c nccl.Comm) error {
		r, err := Run(t.Context(), cfg, c, Options{RunDir: runDir})
		if c.Rank() == 0 {
			res = r
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	first, last := res.Evals[0], res.Evals[len(res.Evals)-1]
	if !(last.Loss < first.Loss) {
		t.Errorf("validation loss %.4f at step 0, %.4f after 30 steps: not learning", first.Loss, last.Loss)
	}
	dir, err := ckpt.Latest(filepath.Join(runDir, "ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ckpt.Open(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	tensors, _, err := c.Merge()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "exported")
	if err := interop.WriteHFBERT(out, tinyBERTSpec, tensors, interop.HFOptions{Prefix: "bert."}); err != nil {
		t.Fatal(err)
	}
	back := cfg
	back.InitFrom, back.NTasks, back.TP = out, 2, 2
	if got := initEval(t, back, 2); got != last.Loss {
		t.Errorf("eval loss from the export %.9f, after training %.9f", got, last.Loss)
	}
}

// TestInitFromBERTRejects: a BERT whose token type table does not have the
// config's rows is refused naming the file and the tensor.
func TestInitFromBERTRejects(t *testing.T) {
	dir := tinyBERT(t, tinyBERTSpec, true)
	path := filepath.Join(dir, interop.HFConfig)
	b, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `"type_vocab_size": 2`, `"type_vocab_size": 3`, 1)), 0o644)
	cfg := smallConfig("bert")
	cfg.InitFrom = dir
	err := ApplyInitFrom(&cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "model.safetensors: tensor bert.embeddings.token_type_embeddings.weight is [2 32], the model's config needs [3 32]") {
		t.Errorf("type_vocab_size 3 against a 2-row table: %v", err)
	}
}

// TestBERTSamplesEndInSEP: arch hf's samples are [CLS] text [SEP] [PAD]...,
// as BERT's tokenizer makes them; hpcrun's own layout has no [SEP].
func TestBERTSamplesEndInSEP(t *testing.T) {
	for _, arch := range []string{"hf", ""} {
		cfg := smallConfig("bert")
		cfg.Arch, cfg.Samples = arch, 64
		ds, err := data.Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		sp := ds.Tokenizer.Specials()
		d := ds.Train
		for i := 0; i < d.Len(); i++ {
			n := int(d.Lengths[i])
			row := d.Tokens[i*d.Seq : (i+1)*d.Seq]
			if row[0] != int32(sp.CLS) || (row[n-1] == int32(sp.EOT)) != (arch == "hf") || (n < d.Seq && row[n] != int32(sp.Pad)) {
				t.Fatalf("arch %q: sample %d is %v (length %d)", arch, i, row, n)
			}
		}
	}
}
