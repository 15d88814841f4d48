package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// writeGPT2Dir writes a Hugging Face GPT-2 directory of spec with random
// weights (GPT-2's init scale), as transformers would save it.
func writeGPT2Dir(t *testing.T, dir string, spec interop.Spec, opt interop.HFOptions) {
	t.Helper()
	r := rand.New(rand.NewPCG(9, 9))
	var tensors []ckpt.Tensor
	for _, x := range interop.GPT2Tensors(spec) {
		shape := x.Shape
		if x.Conv1D {
			shape = []int{x.Shape[1], x.Shape[0]}
		}
		vals := make([]float32, shape[0]*max(1, prod(shape[1:])))
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * 0.02)
			if strings.Contains(x.Name, "ln_") && strings.HasSuffix(x.Name, ".weight") {
				vals[i] = 1
			}
		}
		tensors = append(tensors, ckpt.Tensor{Name: x.Name, Shape: shape, Data: vals})
	}
	if err := interop.WriteHF(dir, spec, tensors, opt); err != nil {
		t.Fatal(err)
	}
}

func prod(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// TestPretrainedWorkflow is the README's four commands on a small GPT-2
// with GPT-2's vocabulary (a sharded Hugging Face directory): tokenize a
// text, fine-tune at tp 2 from the directory, sample from the run (greedy:
// the same at --nproc 1 and 2), export it back and evaluate the export
// and the run to the same loss. A flag that contradicts the directory is
// refused before anything starts.
func TestPretrainedWorkflow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the hpcrun binary: -short")
	}
	e := newEnv(t)
	hf := filepath.Join(e.dir, "gpt2")
	writeGPT2Dir(t, hf, interop.Spec{Model: "gpt", Layers: 2, Dim: 32, Heads: 4, Positions: 64, Vocab: 50257}, interop.HFOptions{Shards: 2})
	text := filepath.Join(e.dir, "input.txt")
	os.WriteFile(text, []byte(strings.Repeat("First Citizen: Before we proceed any further, hear me speak. ", 60)), 0o644)

	e.mustRun("data", "tokenize", text, "-o", "train.bin")
	_, errOut, code := e.run("run", "--nproc", "2", "--tp", "2", "--init-from", hf, "--dim", "64", "--data", "train.bin")
	if code != 2 || !strings.Contains(errOut, "--dim 64 contradicts "+filepath.Join(hf, "config.json")) {
		t.Errorf("--dim 64 against a dim-32 directory: exit %d, %s", code, errOut)
	}
	e.mustRun("run", "--nproc", "2", "--tp", "2", "--init-from", hf, "--data", "train.bin",
		"--seq", "32", "--bsz", "4", "--steps", "4", "--lr", "1e-3", "--eval-every", "2", "--device", "cpu")
	execID := filepath.Base(e.onlyRun())
	b, _ := os.ReadFile(filepath.Join(e.dir, "runs", execID, "metrics", "rank-00000.jsonl"))
	if !strings.Contains(string(b), `"type":"eval","step":0`) {
		t.Errorf("no validation at step 0 in the metrics")
	}

	gen := func(nproc string) string {
		return e.mustRun("generate", execID, "--prompt", "First", "--tokens", "8", "--temperature", "0", "--nproc", nproc, "--device", "cpu")
	}
	one, two := gen("1"), gen("2")
	t.Logf("generate: %q", one)
	if one != two || !strings.HasPrefix(one, "First") || len(one) <= len("First\n") {
		t.Errorf("greedy samples: --nproc 1 %q, --nproc 2 %q", one, two)
	}

	if out := e.mustRun("ckpt", "export", "--json", execID, "--hf", "exported"); !strings.Contains(out, `"output":"exported"`) {
		t.Errorf("ckpt export --json: %q", out)
	}
	e.mustRun("ckpt", "export", execID, "--hf", "exported-bf16", "--dtype", "bf16")
	if h, err := ckpt.ReadHeader(filepath.Join(e.dir, "exported-bf16", "model.safetensors")); err != nil || len(h.Tensors) == 0 || h.Tensors[0].DType != "BF16" {
		t.Errorf("ckpt export --dtype bf16: %v, %v", h, err)
	}
	// GPT-2's tokenizer files come with it, and encode as the run did.
	for _, name := range []string{"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(e.dir, "exported", name)); err != nil {
			t.Errorf("the export has no %s: %v", name, err)
		}
	}
	raw, _ := os.ReadFile(text)
	if tok, err := tokenizer.LoadHF(filepath.Join(e.dir, "exported")); err != nil {
		t.Error(err)
	} else if gpt2, _ := tokenizer.NewGPT2(); !slices.Equal(tok.Encode(string(raw)), gpt2.Encode(string(raw))) {
		t.Errorf("the export's tokenizer.json encodes the text otherwise than GPT-2's BPE")
	}
	lossRe := regexp.MustCompile(`^loss (\d+\.\d+) perplexity \d+\.\d+ \(\d+ windows of seq 32\)\n$`)
	fromRun := e.mustRun("eval", execID, "--data", "train.bin", "--device", "cpu")
	fromHF := e.mustRun("eval", "exported", "--data", "train.bin", "--nproc", "2", "--device", "cpu")
	t.Logf("eval: %q", fromRun)
	if !lossRe.MatchString(fromRun) || fromRun != fromHF {
		t.Errorf("eval of the run %q, of its export at tp 2 %q", fromRun, fromHF)
	}
	var got struct {
		Loss         float64
		Seq, Windows int
	}
	if err := json.Unmarshal([]byte(e.mustRun("eval", "exported", "--data", "train.bin", "--device", "cpu", "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Seq != 32 || got.Windows < 1 || !strings.Contains(fromRun, fmt.Sprintf("(%d windows of seq 32)", got.Windows)) {
		t.Errorf("eval --json of the export: seq %d, %d windows; the run's: %q", got.Seq, got.Windows, fromRun)
	}
}

// TestInteropCommandsRefuse: bad input to tokenize, run --init-from (an
// unknown architecture, a BERT config without its sizes, seq past the
// positions), generate, eval and export is a one-line error, and nothing
// runs.
func TestInteropCommandsRefuse(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the hpcrun binary: -short")
	}
	e := newEnv(t)
	hf := filepath.Join(e.dir, "gpt2")
	writeGPT2Dir(t, hf, interop.Spec{Model: "gpt", Layers: 1, Dim: 8, Heads: 2, Positions: 16, Vocab: 300}, interop.HFOptions{})
	bert := filepath.Join(e.dir, "bert")
	os.MkdirAll(bert, 0o755)
	os.WriteFile(filepath.Join(bert, "config.json"), []byte(`{"architectures":["BertForSequenceClassification"],"model_type":"bert","hidden_size":8}`), 0o644)
	neox := filepath.Join(e.dir, "neox")
	os.MkdirAll(neox, 0o755)
	os.WriteFile(filepath.Join(neox, "config.json"), []byte(`{"architectures":["GPTNeoXForCausalLM"],"model_type":"gpt_neox"}`), 0o644)
	text := filepath.Join(e.dir, "t.txt")
	os.WriteFile(text, []byte(strings.Repeat("abc ", 200)), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"data", "tokenize", text}, 2, "usage: hpcrun data tokenize"},
		{[]string{"data", "tokenize", filepath.Join(e.dir, "none.txt"), "-o", "x.bin"}, 1, "none.txt"},
		{[]string{"run", "--init-from", neox, "--data", text}, 2, `architecture "GPTNeoXForCausalLM" (model_type "gpt_neox") is not supported`},
		{[]string{"run", "--init-from", bert, "--data", text}, 2, "bert/config.json: num_hidden_layers = 0: missing or not positive"},
		{[]string{"run", "--init-from", hf, "--data", text, "--seq", "32", "--device", "cpu"}, 2, "seq 32 is longer than the 16 positions of the model"},
		{[]string{"generate", hf, "--tokens", "0"}, 1, "tokens 0"},
		{[]string{"generate", "nosuchrun"}, 1, "nosuchrun"},
		{[]string{"eval", hf}, 2, "usage: hpcrun eval"},
		{[]string{"eval", hf, "--data", filepath.Join(e.dir, "none.bin")}, 1, "none.bin: no such file"},
		{[]string{"ckpt", "export", hf}, 2, "usage: hpcrun ckpt export"},
		{[]string{"ckpt", "export", hf, "--hf", filepath.Join(e.dir, "out"), "--dtype", "int8"}, 2, `--dtype "int8": use fp32, bf16 or fp16`},
	} {
		out, errOut, code := e.run(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("hpcrun %s: exit %d (want %d)\n%s%s(want one line with %q)", strings.Join(c.args, " "), code, c.code, out, errOut, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "runs")); err == nil {
		if runs, _ := filepath.Glob(filepath.Join(e.dir, "runs", "*")); len(runs) > 0 {
			t.Errorf("a refused command left runs %v", runs)
		}
	}
}
