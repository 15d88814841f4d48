package interop

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// llamaConfig is the part of a LlamaForCausalLM config.json hpcrun reads.
type llamaConfig struct {
	Hidden        int          `json:"hidden_size"`
	Intermediate  int          `json:"intermediate_size"`
	Heads         int          `json:"num_attention_heads"`
	KVHeads       int          `json:"num_key_value_heads"`
	Layers        int          `json:"num_hidden_layers"`
	HeadDim       int          `json:"head_dim"`
	NormEps       float64      `json:"rms_norm_eps"`
	RopeTheta     float64      `json:"rope_theta"`
	Positions     int          `json:"max_position_embeddings"`
	VocabSize     int          `json:"vocab_size"`
	TieEmbeddings *bool        `json:"tie_word_embeddings"`
	Act           string       `json:"hidden_act"`
	AttnBias      bool         `json:"attention_bias"`
	MLPBias       bool         `json:"mlp_bias"`
	RopeScaling   *ropeScaling `json:"rope_scaling"`
	// RopeParameters is transformers v5's rope_scaling, with rope_theta
	// inside it.
	RopeParameters *ropeScaling `json:"rope_parameters"`
}

// ropeScaling is a config.json's rope_scaling (or rope_parameters).
type ropeScaling struct {
	RopeType       string  `json:"rope_type"`
	Type           string  `json:"type"`
	RopeTheta      float64 `json:"rope_theta"`
	Factor         float64 `json:"factor"`
	LowFreqFactor  float64 `json:"low_freq_factor"`
	HighFreqFactor float64 `json:"high_freq_factor"`
	Original       int     `json:"original_max_position_embeddings"`
}

func isLlama(modelType string, archs []string) bool {
	for _, a := range archs {
		if a == "LlamaForCausalLM" || a == "LlamaModel" {
			return true
		}
	}
	return modelType == "llama"
}

// readLlamaConfig reads a Llama config.json (path, contents b) into a Spec;
// options hpcrun's Llama has not (biases, another activation, a head size
// other than hidden_size/heads, rope scalings but Llama 3's) are refused.
func readLlamaConfig(path string, b []byte) (Spec, error) {
	var c llamaConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return Spec{}, fmt.Errorf("%s: %v", path, err)
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads // Hugging Face's default
	}
	s := Spec{Model: "llama", Layers: c.Layers, Dim: c.Hidden, Heads: c.Heads, KVHeads: c.KVHeads, FFN: c.Intermediate,
		Positions: c.Positions, Vocab: c.VocabSize, NormEps: c.NormEps, RopeTheta: c.RopeTheta, Source: path}
	for _, k := range []struct {
		key string
		v   int
	}{{"num_hidden_layers", s.Layers}, {"hidden_size", s.Dim}, {"num_attention_heads", s.Heads}, {"num_key_value_heads", s.KVHeads},
		{"intermediate_size", s.FFN}, {"max_position_embeddings", s.Positions}, {"vocab_size", s.Vocab}} {
		if k.v <= 0 {
			return Spec{}, fmt.Errorf("%s: %s = %d: missing or not positive", path, k.key, k.v)
		}
	}
	if s.Dim%s.Heads != 0 || s.Heads%s.KVHeads != 0 {
		return Spec{}, fmt.Errorf("%s: hidden_size %d, num_attention_heads %d, num_key_value_heads %d: want whole heads and whole groups of heads", path, s.Dim, s.Heads, s.KVHeads)
	}
	if c.HeadDim != 0 && c.HeadDim != s.Dim/s.Heads {
		return Spec{}, fmt.Errorf("%s: head_dim %d: hpcrun's Llama has heads of hidden_size/num_attention_heads = %d", path, c.HeadDim, s.Dim/s.Heads)
	}
	if c.Act != "" && c.Act != "silu" {
		return Spec{}, fmt.Errorf("%s: hidden_act %q: hpcrun's Llama MLP is SwiGLU (silu)", path, c.Act)
	}
	if c.AttnBias || c.MLPBias {
		return Spec{}, fmt.Errorf("%s: attention_bias or mlp_bias true: hpcrun's Llama has no biases", path)
	}
	if !(s.NormEps > 0) {
		return Spec{}, fmt.Errorf("%s: rms_norm_eps %g: want a positive number", path, s.NormEps)
	}
	if p := c.RopeParameters; p != nil {
		switch {
		case c.RopeScaling != nil:
			return Spec{}, fmt.Errorf("%s: both rope_parameters and rope_scaling: give one", path)
		case c.RopeTheta != 0 && p.RopeTheta != 0 && c.RopeTheta != p.RopeTheta:
			return Spec{}, fmt.Errorf("%s: rope_theta %g and rope_parameters.rope_theta %g differ", path, c.RopeTheta, p.RopeTheta)
		}
		if p.RopeTheta != 0 {
			s.RopeTheta = p.RopeTheta
		}
		if kind := p.RopeType + p.Type; kind != "" && kind != "default" {
			c.RopeScaling = p
		}
	}
	if s.RopeTheta == 0 {
		s.RopeTheta = 10000
	}
	s.UntiedHead = c.TieEmbeddings == nil || !*c.TieEmbeddings // LlamaConfig's default is untied
	if r := c.RopeScaling; r != nil {
		kind := r.RopeType
		if kind == "" {
			kind = r.Type
		}
		if kind != "llama3" {
			return Spec{}, fmt.Errorf("%s: rope_scaling of type %q: hpcrun applies Llama 3's (llama3) only", path, kind)
		}
		s.RopeFactor, s.RopeLowFreq, s.RopeHighFreq, s.RopeOriginalSeq = r.Factor, r.LowFreqFactor, r.HighFreqFactor, r.Original
		if !(r.Factor > 0) || !(r.LowFreqFactor > 0) || !(r.HighFreqFactor > r.LowFreqFactor) || r.Original < 1 {
			return Spec{}, fmt.Errorf("%s: rope_scaling %+v: want factor > 0, 0 < low_freq_factor < high_freq_factor, original_max_position_embeddings >= 1", path, *r)
		}
	}
	return s, nil
}

// llamaFileTensors are the tensors a LlamaForCausalLM file holds, under
// their Hugging Face names (lm_head only when untied: a tied model's is
// the embedding, stored or not).
func llamaFileTensors(s Spec) []fileTensor {
	C, V, F := s.Dim, s.Vocab, s.FFN
	kv := s.KVHeads * (s.Dim / s.Heads)
	out := []fileTensor{{"model.embed_tokens.weight", []int{V, C}, false}}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		out = append(out,
			fileTensor{p + "input_layernorm.weight", []int{C}, false},
			fileTensor{p + "self_attn.q_proj.weight", []int{C, C}, false},
			fileTensor{p + "self_attn.k_proj.weight", []int{kv, C}, false},
			fileTensor{p + "self_attn.v_proj.weight", []int{kv, C}, false},
			fileTensor{p + "self_attn.o_proj.weight", []int{C, C}, false},
			fileTensor{p + "post_attention_layernorm.weight", []int{C}, false},
			fileTensor{p + "mlp.gate_proj.weight", []int{F, C}, false},
			fileTensor{p + "mlp.up_proj.weight", []int{F, C}, false},
			fileTensor{p + "mlp.down_proj.weight", []int{C, F}, false},
		)
	}
	out = append(out, fileTensor{"model.norm.weight", []int{C}, false})
	if s.UntiedHead {
		out = append(out, fileTensor{"lm_head.weight", []int{V, C}, false})
	}
	return out
}

// loadLlama returns this rank's piece of hpcrun's Llama parameter name.
// The fused projections are read from the file's separate ones: qkv_proj
// holds kv_heads groups of [the group's query heads | its key head | its
// value head], split by whole groups (this rank's groups' rows of
// q_proj, k_proj and v_proj), or, when tp is a multiple of kv_heads, a
// share of one group's query heads with its key and value head, which
// the replicas read from the same offsets; gate_up_proj is [gate; up], this rank's rows
// of each (parallel.LlamaAttention, parallel.SwiGLUMLP).
func (w *hfWeights) loadLlama(name string, full []int, sh parallel.Shard) ([]float32, error) {
	s := w.spec
	switch {
	case strings.HasSuffix(name, ".self_attn.qkv_proj.weight"):
		p := strings.TrimSuffix(name, "qkv_proj.weight")
		hd := s.Dim / s.Heads
		g := s.Heads / s.KVHeads
		if err := checkShape(s.Source, name, full, []int{(s.Heads + 2*s.KVHeads) * hd, s.Dim}); err != nil {
			return nil, err
		}
		var runs []rowRun
		lo, n := localRange(s.KVHeads, sh)
		q0, qn := 0, g // this rank's query heads of each group
		if sh.Replicas > 1 && !sh.Replicated() {
			// The group's key/value head replicated over Replicas ranks,
			// each with its share of the query heads (parallel.KVSplit).
			lo, n = sh.Index/sh.Replicas, 1
			qn = g / sh.Replicas
			q0 = sh.Index % sh.Replicas * qn
		}
		for k := lo; k < lo+n; k++ {
			runs = append(runs, rowRun{p + "q_proj.weight", (k*g + q0) * hd, qn * hd}, rowRun{p + "k_proj.weight", k * hd, hd}, rowRun{p + "v_proj.weight", k * hd, hd})
		}
		return w.readRows(runs, s.Dim)
	case strings.HasSuffix(name, ".mlp.gate_up_proj.weight"):
		p := strings.TrimSuffix(name, "gate_up_proj.weight")
		if err := checkShape(s.Source, name, full, []int{2 * s.FFN, s.Dim}); err != nil {
			return nil, err
		}
		lo, n := localRange(s.FFN, sh)
		return w.readRows([]rowRun{{p + "gate_proj.weight", lo, n}, {p + "up_proj.weight", lo, n}}, s.Dim)
	}
	if _, ok := w.where[name]; !ok {
		return nil, fmt.Errorf("%s: the model has a tensor %s that the Llama has not", s.Source, name)
	}
	return loadPiece(w.source(name, false, name == "model.embed_tokens.weight" || name == "lm_head.weight"), full, sh)
}

// localRange is this rank's part [lo, lo+n) of n units split over sh's
// parts along its first dimension (all of them when replicated).
func localRange(units int, sh parallel.Shard) (lo, n int) {
	if sh.Replicated() {
		return 0, units
	}
	n = units / sh.Parts
	return sh.Index * n, n
}

// rowRun is rows [first, first+rows) of the file tensor name.
type rowRun struct {
	name        string
	first, rows int
}

// readRows reads runs of rows of cols values each, one after the other.
func (w *hfWeights) readRows(runs []rowRun, cols int) ([]float32, error) {
	total := 0
	for _, r := range runs {
		total += r.rows * cols
	}
	out := make([]float32, total)
	k := 0
	for _, r := range runs {
		if _, ok := w.where[r.name]; !ok {
			return nil, fmt.Errorf("%s: no tensor %s", w.spec.Source, r.name)
		}
		src := w.source(r.name, false, false)
		if err := src.read(r.first*cols, out[k:k+r.rows*cols]); err != nil {
			return nil, err
		}
		k += r.rows * cols
	}
	return out, nil
}

// LlamaSpec is the Spec of a Llama run of cfg with vocab real ids (what
// WriteLlamaHF writes into config.json).
func LlamaSpec(cfg config.Config, vocab int) Spec {
	eps, theta := cfg.NormEpsilon(), cmp.Or(cfg.RopeTheta, config.DefaultRopeTheta) // eps as written, not its float32
	return Spec{Model: "llama", Layers: cfg.Layers, Dim: cfg.Dim, Heads: cfg.Heads, KVHeads: cfg.KVHeadCount(), FFN: cfg.Hidden(),
		Positions: cfg.PositionRows(), Vocab: vocab, NormEps: eps, RopeTheta: theta, RopeFactor: cfg.RopeFactor, RopeLowFreq: cfg.RopeLowFreq,
		RopeHighFreq: cfg.RopeHighFreq, RopeOriginalSeq: cfg.RopeOriginalSeq, UntiedHead: cfg.UntiedHead, Seq: cfg.Seq}
}

// WriteLlamaHF writes dir/config.json (LlamaForCausalLM) and the weights
// under Hugging Face's names from hpcrun's Llama tensors (ckpt's Merge of
// a Llama checkpoint: hpcrun's names, (out, in), the vocabulary
// unpadded), the fused projections split back into q_proj, k_proj, v_proj
// and gate_proj, up_proj; a tied model stores no lm_head. With
// opt.Tokenizer it copies that tokenizer.json (or its directory's) beside
// them. Open reads the
// directory back to the same values.
func WriteLlamaHF(dir string, spec Spec, tensors []ckpt.Tensor, opt HFOptions) error {
	byName := map[string]ckpt.Tensor{}
	for _, t := range tensors {
		byName[t.Name] = t
	}
	get := func(name string, shape []int) (ckpt.Tensor, error) {
		x, ok := byName[name]
		if !ok {
			return x, fmt.Errorf("export: no tensor %s", name)
		}
		return x, checkShape("export", name, x.Shape, shape)
	}
	C, F, hd := spec.Dim, spec.FFN, spec.Dim/spec.Heads
	g := spec.Heads / spec.KVHeads
	rows := func(x ckpt.Tensor, name string, parts [][2]int) ckpt.Tensor {
		out := ckpt.Tensor{Name: opt.Prefix + name}
		for _, p := range parts {
			out.Data = append(out.Data, x.Data[p[0]*C:(p[0]+p[1])*C]...)
			if len(out.Shape) == 0 {
				out.Shape = []int{0, C}
			}
			out.Shape[0] += p[1]
		}
		return out
	}
	var out []ckpt.Tensor
	for _, t := range llamaFileTensors(spec) {
		name := t.name
		switch {
		case strings.HasSuffix(name, ".self_attn.q_proj.weight"), strings.HasSuffix(name, ".self_attn.k_proj.weight"), strings.HasSuffix(name, ".self_attn.v_proj.weight"):
			p := name[:strings.LastIndex(name, ".self_attn.")]
			x, err := get(p+".self_attn.qkv_proj.weight", []int{(spec.Heads + 2*spec.KVHeads) * hd, C})
			if err != nil {
				return err
			}
			var parts [][2]int
			for k := 0; k < spec.KVHeads; k++ {
				base := k * (g + 2) * hd
				switch {
				case strings.HasSuffix(name, "q_proj.weight"):
					parts = append(parts, [2]int{base, g * hd})
				case strings.HasSuffix(name, "k_proj.weight"):
					parts = append(parts, [2]int{base + g*hd, hd})
				default:
					parts = append(parts, [2]int{base + (g+1)*hd, hd})
				}
			}
			out = append(out, rows(x, name, parts))
		case strings.HasSuffix(name, ".mlp.gate_proj.weight"), strings.HasSuffix(name, ".mlp.up_proj.weight"):
			p := name[:strings.LastIndex(name, ".mlp.")]
			x, err := get(p+".mlp.gate_up_proj.weight", []int{2 * F, C})
			if err != nil {
				return err
			}
			first := 0
			if strings.HasSuffix(name, "up_proj.weight") {
				first = F
			}
			out = append(out, rows(x, name, [][2]int{{first, F}}))
		default:
			x, err := get(name, t.shape)
			if err != nil {
				return err
			}
			x.Name = opt.Prefix + name
			out = append(out, x)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	cfg := llamaConfigJSON(spec)
	cfg["torch_dtype"] = torchDType(opt.DType)
	if opt.Tokenizer != "" {
		path := opt.Tokenizer
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			path = filepath.Join(path, "tokenizer.json")
		}
		tok, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		// The files beside it name the special tokens: copied, and their
		// ids written into config.json, so that a loader does not fall
		// back to LlamaConfig's defaults (bos 1, eos 2).
		side := map[string][]byte{}
		for _, name := range []string{"tokenizer_config.json", "generation_config.json"} {
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(path), name)); err == nil {
				side[name] = b
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
					return fmt.Errorf("export: %w", err)
				}
			}
		}
		for key, id := range specialIDs(tok, side["tokenizer_config.json"], side["generation_config.json"]) {
			cfg[key] = id
		}
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, HFConfig), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return writeWeights(dir, out, opt)
}

// llamaConfigJSON is the config.json of a LlamaForCausalLM of spec (without
// the special tokens' ids). Floats are written as their float64's
// shortest decimal (rms_norm_eps 1e-5 as 0.00001).
func llamaConfigJSON(spec Spec) map[string]any {
	C, F, hd := spec.Dim, spec.FFN, spec.Dim/spec.Heads
	var scaling any
	if spec.RopeFactor != 0 {
		scaling = map[string]any{"rope_type": "llama3", "factor": spec.RopeFactor, "low_freq_factor": spec.RopeLowFreq,
			"high_freq_factor": spec.RopeHighFreq, "original_max_position_embeddings": spec.RopeOriginalSeq}
	}
	m := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": C, "intermediate_size": F, "num_attention_heads": spec.Heads, "num_key_value_heads": spec.KVHeads,
		"num_hidden_layers": spec.Layers, "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": spec.NormEps,
		"rope_theta": spec.RopeTheta, "rope_scaling": scaling, "max_position_embeddings": spec.Positions, "vocab_size": spec.Vocab,
		"tie_word_embeddings": !spec.UntiedHead, "attention_bias": false, "mlp_bias": false, "torch_dtype": "float32",
	}
	if spec.Seq > 0 {
		m["hpcrun_seq"] = spec.Seq
	}
	return m
}

// specialIDs are config.json's bos_token_id and eos_token_id: a
// generation_config.json's, else the ids in tokenizer.json's added tokens
// of tokenizer_config.json's bos_token and eos_token (a text, or an object
// with its content). Those it cannot find are left out.
func specialIDs(tokenizer, tokenizerConfig, generationConfig []byte) map[string]any {
	out := map[string]any{}
	var gen map[string]any
	if json.Unmarshal(generationConfig, &gen) == nil {
		for _, key := range []string{"bos_token_id", "eos_token_id"} {
			if v, ok := gen[key]; ok && v != nil {
				out[key] = v
			}
		}
	}
	var tok struct {
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	var conf map[string]json.RawMessage
	if json.Unmarshal(tokenizer, &tok) != nil || json.Unmarshal(tokenizerConfig, &conf) != nil {
		return out
	}
	for key, name := range map[string]string{"bos_token_id": "bos_token", "eos_token_id": "eos_token"} {
		if _, ok := out[key]; ok {
			continue
		}
		var text string
		if json.Unmarshal(conf[name], &text) != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if json.Unmarshal(conf[name], &obj) != nil {
				continue
			}
			text = obj.Content
		}
		for _, a := range tok.Added {
			if text != "" && a.Content == text {
				out[key] = a.ID
			}
		}
	}
	return out
}
