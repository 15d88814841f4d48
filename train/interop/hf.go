package interop

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
)

// Files of a Hugging Face model directory.
const (
	HFConfig = "config.json"
	HFModel  = "model.safetensors"
	HFIndex  = "model.safetensors.index.json"
)

// hfConfig is the part of a Hugging Face config.json hpcrun reads (GPT-2's
// keys).
type hfConfig struct {
	Architectures []string `json:"architectures"`
	ModelType     string   `json:"model_type"`
	NEmbd         int      `json:"n_embd"`
	NLayer        int      `json:"n_layer"`
	NHead         int      `json:"n_head"`
	NPositions    int      `json:"n_positions"`
	NInner        *int     `json:"n_inner"`
	VocabSize     int      `json:"vocab_size"`
	LayerNormEps  *float64 `json:"layer_norm_epsilon"`
	Activation    string   `json:"activation_function"`
	ScaleAttn     *bool    `json:"scale_attn_weights"`
	ScaleByLayer  bool     `json:"scale_attn_by_inverse_layer_idx"`
	TieEmbeddings *bool    `json:"tie_word_embeddings"`
}

// hfWeights is an opened Hugging Face GPT-2 directory.
type hfWeights struct {
	spec  Spec
	files map[string]*os.File     // by shard file name
	heads map[string]*ckpt.Header // by shard file name
	where map[string]string       // hpcrun name -> shard file name
	keyOf map[string]string       // hpcrun name -> the file's tensor name
}

// ReadHFConfig reads dir/config.json into a Spec; an architecture other
// than GPT-2 or BERT, or options hpcrun's model does not have, are refused.
func ReadHFConfig(dir string) (Spec, error) {
	s, err := readHFConfig(dir)
	if err != nil {
		return Spec{}, err
	}
	names := map[string]string{"layers": "n_layer", "dim": "n_embd", "positions": "n_positions", "vocab": "vocab_size"}
	if s.Model == "bert" || s.Model == "llama" {
		names = map[string]string{"layers": "num_hidden_layers", "dim": "hidden_size", "positions": "max_position_embeddings", "vocab": "vocab_size"}
	}
	if err := s.checkSize(names); err != nil {
		return Spec{}, err
	}
	return s, nil
}

func readHFConfig(dir string) (Spec, error) {
	path := filepath.Join(dir, HFConfig)
	b, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, fmt.Errorf("init_from: %w", err)
	}
	s, err := hfSpec(path, b)
	if err != nil {
		return Spec{}, err
	}
	var own struct {
		Seq int `json:"hpcrun_seq"`
	}
	if err := json.Unmarshal(b, &own); err == nil && own.Seq > 0 {
		s.Seq = own.Seq
	}
	return s, nil
}

// hfSpec is the Spec of the config.json at path, of contents b: a GPT-2,
// BERT or Llama.
func hfSpec(path string, b []byte) (Spec, error) {
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return Spec{}, fmt.Errorf("%s: %v", path, err)
	}
	if isBERT(c.ModelType, c.Architectures) {
		return readBERTConfig(path, b)
	}
	if isLlama(c.ModelType, c.Architectures) {
		return readLlamaConfig(path, b)
	}
	arch := c.ModelType
	if len(c.Architectures) > 0 {
		arch = strings.Join(c.Architectures, ",")
	}
	gpt2 := c.ModelType == "gpt2"
	for _, a := range c.Architectures {
		gpt2 = gpt2 || a == "GPT2LMHeadModel" || a == "GPT2Model"
	}
	if !gpt2 {
		return Spec{}, fmt.Errorf("%s: architecture %q (model_type %q) is not supported: hpcrun reads GPT-2 (GPT2LMHeadModel, GPT2Model), BERT (BertModel, BertForSequenceClassification) and Llama (LlamaForCausalLM)", path, arch, c.ModelType)
	}
	s := Spec{Model: "gpt", Layers: c.NLayer, Dim: c.NEmbd, Heads: c.NHead, Positions: c.NPositions, Vocab: c.VocabSize, Source: path}
	for _, k := range []struct {
		key string
		v   int
	}{{"n_layer", s.Layers}, {"n_embd", s.Dim}, {"n_head", s.Heads}, {"n_positions", s.Positions}, {"vocab_size", s.Vocab}} {
		if k.v <= 0 {
			return Spec{}, fmt.Errorf("%s: %s = %d: missing or not positive", path, k.key, k.v)
		}
	}
	if s.Dim%s.Heads != 0 {
		return Spec{}, fmt.Errorf("%s: n_embd %d is not a multiple of n_head %d", path, s.Dim, s.Heads)
	}
	if c.NInner != nil && *c.NInner != 4*s.Dim {
		return Spec{}, fmt.Errorf("%s: n_inner %d: hpcrun's MLP is 4 x n_embd = %d", path, *c.NInner, 4*s.Dim)
	}
	if c.LayerNormEps != nil && *c.LayerNormEps != 1e-5 {
		return Spec{}, fmt.Errorf("%s: layer_norm_epsilon %g: hpcrun's layer norm uses 1e-5", path, *c.LayerNormEps)
	}
	if c.TieEmbeddings != nil && !*c.TieEmbeddings {
		return Spec{}, fmt.Errorf("%s: tie_word_embeddings false: hpcrun's LM head is the token embedding", path)
	}
	if (c.ScaleAttn != nil && !*c.ScaleAttn) || c.ScaleByLayer {
		return Spec{}, fmt.Errorf("%s: scale_attn_weights false or scale_attn_by_inverse_layer_idx true: hpcrun's attention scales by 1/sqrt(head size) only", path)
	}
	if c.Activation != "" && c.Activation != "gelu_new" && c.Activation != "gelu_pytorch_tanh" {
		return Spec{}, fmt.Errorf("%s: activation_function %q: hpcrun's GELU is the tanh approximation (gelu_new)", path, c.Activation)
	}
	return s, nil
}

func openHF(dir string) (_ *hfWeights, err error) {
	spec, err := ReadHFConfig(dir)
	if err != nil {
		return nil, err
	}
	w := &hfWeights{spec: spec, files: map[string]*os.File{}, heads: map[string]*ckpt.Header{}, where: map[string]string{}, keyOf: map[string]string{}}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	// Which file holds each tensor: the index's weight map, or the one file.
	weightMap := map[string]string{}
	if b, ierr := os.ReadFile(filepath.Join(dir, HFIndex)); ierr == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &idx); err != nil || len(idx.WeightMap) == 0 {
			return nil, fmt.Errorf("%s: not a safetensors index (want a weight_map of tensor names to files): %v", filepath.Join(dir, HFIndex), err)
		}
		weightMap = idx.WeightMap
	} else if errors.Is(ierr, os.ErrNotExist) {
		h, err := w.open(dir, HFModel)
		if err != nil {
			return nil, err
		}
		for _, e := range h.Tensors {
			weightMap[e.Name] = HFModel
		}
	} else {
		return nil, fmt.Errorf("init_from: %w", ierr)
	}
	prefix, need := "transformer.", []fileTensor{}
	switch spec.Model {
	case "bert":
		prefix, need = "bert.", bertFileTensors(spec)
	case "llama":
		prefix, need = "", llamaFileTensors(spec)
	default:
		for _, t := range GPT2Tensors(spec) {
			shape := t.Shape
			if t.Conv1D {
				shape = []int{t.Shape[1], t.Shape[0]}
			}
			need = append(need, fileTensor{t.Name, shape, false})
		}
	}
	for _, t := range need {
		key := t.name
		file, ok := weightMap[key]
		if !ok {
			key = prefix + t.name
			file, ok = weightMap[key]
		}
		if !ok && t.optional {
			continue
		}
		if !ok {
			where := filepath.Join(dir, HFModel)
			if len(w.files) == 0 {
				where = filepath.Join(dir, HFIndex)
			}
			return nil, fmt.Errorf("%s: no tensor %s (nor %s%s): not a model of %s's shape", where, t.name, prefix, t.name, HFConfig)
		}
		h, err := w.open(dir, file)
		if err != nil {
			return nil, err
		}
		e, ok := h.Find(key)
		if !ok {
			return nil, fmt.Errorf("%s: no tensor %s, which %s puts there", h.Path, key, HFIndex)
		}
		if err := checkShape(h.Path, key, e.Shape, t.shape); err != nil {
			return nil, err
		}
		if e.DType != "F32" && e.DType != "F16" && e.DType != "BF16" {
			return nil, fmt.Errorf("%s: tensor %s is %s: only F32, F16 and BF16 are read", h.Path, key, e.DType)
		}
		w.where[t.name], w.keyOf[t.name] = file, key
	}
	return w, nil
}

// open opens (once) the shard file name of dir and reads its header.
func (w *hfWeights) open(dir, name string) (*ckpt.Header, error) {
	if h, ok := w.heads[name]; ok {
		return h, nil
	}
	if name != filepath.Base(name) {
		return nil, fmt.Errorf("%s: shard file %q must be in the model directory", filepath.Join(dir, HFIndex), name)
	}
	path := filepath.Join(dir, name)
	h, err := ckpt.ReadHeader(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	w.files[name], w.heads[name] = f, h
	return h, nil
}

func (w *hfWeights) Spec() Spec { return w.spec }

// fileTensor is a tensor a Hugging Face file must (or may) hold, under
// its unprefixed name, with its shape in the file.
type fileTensor struct {
	name     string
	shape    []int
	optional bool
}

func (w *hfWeights) Load(name string, full []int, sh parallel.Shard) ([]float32, error) {
	switch w.spec.Model {
	case "bert":
		return w.loadBERT(name, full, sh)
	case "llama":
		return w.loadLlama(name, full, sh)
	}
	if _, ok := w.where[name]; !ok {
		return nil, fmt.Errorf("%s: the model has a tensor %s that GPT-2 has not", w.spec.Source, name)
	}
	conv := false
	for _, s := range []string{".c_attn.weight", ".c_proj.weight", ".c_fc.weight"} {
		conv = conv || strings.HasSuffix(name, s)
	}
	return loadPiece(w.source(name, conv, name == "wte.weight"), full, sh)
}

// source is the file tensor of (unprefixed) name, which must be there.
func (w *hfWeights) source(name string, conv, vocab bool) source {
	file := w.where[name]
	h, key := w.heads[file], w.keyOf[name]
	e, _ := h.Find(key)
	f := w.files[file]
	return source{file: h.Path, name: key, shape: e.Shape, conv1D: conv, vocab: vocab, read: func(start int, dst []float32) error {
		return h.ReadValues(f, e, start, dst)
	}}
}

func (w *hfWeights) Close() error {
	var names []string
	for n := range w.files {
		names = append(names, n)
	}
	sort.Strings(names)
	var first error
	for _, n := range names {
		if err := w.files[n].Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// gpt2EOT is GPT-2's <|endoftext|> id, its bos and eos token.
const gpt2EOT = 50256

// HFOptions say how WriteHF stores the weights.
type HFOptions struct {
	DType  string // F32 (""), F16 or BF16
	Shards int    // files model-0000i-of-0000n.safetensors with the index json; 0 or 1 = one model.safetensors
	Prefix string // prepended to every tensor name ("transformer." as GPT2LMHeadModel saves them); "" = GPT2Model's names
	// Tokenizer, when set, is a tokenizer.json (or its directory) that
	// WriteLlamaHF copies beside the weights.
	Tokenizer string
}

// WriteHF writes dir/config.json (GPT2LMHeadModel) and the weights
// (GPT2Model names, Conv1D (in, out) weights) from tensors in that layout
// (ckpt's Merge of a GPT checkpoint): what Open reads back.
func WriteHF(dir string, spec Spec, tensors []ckpt.Tensor, opt HFOptions) error {
	byName := map[string]ckpt.Tensor{}
	for _, t := range tensors {
		byName[t.Name] = t
	}
	var out []ckpt.Tensor
	for _, t := range GPT2Tensors(spec) {
		x, ok := byName[t.Name]
		shape := t.Shape
		if t.Conv1D {
			shape = []int{t.Shape[1], t.Shape[0]}
		}
		if !ok {
			return fmt.Errorf("export: no tensor %s", t.Name)
		}
		if err := checkShape("export", t.Name, x.Shape, shape); err != nil {
			return err
		}
		x.Name = opt.Prefix + x.Name
		out = append(out, x)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	// GPT-2's end-of-text id, only for a vocabulary that has it: null (no
	// such token) for a byte-level model, whose 256 ids are bytes.
	var eot any
	if spec.Vocab > gpt2EOT {
		eot = gpt2EOT
	}
	cfg := map[string]any{
		"architectures": []string{"GPT2LMHeadModel"}, "model_type": "gpt2",
		"n_embd": spec.Dim, "n_layer": spec.Layers, "n_head": spec.Heads,
		"n_positions": spec.Positions, "n_ctx": spec.Positions, "vocab_size": spec.Vocab,
		"n_inner": nil, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
		"bos_token_id": eot, "eos_token_id": eot, "tie_word_embeddings": true,
		"torch_dtype": torchDType(opt.DType),
	}
	if spec.Seq > 0 {
		cfg["hpcrun_seq"] = spec.Seq
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

// torchDType is config.json's torch_dtype for weights stored as dtype.
func torchDType(dtype string) string {
	switch dtype {
	case "BF16":
		return "bfloat16"
	case "F16":
		return "float16"
	}
	return "float32"
}

// writeWeights writes tensors into dir as model.safetensors, or as
// opt.Shards files with the index json, in opt.DType.
func writeWeights(dir string, tensors []ckpt.Tensor, opt HFOptions) error {
	dtype := opt.DType
	if dtype == "" {
		dtype = "F32"
	}
	meta := map[string]string{"format": "pt"}
	if opt.Shards <= 1 {
		return writeSafetensors(filepath.Join(dir, HFModel), tensors, meta, dtype)
	}
	n := min(opt.Shards, len(tensors))
	weightMap := map[string]string{}
	total := 0
	for i := 0; i < n; i++ {
		part := tensors[i*len(tensors)/n : (i+1)*len(tensors)/n]
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
		if err := writeSafetensors(filepath.Join(dir, name), part, meta, dtype); err != nil {
			return err
		}
		for _, t := range part {
			weightMap[t.Name] = name
			total += len(t.Data)
		}
	}
	b, err := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total * map[string]int{"F32": 4, "F16": 2, "BF16": 2}[dtype]}, "weight_map": weightMap}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, HFIndex), append(b, '\n'), 0o644)
}

func writeSafetensors(path string, tensors []ckpt.Tensor, meta map[string]string, dtype string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := ckpt.WriteAs(f, path, tensors, meta, dtype); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
