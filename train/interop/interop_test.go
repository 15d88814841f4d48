package interop

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
)

var tinySpec = Spec{Model: "gpt", Layers: 2, Dim: 8, Heads: 2, Positions: 12, Vocab: 300}

// randomGPT2 makes GPT-2's tensors for s in Hugging Face's layout (Conv1D
// weights (in, out)) with values exact in F16 and BF16 (multiples of 2^-10
// below 2^-2), and the same tensors in hpcrun's layout by name.
func randomGPT2(s Spec, seed uint64) ([]ckpt.Tensor, map[string][]float32) {
	r := rand.New(rand.NewPCG(seed, 7))
	var hf []ckpt.Tensor
	ours := map[string][]float32{}
	for _, t := range GPT2Tensors(s) {
		vals := make([]float32, numel(t.Shape))
		for i := range vals {
			vals[i] = float32(r.IntN(255)-127) / 1024
		}
		ours[t.Name] = vals
		shape := t.Shape
		if t.Conv1D {
			vals, shape = ckpt.Transpose(vals, t.Shape[0], t.Shape[1]), []int{t.Shape[1], t.Shape[0]}
		}
		hf = append(hf, ckpt.Tensor{Name: t.Name, Shape: shape, Data: vals})
	}
	return hf, ours
}

// TestEveryRankReadsItsSlice: from a Hugging Face directory (one file,
// sharded with an index, F16, BF16, GPT2LMHeadModel's prefixed names) and
// from an llm.c file, every parameter's piece at tp 1, 2 and 4 equals that
// piece cut from the full tensor in hpcrun's layout, vocabulary padding
// rows zero.
func TestEveryRankReadsItsSlice(t *testing.T) {
	hf, ours := randomGPT2(tinySpec, 1)
	dirs := map[string]string{}
	for name, opt := range map[string]HFOptions{
		"single": {}, "sharded-f16": {Shards: 3, DType: "F16"}, "bf16-prefixed": {DType: "BF16", Prefix: "transformer."},
	} {
		dirs[name] = filepath.Join(t.TempDir(), name)
		if err := WriteHF(dirs[name], tinySpec, hf, opt); err != nil {
			t.Fatal(err)
		}
	}
	dirs["llmc"] = filepath.Join(t.TempDir(), "gpt2.bin")
	if err := WriteLLMC(dirs["llmc"], tinySpec, ours); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dirs["sharded-f16"], HFIndex)); err != nil {
		t.Fatal(err)
	}
	for name, path := range dirs {
		w, err := Open(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := w.Spec(); got.Layers != 2 || got.Dim != 8 || got.Heads != 2 || got.Positions != 12 || got.Vocab != 300 {
			t.Errorf("%s: spec %+v", name, got)
		}
		for _, tp := range []int{1, 2, 4} {
			padded, _ := parallel.PadVocab(tinySpec.Vocab, tp)
			for _, tt := range GPT2Tensors(tinySpec) {
				full, sh := tt.Shape, parallel.Shard{Parts: 1}
				vals := ours[tt.Name]
				switch {
				case tt.Name == "wte.weight":
					full = []int{padded, 8}
					vals = append(append([]float32(nil), vals...), make([]float32, (padded-300)*8)...)
					sh = parallel.Shard{Dim: 0, Parts: tp}
				case strings.HasSuffix(tt.Name, "c_attn.weight") || strings.HasSuffix(tt.Name, "c_attn.bias"):
					sh = parallel.Shard{Dim: 0, Parts: tp, Blocks: 3}
				case strings.HasSuffix(tt.Name, "c_fc.weight") || strings.HasSuffix(tt.Name, "c_fc.bias"):
					sh = parallel.Shard{Dim: 0, Parts: tp}
				case strings.HasSuffix(tt.Name, "c_proj.weight"):
					sh = parallel.Shard{Dim: 1, Parts: tp}
				}
				for r := 0; r < sh.Parts; r++ {
					sh.Index = r
					want, err := sh.Take(vals, full)
					if err != nil {
						t.Fatal(err)
					}
					got, err := w.Load(tt.Name, full, sh)
					if err != nil {
						t.Fatalf("%s tp %d: %v", name, tp, err)
					}
					if len(got) != len(want) {
						t.Fatalf("%s tp %d %s rank %d: %d values, want %d", name, tp, tt.Name, r, len(got), len(want))
					}
					for i := range want {
						if got[i] != want[i] {
							t.Fatalf("%s tp %d %s rank %d: value %d is %g, want %g", name, tp, tt.Name, r, i, got[i], want[i])
						}
					}
				}
			}
		}
		w.Close()
	}
}

// TestRejections: a missing or mis-shaped tensor, a truncated file, an
// unknown architecture, a bad llm.c header: one line naming the file and
// the tensor.
func TestRejections(t *testing.T) {
	hf, ours := randomGPT2(tinySpec, 2)
	write := func(t *testing.T, tensors []ckpt.Tensor) string {
		dir := t.TempDir()
		if err := WriteHF(dir, tinySpec, hf, HFOptions{}); err != nil {
			t.Fatal(err)
		}
		if tensors != nil {
			if err := ckpt.WriteFile(filepath.Join(dir, HFModel), tensors, nil); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	without := func(name string) []ckpt.Tensor {
		var out []ckpt.Tensor
		for _, x := range hf {
			if x.Name != name {
				out = append(out, x)
			}
		}
		return out
	}
	reshaped := func(name string) []ckpt.Tensor {
		out := append([]ckpt.Tensor(nil), hf...)
		for i, x := range out {
			if x.Name == name {
				out[i] = ckpt.Tensor{Name: name, Shape: []int{x.Shape[1], x.Shape[0]}, Data: x.Data}
			}
		}
		return out
	}
	cases := []struct {
		name  string
		setup func(t *testing.T) string
		want  []string
	}{
		{"missing", func(t *testing.T) string { return write(t, without("h.1.mlp.c_fc.bias")) }, []string{"model.safetensors", "no tensor h.1.mlp.c_fc.bias"}},
		{"misshaped", func(t *testing.T) string { return write(t, reshaped("h.0.attn.c_attn.weight")) }, []string{"model.safetensors", "tensor h.0.attn.c_attn.weight is [24 8]", "[8 24]"}},
		{"truncated", func(t *testing.T) string {
			dir := write(t, nil)
			p := filepath.Join(dir, HFModel)
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-10)
			return dir
		}, []string{"model.safetensors", "truncated"}},
		{"architecture", func(t *testing.T) string {
			dir := write(t, nil)
			os.WriteFile(filepath.Join(dir, HFConfig), []byte(`{"architectures":["GPTNeoXForCausalLM"],"model_type":"gpt_neox"}`), 0o644)
			return dir
		}, []string{"config.json", `architecture "GPTNeoXForCausalLM"`, "not supported"}},
		{"bert intermediate_size", bertConfigDir(`"intermediate_size":100`), []string{"config.json", "intermediate_size 100", "4 x hidden_size = 32"}},
		{"bert layer_norm_eps", bertConfigDir(`"intermediate_size":32,"layer_norm_eps":1e-5`), []string{"config.json", "layer_norm_eps 1e-05"}},
		{"bert hidden_act", bertConfigDir(`"intermediate_size":32,"hidden_act":"relu"`), []string{"config.json", `hidden_act "relu"`}},
		{"bert missing tensor", func(t *testing.T) string {
			dir := bertConfigDir(`"intermediate_size":32`)(t)
			if err := ckpt.WriteFile(filepath.Join(dir, HFModel), []ckpt.Tensor{{Name: "bert.embeddings.word_embeddings.weight", Shape: []int{30, 8}, Data: make([]float32, 240)}}, nil); err != nil {
				t.Fatal(err)
			}
			return dir
		}, []string{"model.safetensors", "no tensor embeddings.position_embeddings.weight (nor bert.embeddings.position_embeddings.weight)"}},
		{"gpt2 attention scaling", func(t *testing.T) string {
			dir := write(t, nil)
			os.WriteFile(filepath.Join(dir, HFConfig), []byte(`{"model_type":"gpt2","n_embd":8,"n_layer":2,"n_head":2,"n_positions":12,"vocab_size":300,"scale_attn_by_inverse_layer_idx":true}`), 0o644)
			return dir
		}, []string{"config.json", "scale_attn_by_inverse_layer_idx true"}},
		{"index names a missing shard", func(t *testing.T) string {
			dir := t.TempDir()
			if err := WriteHF(dir, tinySpec, hf, HFOptions{Shards: 2}); err != nil {
				t.Fatal(err)
			}
			os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
			return dir
		}, []string{"model-00002-of-00002.safetensors", "no such file"}},
		{"llm.c truncated", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "m.bin")
			if err := WriteLLMC(p, tinySpec, ours); err != nil {
				t.Fatal(err)
			}
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-4)
			return p
		}, []string{"m.bin", "truncated"}},
		{"llm.c bad magic", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "m.bin")
			os.WriteFile(p, make([]byte, 2048), 0o644)
			return p
		}, []string{"m.bin", "magic 0", "unknown format"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Open(c.setup(t))
			if err == nil {
				t.Fatal("opened")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
		})
	}
}

// TestHalfConversions: F16 and BF16 round trips of exact values, rounding
// to nearest even, subnormals and infinities.
func TestHalfConversions(t *testing.T) {
	vals := []float32{0, 1, -2.5, 65504, 1e-7, 6.1035156e-05, 5.9604645e-08, 1.0009765625, 70000}
	for _, dtype := range []string{"F16", "BF16"} {
		dir := t.TempDir()
		p := filepath.Join(dir, "x.safetensors")
		if err := writeSafetensors(p, []ckpt.Tensor{{Name: "x", Shape: []int{len(vals)}, Data: vals}}, nil, dtype); err != nil {
			t.Fatal(err)
		}
		h, err := ckpt.ReadHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(p)
		got := make([]float32, len(vals))
		if err := h.ReadValues(f, h.Tensors[0], 0, got); err != nil {
			t.Fatal(err)
		}
		f.Close()
		want := map[string][]float32{
			"F16":  {0, 1, -2.5, 65504, 1.1920929e-07, 6.1035156e-05, 5.9604645e-08, 1.0009765625, float32(posInf())},
			"BF16": {0, 1, -2.5, 65536, 1.0011718e-07, 6.1035156e-05, 5.9604645e-08, 1, 70144},
		}[dtype]
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: %g came back %g, want %g", dtype, vals[i], got[i], want[i])
			}
		}
	}
}

func posInf() float64 { var z float64; return 1 / z }

// bertConfigDir makes a directory with a tiny BERT config.json, extra
// holding more keys.
func bertConfigDir(extra string) func(t *testing.T) string {
	return func(t *testing.T) string {
		dir := t.TempDir()
		cfg := `{"architectures":["BertModel"],"model_type":"bert","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,` +
			`"max_position_embeddings":16,"type_vocab_size":2,"vocab_size":30,` + extra + `}`
		if err := os.WriteFile(filepath.Join(dir, HFConfig), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
}
