package interop

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"

	"github.com/hpcrun/hpcrun/train/config"
)

// llm.c's GPT-2 checkpoint (train_gpt2.c, gpt2_build_from_checkpoint): a
// header of 256 little-endian int32 (magic 20240326, version 3 = fp32 or 5
// = bf16, max_seq_len, vocab_size, num_layers, num_heads, channels,
// padded_vocab_size), then the 16 parameter tensors back to back in this
// order, each layer's tensors stacked over the layers, linear weights
// (out, in).
const (
	llmcMagic  = 20240326
	llmcHeader = 256 * 4
)

// llmcWeights is an opened llm.c checkpoint.
type llmcWeights struct {
	path   string
	f      *os.File
	spec   Spec
	dtype  string
	padded int              // rows of wte in the file
	at     map[string]int64 // hpcrun name -> element offset of the tensor
	shape  map[string][]int // hpcrun name -> shape in the file
}

func openLLMC(path string) (*llmcWeights, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("init_from: %w", err)
	}
	w, err := readLLMC(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

func readLLMC(path string, f *os.File) (*llmcWeights, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	hdr := make([]byte, llmcHeader)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("%s: %d bytes, shorter than llm.c's 1024-byte header: not an llm.c checkpoint, nor a Hugging Face directory", path, st.Size())
	}
	h := func(i int) int { return int(int32(binary.LittleEndian.Uint32(hdr[4*i:]))) }
	if h(0) != llmcMagic {
		return nil, fmt.Errorf("%s: magic %d, llm.c's GPT-2 checkpoints have %d: unknown format (give a Hugging Face model directory or an llm.c .bin)", path, h(0), llmcMagic)
	}
	w := &llmcWeights{path: path, f: f, at: map[string]int64{}, shape: map[string][]int{}}
	size := 4
	switch h(1) {
	case 3:
		w.dtype = "F32"
	case 5:
		w.dtype, size = "BF16", 2
	default:
		return nil, fmt.Errorf("%s: llm.c version %d: hpcrun reads 3 (fp32) and 5 (bf16)", path, h(1))
	}
	w.spec = Spec{Model: "gpt", Positions: h(2), Vocab: h(3), Layers: h(4), Heads: h(5), Dim: h(6), Source: path}
	w.padded = h(7)
	s := w.spec
	if s.Positions <= 0 || s.Vocab <= 0 || s.Layers <= 0 || s.Heads <= 0 || s.Dim <= 0 || w.padded < s.Vocab || s.Dim%s.Heads != 0 {
		return nil, fmt.Errorf("%s: header max_seq_len %d, vocab %d (padded %d), layers %d, heads %d, channels %d: not a valid GPT-2", path, s.Positions, s.Vocab, w.padded, s.Layers, s.Heads, s.Dim)
	}
	if err := s.checkSize(map[string]string{"layers": "header num_layers", "dim": "header channels", "positions": "header max_seq_len", "vocab": "header vocab_size"}); err != nil {
		return nil, err
	}
	if w.padded > config.MaxVocab {
		return nil, fmt.Errorf("%s: header padded_vocab_size = %d: more than the %d hpcrun accepts", path, w.padded, config.MaxVocab)
	}
	C := s.Dim
	var off int64
	add := func(name string, shape ...int) {
		w.at[name], w.shape[name] = off, shape
		off += int64(numel(shape))
	}
	for _, t := range llmcOrder(s) {
		shape := t.Shape
		if t.Name == "wte.weight" {
			shape = []int{w.padded, C}
		}
		add(t.Name, shape...)
	}
	if want := llmcHeader + off*int64(size); st.Size() != want {
		if st.Size() < want {
			return nil, fmt.Errorf("%s: %d bytes, the header's model needs %d: truncated", path, st.Size(), want)
		}
		return nil, fmt.Errorf("%s: %d bytes, the header's model needs %d: trailing data", path, st.Size(), want)
	}
	return w, nil
}

// llmcOrder is GPT-2's tensors in llm.c's file order: wte, wpe, then each
// per-layer tensor stacked over the layers, then ln_f.
func llmcOrder(s Spec) []GPT2Tensor {
	all := GPT2Tensors(s)
	per := (len(all) - 4) / max(s.Layers, 1)
	out := append([]GPT2Tensor(nil), all[:2]...)
	for k := 0; k < per; k++ {
		for l := 0; l < s.Layers; l++ {
			out = append(out, all[2+l*per+k])
		}
	}
	return append(out, all[len(all)-2:]...)
}

func (w *llmcWeights) Spec() Spec { return w.spec }

func (w *llmcWeights) Load(name string, full []int, sh parallel.Shard) ([]float32, error) {
	at, ok := w.at[name]
	if !ok {
		return nil, fmt.Errorf("%s: the model has a tensor %s that GPT-2 has not", w.path, name)
	}
	shape := w.shape[name]
	if name == "wte.weight" {
		// Only the real vocabulary's rows: hpcrun pads for its own tp.
		shape = []int{w.spec.Vocab, shape[1]}
	}
	size := 4
	if w.dtype == "BF16" {
		size = 2
	}
	return loadPiece(source{file: w.path, name: llmcName(name), shape: shape, vocab: name == "wte.weight", read: func(start int, dst []float32) error {
		buf := make([]byte, len(dst)*size)
		if _, err := w.f.ReadAt(buf, llmcHeader+(at+int64(start))*int64(size)); err != nil {
			return fmt.Errorf("%s: tensor %s: %w", w.path, llmcName(name), err)
		}
		ckpt.DecodeFloats(dst, buf, w.dtype)
		return nil
	}}, full, sh)
}

// llmcName is llm.c's name for a tensor (its ParameterTensors field, layer
// index appended), for errors.
func llmcName(name string) string {
	fields := map[string]string{
		"ln_1.weight": "ln1w", "ln_1.bias": "ln1b", "attn.c_attn.weight": "qkvw", "attn.c_attn.bias": "qkvb",
		"attn.c_proj.weight": "attprojw", "attn.c_proj.bias": "attprojb", "ln_2.weight": "ln2w", "ln_2.bias": "ln2b",
		"mlp.c_fc.weight": "fcw", "mlp.c_fc.bias": "fcb", "mlp.c_proj.weight": "fcprojw", "mlp.c_proj.bias": "fcprojb",
		"wte.weight": "wte", "wpe.weight": "wpe", "ln_f.weight": "lnfw", "ln_f.bias": "lnfb",
	}
	if rest, ok := strings.CutPrefix(name, "h."); ok {
		l, suffix, _ := strings.Cut(rest, ".")
		if _, err := strconv.Atoi(l); err == nil {
			return fields[suffix] + "[" + l + "]"
		}
	}
	return fields[name]
}

func (w *llmcWeights) Close() error { return w.f.Close() }

// WriteLLMC writes tensors (hpcrun's names and (out, in) layout, the
// vocabulary unpadded) as an llm.c version 3 (fp32) checkpoint, the
// vocabulary padded to a multiple of 128 with zero rows as llm.c does.
func WriteLLMC(path string, spec Spec, tensors map[string][]float32) error {
	padded := (spec.Vocab + 127) / 128 * 128
	hdr := make([]int32, 256)
	copy(hdr, []int32{llmcMagic, 3, int32(spec.Positions), int32(spec.Vocab), int32(spec.Layers), int32(spec.Heads), int32(spec.Dim), int32(padded)})
	buf := make([]byte, 0, llmcHeader)
	for _, v := range hdr {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	for _, t := range llmcOrder(spec) {
		name := t.Name
		vals, ok := tensors[name]
		if !ok {
			return fmt.Errorf("llm.c %s: no tensor %s", path, name)
		}
		if len(vals) != numel(t.Shape) {
			return fmt.Errorf("llm.c %s: tensor %s has %d values, want shape %v", path, name, len(vals), t.Shape)
		}
		if name == "wte.weight" {
			vals = append(append([]float32(nil), vals...), make([]float32, (padded-spec.Vocab)*spec.Dim)...)
		}
		for _, v := range vals {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	return os.WriteFile(path, buf, 0o644)
}
