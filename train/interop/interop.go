// Package interop reads and writes model weights in other programs'
// formats: Hugging Face GPT-2, BERT and Llama directories (config.json with
// model.safetensors or its shards and index; GPT2LMHeadModel / GPT2Model
// names and Conv1D (in, out) weights; BertModel /
// BertForSequenceClassification names; LlamaForCausalLM's, its q, k, v
// and gate, up projections read into hpcrun's fused ones; F32, F16 or
// BF16) and llm.c GPT-2
// checkpoints (.bin, fp32 version 3 or bf16 version 5). Each rank reads only the slices its
// tensor-parallel shard holds, through the files' offsets. It knows nothing
// of training: the caller names a parameter by hpcrun's name (GPT-2's own,
// e.g. h.0.attn.c_attn.weight, stored (out, in)), its full shape and its
// shard.
package interop

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"

	"github.com/hpcrun/hpcrun/train/config"
)

// Spec is the shape of a pretrained model, as its file states it.
type Spec struct {
	Model     string // "gpt" or "bert"
	Arch      string // "" (GPT-2) or "hf" (BERT's post-LN layout)
	TypeVocab int    // BERT's token types (type_vocab_size)
	Layers    int
	Dim       int
	Heads     int
	Positions int // rows of the position table (n_positions)
	Vocab     int // real vocabulary (rows of the token embedding used)
	Source    string

	// Seq is the window the weights were trained on, which hpcrun's
	// exports write into config.json as hpcrun_seq (0: the file does not
	// say): eval's default window, so that a run and its export score the
	// same windows.
	Seq int

	// A Llama's (Model "llama"; see config.Config's fields of the same
	// names). Positions is its max_position_embeddings.
	KVHeads, FFN                          int
	NormEps, RopeTheta                    float64
	RopeFactor, RopeLowFreq, RopeHighFreq float64
	RopeOriginalSeq                       int
	UntiedHead                            bool
}

// checkSize is CheckSize of a file's spec, under the file's own key names.
func (s Spec) checkSize(names map[string]string) error {
	if err := config.CheckSize(s.Layers, s.Dim, s.Positions, s.Vocab, func(n string) string { return names[n] }); err != nil {
		return fmt.Errorf("%s: %w", s.Source, err)
	}
	return nil
}

// Weights is an opened pretrained model: its shape, and this rank's pieces
// of its tensors.
type Weights interface {
	// Spec is the model's shape.
	Spec() Spec
	// Load returns this rank's piece of hpcrun parameter name, whose full
	// shape is full (the token embedding's rows padded past the
	// vocabulary: those rows come back zero) and whose shard is sh, in
	// hpcrun's (out, in) layout. A tensor the file may lack (BERT's
	// classifier head) is ErrAbsent: the model keeps its own.
	Load(name string, full []int, sh parallel.Shard) ([]float32, error)
	// Close closes the files.
	Close() error
}

// ErrAbsent is Load's error for an optional tensor the file lacks.
var ErrAbsent = errors.New("not in the file")

// Open opens the pretrained weights at path: a directory is a Hugging Face
// model, a file an llm.c checkpoint. Every tensor the model needs is checked
// (present, shape, dtype, inside the file) before Open returns.
func Open(path string) (Weights, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	if st.IsDir() {
		return openHF(path)
	}
	if filepath.Ext(path) == ".safetensors" || filepath.Base(path) == "config.json" {
		return openHF(filepath.Dir(path))
	}
	return openLLMC(path)
}

// Inspect returns the shape of the pretrained model at path (see Open).
func Inspect(path string) (Spec, error) {
	w, err := Open(path)
	if err != nil {
		return Spec{}, err
	}
	defer w.Close()
	return w.Spec(), nil
}

// GPT2Tensor is one tensor of GPT-2 under its Hugging Face name, with its
// shape in hpcrun's layout and whether the file stores it transposed
// (Conv1D (in, out)).
type GPT2Tensor struct {
	Name   string
	Shape  []int
	Conv1D bool
}

// GPT2Tensors lists GPT-2's tensors for spec in hpcrun's parameter order:
// the one list of names that loading and exporting share.
func GPT2Tensors(s Spec) []GPT2Tensor {
	C, V := s.Dim, s.Vocab
	out := []GPT2Tensor{{"wte.weight", []int{V, C}, false}, {"wpe.weight", []int{s.Positions, C}, false}}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("h.%d.", l)
		out = append(out,
			GPT2Tensor{p + "ln_1.weight", []int{C}, false}, GPT2Tensor{p + "ln_1.bias", []int{C}, false},
			GPT2Tensor{p + "attn.c_attn.weight", []int{3 * C, C}, true}, GPT2Tensor{p + "attn.c_attn.bias", []int{3 * C}, false},
			GPT2Tensor{p + "attn.c_proj.weight", []int{C, C}, true}, GPT2Tensor{p + "attn.c_proj.bias", []int{C}, false},
			GPT2Tensor{p + "ln_2.weight", []int{C}, false}, GPT2Tensor{p + "ln_2.bias", []int{C}, false},
			GPT2Tensor{p + "mlp.c_fc.weight", []int{4 * C, C}, true}, GPT2Tensor{p + "mlp.c_fc.bias", []int{4 * C}, false},
			GPT2Tensor{p + "mlp.c_proj.weight", []int{C, 4 * C}, true}, GPT2Tensor{p + "mlp.c_proj.bias", []int{C}, false},
		)
	}
	return append(out, GPT2Tensor{"ln_f.weight", []int{C}, false}, GPT2Tensor{"ln_f.bias", []int{C}, false})
}

// source is one tensor in a file: shape is in the file's layout (for a
// Conv1D weight, hpcrun's transposed), read fetches its values.
type source struct {
	file   string
	name   string
	shape  []int
	conv1D bool
	vocab  bool                                 // the token embedding: the model's rows past the file's are padding
	read   func(start int, dst []float32) error // values from element start on
}

// loadPiece reads this rank's piece of src for a parameter of full shape
// full (hpcrun layout) and shard sh. Rows of full past the file's are zero
// (vocabulary padding).
func loadPiece(src source, full []int, sh parallel.Shard) ([]float32, error) {
	want := full
	if src.conv1D && len(full) == 2 {
		want = []int{full[1], full[0]}
	}
	if len(src.shape) > 0 && len(src.shape) == len(want) && src.shape[0] < want[0] && src.vocab {
		want = append([]int{src.shape[0]}, want[1:]...) // vocabulary padding
	}
	if err := checkShape(src.file, src.name, src.shape, want); err != nil {
		return nil, err
	}
	fileShape, fsh := full, sh
	if src.conv1D {
		if len(full) != 2 {
			return nil, fmt.Errorf("%s: tensor %s: a Conv1D weight must be 2-d, the model has %v", src.file, src.name, full)
		}
		fileShape = []int{full[1], full[0]}
		if !sh.Replicated() {
			fsh.Dim = 1 - sh.Dim
		}
	}
	have := 1
	for _, d := range src.shape {
		have *= d
	}
	out := make([]float32, 0, numel(sh.LocalShape(full)))
	var err error
	rerr := fsh.Runs(fileShape, func(start, n int) {
		if err != nil {
			return
		}
		k := len(out)
		out = append(out, make([]float32, n)...)
		if m := min(n, have-start); m > 0 {
			err = src.read(start, out[k:k+m])
		}
	})
	if rerr != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", src.file, src.name, rerr)
	}
	if err != nil {
		return nil, err
	}
	if src.conv1D {
		ls := fsh.LocalShape(fileShape)
		out = ckpt.Transpose(out, ls[0], ls[1])
	}
	return out, nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// checkShape compares a tensor's shape in a file with the one the model
// needs, naming the file and the tensor.
func checkShape(file, name string, got, want []int) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: tensor %s is %v, the model's config needs %v", file, name, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("%s: tensor %s is %v, the model's config needs %v", file, name, got, want)
		}
	}
	return nil
}
