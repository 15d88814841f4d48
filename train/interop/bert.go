package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
)

// BERT's Hugging Face layout (BertModel, BertForSequenceClassification):
// nn.Linear weights stored (out, in) as hpcrun stores them, separate
// query, key and value projections (hpcrun fuses them into c_attn, Q, K, V
// blocks), post-LN blocks, token type embeddings, a tanh pooler over
// [CLS] and a classifier. hpcrun's parameters of arch "hf" keep BERT's
// names except for the four projections renamed below.

// bertConfig is the part of a BERT config.json hpcrun reads.
type bertConfig struct {
	HiddenSize       int      `json:"hidden_size"`
	Layers           int      `json:"num_hidden_layers"`
	Heads            int      `json:"num_attention_heads"`
	Intermediate     int      `json:"intermediate_size"`
	MaxPositions     int      `json:"max_position_embeddings"`
	TypeVocab        int      `json:"type_vocab_size"`
	VocabSize        int      `json:"vocab_size"`
	LayerNormEps     *float64 `json:"layer_norm_eps"`
	HiddenAct        string   `json:"hidden_act"`
	PositionEmbedTyp string   `json:"position_embedding_type"`
}

// BERTEps is the epsilon of BERT's layer norms.
const BERTEps = 1e-12

func isBERT(modelType string, archs []string) bool {
	for _, a := range archs {
		if a == "BertModel" || a == "BertForSequenceClassification" {
			return true
		}
	}
	return modelType == "bert"
}

func readBERTConfig(path string, b []byte) (Spec, error) {
	var c bertConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return Spec{}, fmt.Errorf("%s: %v", path, err)
	}
	s := Spec{Model: "bert", Arch: "hf", Layers: c.Layers, Dim: c.HiddenSize, Heads: c.Heads, Positions: c.MaxPositions,
		Vocab: c.VocabSize, TypeVocab: c.TypeVocab, Source: path}
	for _, k := range []struct {
		key string
		v   int
	}{{"num_hidden_layers", s.Layers}, {"hidden_size", s.Dim}, {"num_attention_heads", s.Heads},
		{"max_position_embeddings", s.Positions}, {"vocab_size", s.Vocab}, {"type_vocab_size", s.TypeVocab}} {
		if k.v <= 0 {
			return Spec{}, fmt.Errorf("%s: %s = %d: missing or not positive", path, k.key, k.v)
		}
	}
	if s.Dim%s.Heads != 0 {
		return Spec{}, fmt.Errorf("%s: hidden_size %d is not a multiple of num_attention_heads %d", path, s.Dim, s.Heads)
	}
	if c.Intermediate != 4*s.Dim {
		return Spec{}, fmt.Errorf("%s: intermediate_size %d: hpcrun's MLP is 4 x hidden_size = %d", path, c.Intermediate, 4*s.Dim)
	}
	if c.LayerNormEps != nil && *c.LayerNormEps != BERTEps {
		return Spec{}, fmt.Errorf("%s: layer_norm_eps %g: hpcrun's BERT layer norms use %g", path, *c.LayerNormEps, BERTEps)
	}
	switch c.HiddenAct {
	case "", "gelu", "gelu_new", "gelu_pytorch_tanh":
	default:
		return Spec{}, fmt.Errorf("%s: hidden_act %q: hpcrun's GELU is the tanh approximation (gelu_new; gelu differs from it by at most 1e-3)", path, c.HiddenAct)
	}
	if c.PositionEmbedTyp != "" && c.PositionEmbedTyp != "absolute" {
		return Spec{}, fmt.Errorf("%s: position_embedding_type %q: hpcrun's positions are absolute", path, c.PositionEmbedTyp)
	}
	return s, nil
}

// bertFileTensors lists the tensors of a BERT file for s, unprefixed; the
// pooler and the classifier may be absent (the model keeps its new ones).
func bertFileTensors(s Spec) []fileTensor {
	C, I := s.Dim, 4*s.Dim
	out := []fileTensor{
		{"embeddings.word_embeddings.weight", []int{s.Vocab, C}, false},
		{"embeddings.position_embeddings.weight", []int{s.Positions, C}, false},
		{"embeddings.token_type_embeddings.weight", []int{s.TypeVocab, C}, false},
		{"embeddings.LayerNorm.weight", []int{C}, false}, {"embeddings.LayerNorm.bias", []int{C}, false},
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		for _, qkv := range []string{"query", "key", "value"} {
			out = append(out, fileTensor{p + "attention.self." + qkv + ".weight", []int{C, C}, false}, fileTensor{p + "attention.self." + qkv + ".bias", []int{C}, false})
		}
		out = append(out,
			fileTensor{p + "attention.output.dense.weight", []int{C, C}, false}, fileTensor{p + "attention.output.dense.bias", []int{C}, false},
			fileTensor{p + "attention.output.LayerNorm.weight", []int{C}, false}, fileTensor{p + "attention.output.LayerNorm.bias", []int{C}, false},
			fileTensor{p + "intermediate.dense.weight", []int{I, C}, false}, fileTensor{p + "intermediate.dense.bias", []int{I}, false},
			fileTensor{p + "output.dense.weight", []int{C, I}, false}, fileTensor{p + "output.dense.bias", []int{C}, false},
			fileTensor{p + "output.LayerNorm.weight", []int{C}, false}, fileTensor{p + "output.LayerNorm.bias", []int{C}, false},
		)
	}
	return append(out,
		fileTensor{"pooler.dense.weight", []int{C, C}, true}, fileTensor{"pooler.dense.bias", []int{C}, true},
		fileTensor{"classifier.weight", []int{2, C}, true}, fileTensor{"classifier.bias", []int{2}, true},
	)
}

// bertRenames maps hpcrun's names of BERT's projections to BERT's.
var bertRenames = []struct{ ours, theirs string }{
	{".attention.c_proj.", ".attention.output.dense."},
	{".mlp.c_fc.", ".intermediate.dense."},
	{".mlp.c_proj.", ".output.dense."},
}

// bertNames are the file tensors that hpcrun parameter name is made of:
// query, key and value for the fused c_attn, else one.
func bertNames(name string) []string {
	if pre, kind, ok := strings.Cut(name, ".attention.c_attn."); ok {
		var out []string
		for _, qkv := range []string{"query", "key", "value"} {
			out = append(out, pre+".attention.self."+qkv+"."+kind)
		}
		return out
	}
	for _, r := range bertRenames {
		if strings.Contains(name, r.ours) {
			return []string{strings.Replace(name, r.ours, r.theirs, 1)}
		}
	}
	return []string{name}
}

func (w *hfWeights) loadBERT(name string, full []int, sh parallel.Shard) ([]float32, error) {
	names := bertNames(name)
	for _, n := range names {
		if _, ok := w.where[n]; !ok {
			for _, t := range bertFileTensors(w.spec) {
				if t.name == n && t.optional {
					return nil, fmt.Errorf("%s: %s: %w", w.spec.Source, n, ErrAbsent)
				}
			}
			return nil, fmt.Errorf("%s: the model has a tensor %s that BERT has not", w.spec.Source, name)
		}
	}
	vocab := name == "embeddings.word_embeddings.weight"
	if len(names) == 1 {
		return loadPiece(w.source(names[0], false, vocab), full, sh)
	}
	// The fused Q, K, V: this rank's piece of each, one after the other,
	// which is its piece of c_attn (3 blocks split over the ranks).
	part := append([]int{full[0] / 3}, full[1:]...)
	psh := sh
	psh.Blocks = 1
	var out []float32
	for _, n := range names {
		vals, err := loadPiece(w.source(n, false, false), part, psh)
		if err != nil {
			return nil, err
		}
		out = append(out, vals...)
	}
	return out, nil
}

// WriteHFBERT writes dir/config.json (BertForSequenceClassification) and
// the weights (BertModel names under opt.Prefix, "bert." as
// BertForSequenceClassification saves them; the classifier unprefixed)
// from hpcrun's full tensors of arch hf by name (a merged checkpoint: (out,
// in), the vocabulary unpadded): what Open reads back.
func WriteHFBERT(dir string, spec Spec, tensors []ckpt.Tensor, opt HFOptions) error {
	have := map[string]ckpt.Tensor{}
	for _, t := range tensors {
		names := bertNames(t.Name)
		if len(names) == 3 {
			n := len(t.Data) / 3
			shape := append([]int{t.Shape[0] / 3}, t.Shape[1:]...)
			for k, name := range names {
				have[name] = ckpt.Tensor{Name: name, Shape: shape, Data: t.Data[k*n : (k+1)*n]}
			}
			continue
		}
		have[names[0]] = ckpt.Tensor{Name: names[0], Shape: t.Shape, Data: t.Data}
	}
	var out []ckpt.Tensor
	for _, ft := range bertFileTensors(spec) {
		t, ok := have[ft.name]
		if !ok {
			return fmt.Errorf("export: no tensor %s", ft.name)
		}
		if err := checkShape("export", ft.name, t.Shape, ft.shape); err != nil {
			return err
		}
		if !strings.HasPrefix(t.Name, "classifier.") {
			t.Name = opt.Prefix + t.Name
		}
		out = append(out, t)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	cfg := map[string]any{
		"architectures": []string{"BertForSequenceClassification"}, "model_type": "bert",
		"hidden_size": spec.Dim, "num_hidden_layers": spec.Layers, "num_attention_heads": spec.Heads,
		"intermediate_size": 4 * spec.Dim, "max_position_embeddings": spec.Positions,
		"type_vocab_size": spec.TypeVocab, "vocab_size": spec.Vocab, "layer_norm_eps": BERTEps,
		"hidden_act": "gelu_new", "position_embedding_type": "absolute", "pad_token_id": 0,
		"id2label": map[string]string{"0": "NEGATIVE", "1": "POSITIVE"}, "label2id": map[string]int{"NEGATIVE": 0, "POSITIVE": 1},
		"torch_dtype": torchDType(opt.DType),
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
