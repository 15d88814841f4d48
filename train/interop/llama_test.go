package interop

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// A Llama config.json hpcrun cannot run as written is refused with a
// one-line error that names the key.
func TestLlamaConfigRefused(t *testing.T) {
	base := `"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 128, "vocab_size": 320`
	for _, tc := range []struct{ extra, want string }{
		{``, ""},
		{`, "rope_scaling": {"rope_type": "linear", "factor": 2}`, `rope_scaling of type "linear"`},
		{`, "attention_bias": true`, "no biases"},
		{`, "hidden_act": "gelu"`, `hidden_act "gelu"`},
		{`, "head_dim": 32`, "head_dim 32"},
		{`, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 32}`, "low_freq_factor < high_freq_factor"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, HFConfig), []byte("{"+base+tc.extra+"}"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := ReadHFConfig(dir)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("plain config: %v", err)
		case tc.want == "" && (s.Model != "llama" || s.KVHeads != 2 || s.FFN != 160 || s.RopeTheta != 10000 || !s.UntiedHead):
			t.Errorf("plain config: %+v", s)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.extra, err, tc.want)
		}
	}
}

// WriteLlamaHF's directory, sharded into files, reads back through Open to
// the values written: every hpcrun parameter, unsharded and as each rank
// of tp 2 holds it (the fused projections from the split files, the
// embedding's padded rows zero).
func TestLlamaExportRoundTrip(t *testing.T) {
	spec := Spec{Model: "llama", Layers: 2, Dim: 16, Heads: 4, KVHeads: 2, FFN: 24, Positions: 32, Vocab: 30, NormEps: 1e-6, RopeTheta: 500,
		RopeFactor: 8, RopeLowFreq: 1, RopeHighFreq: 4, RopeOriginalSeq: 16, UntiedHead: true}
	C, W, F, padded := 16, (4+2*2)*4, 24, 36
	type param struct {
		name  string
		full  []int
		dim   int // split dimension at tp 2; -1 replicated
		block int
	}
	ps := []param{{"model.embed_tokens.weight", []int{padded, C}, 0, 1}}
	for l := 0; l < 2; l++ {
		p := "model.layers." + string(rune('0'+l)) + "."
		ps = append(ps, param{p + "input_layernorm.weight", []int{C}, -1, 1}, param{p + "self_attn.qkv_proj.weight", []int{W, C}, 0, 1},
			param{p + "self_attn.o_proj.weight", []int{C, C}, 1, 1}, param{p + "post_attention_layernorm.weight", []int{C}, -1, 1},
			param{p + "mlp.gate_up_proj.weight", []int{2 * F, C}, 0, 2}, param{p + "mlp.down_proj.weight", []int{C, F}, 1, 1})
	}
	ps = append(ps, param{"model.norm.weight", []int{C}, -1, 1}, param{"lm_head.weight", []int{padded, C}, 0, 1})
	r := rand.New(rand.NewPCG(1, 2))
	values := map[string][]float32{}
	var tensors []ckpt.Tensor
	for _, p := range ps {
		n := 1
		for _, d := range p.full {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		shape := append([]int(nil), p.full...)
		if shape[0] == padded { // the tables' padding rows: zero, not written
			clear(v[spec.Vocab*C:])
			shape[0] = spec.Vocab
		}
		values[p.name] = v
		tensors = append(tensors, ckpt.Tensor{Name: p.name, Shape: shape, Data: v[:numel(shape)]})
	}
	dir := t.TempDir()
	if err := WriteLlamaHF(dir, spec, tensors, HFOptions{Shards: 3}); err != nil {
		t.Fatal(err)
	}
	w, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	got := w.Spec()
	got.Source = ""
	if got != spec {
		t.Errorf("spec read back %+v, written %+v", got, spec)
	}
	for _, p := range ps {
		shards := []parallel.Shard{{Parts: 1}}
		if p.dim >= 0 {
			for i := 0; i < 2; i++ {
				shards = append(shards, parallel.Shard{Dim: p.dim, Parts: 2, Index: i, Blocks: p.block})
			}
		}
		for _, sh := range shards {
			want, err := sh.Take(values[p.name], p.full)
			if err != nil {
				t.Fatal(err)
			}
			have, err := w.Load(p.name, p.full, sh)
			if err != nil {
				t.Fatalf("%s %v: %v", p.name, sh, err)
			}
			if !slices.Equal(have, want) {
				t.Errorf("%s %v: read back differs", p.name, sh)
			}
		}
	}
}

// transformers v5 writes rope_theta and the scaling inside
// rope_parameters: read there, a conflict refused.
func TestRopeParametersRead(t *testing.T) {
	base := `{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":2,"num_hidden_layers":2,"max_position_embeddings":128,"vocab_size":256,"rms_norm_eps":1e-5,"tie_word_embeddings":true,`
	s, err := readLlamaConfig("config.json", []byte(base+`"rope_parameters":{"rope_type":"llama3","rope_theta":500000,"factor":32,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`))
	if err != nil || s.RopeTheta != 500000 || s.RopeFactor != 32 || s.RopeOriginalSeq != 8192 {
		t.Errorf("llama3 rope_parameters: theta %g factor %g original %d, %v", s.RopeTheta, s.RopeFactor, s.RopeOriginalSeq, err)
	}
	s, err = readLlamaConfig("config.json", []byte(base+`"rope_parameters":{"rope_type":"default","rope_theta":100000}}`))
	if err != nil || s.RopeTheta != 100000 || s.RopeFactor != 0 {
		t.Errorf("default rope_parameters: theta %g factor %g, %v", s.RopeTheta, s.RopeFactor, err)
	}
	for _, bad := range []string{
		`"rope_theta":10000,"rope_parameters":{"rope_type":"default","rope_theta":500000}}`,
		`"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192},"rope_parameters":{"rope_type":"default","rope_theta":500000}}`,
		`"rope_parameters":{"rope_type":"yarn","rope_theta":500000,"factor":4}}`,
	} {
		if _, err := readLlamaConfig("config.json", []byte(base+bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// The exported config.json names the special tokens: a
// generation_config.json's ids first, else tokenizer_config.json's tokens
// looked up among tokenizer.json's added tokens.
func TestSpecialIDs(t *testing.T) {
	tok := []byte(`{"added_tokens":[{"id":256,"content":"<|begin_of_text|>"},{"id":257,"content":"<|end_of_text|>"}]}`)
	conf := []byte(`{"bos_token":"<|begin_of_text|>","eos_token":{"content":"<|end_of_text|>"}}`)
	got := specialIDs(tok, conf, nil)
	if got["bos_token_id"] != 256 || got["eos_token_id"] != 257 {
		t.Errorf("from tokenizer_config.json: %v", got)
	}
	got = specialIDs(tok, conf, []byte(`{"eos_token_id":[257,258]}`))
	if fmt.Sprint(got["eos_token_id"]) != "[257 258]" || got["bos_token_id"] != 256 {
		t.Errorf("with generation_config.json: %v", got)
	}
	if got := specialIDs(tok, nil, nil); len(got) != 0 {
		t.Errorf("no config: %v", got)
	}
}

// An unset norm_eps is exported as Llama's 1e-5, the shortest decimal of
// the config's float64, not as its float32 (9.999999747e-06).
func TestLlamaSpecNormEps(t *testing.T) {
	cfg := config.DefaultConfig()
	if err := cfg.ApplyPreset("llama-tiny"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		eps, want float64
		text      string
	}{{0, 1e-5, `"rms_norm_eps": 0.00001,`}, {1e-6, 1e-6, `"rms_norm_eps": 0.000001,`}} {
		cfg.NormEps = tc.eps
		spec := LlamaSpec(cfg, 300)
		if spec.NormEps != tc.want {
			t.Errorf("norm_eps %g: spec has %v, want %v", tc.eps, spec.NormEps, tc.want)
		}
		b, err := json.MarshalIndent(llamaConfigJSON(spec), "", "  ") // as WriteLlamaHF writes it
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.text) {
			t.Errorf("norm_eps %g: config.json has no %s:\n%s", tc.eps, tc.text, b)
		}
	}
}
