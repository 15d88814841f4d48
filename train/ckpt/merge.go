package ckpt

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// Merge returns the checkpoint's model as full tensors, in the state's
// order. A GPT checkpoint comes out as Hugging Face GPT-2 stores it: the
// same names (wte.weight, wpe.weight, h.N.ln_1.weight,
// h.N.attn.c_attn.weight, ..., ln_f.bias), the vocabulary unpadded, and the
// linear weights transposed from hpcrun's (out, in) to Conv1D's (in, out)
// (c_attn is then (C, 3C) with Q, K, V side by side). Other models keep
// hpcrun's names and (out, in) layout. The metadata says which.
func (c *Checkpoint) Merge() ([]Tensor, map[string]string, error) {
	hf := c.State.Model == "gpt"
	var out []Tensor
	for _, ti := range c.State.Tensors {
		vals, err := c.Full("", ti.Name)
		if err != nil {
			return nil, nil, err
		}
		shape := append([]int(nil), ti.Full...)
		if ti.Rows > 0 && ti.Rows < shape[0] {
			vals = vals[:ti.Rows*numel(shape[1:])]
			shape[0] = ti.Rows
		}
		if hf && len(shape) == 2 && isLinear(ti.Name) {
			vals, shape = Transpose(vals, shape[0], shape[1]), []int{shape[1], shape[0]}
		}
		out = append(out, Tensor{Name: ti.Name, Shape: shape, Data: vals})
	}
	meta := map[string]string{
		"format": "pt", "source": "hpcrun", "model": c.State.Model,
		"step": strconv.Itoa(c.State.Step), "layout": "hpcrun (out, in)",
	}
	if hf {
		meta["layout"] = "huggingface gpt2 (Conv1D (in, out))"
	}
	return out, meta, nil
}

// isLinear reports a linear layer's weight (the GPT-2 Conv1D modules).
func isLinear(name string) bool {
	for _, s := range []string{".c_attn.weight", ".c_proj.weight", ".c_fc.weight"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// Transpose returns the (cols, rows) transpose of the row-major (rows,
// cols) matrix a: the (out, in) <-> (in, out) turn of GPT-2's Conv1D weights.
func Transpose(a []float32, rows, cols int) []float32 {
	out := make([]float32, len(a))
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			out[j*rows+i] = a[i*cols+j]
		}
	}
	return out
}

// WriteMerged writes the merged checkpoint to path through a temporary file
// in the same directory, renamed on success: an existing path is replaced
// only by a complete file.
func (c *Checkpoint) WriteMerged(path string) error {
	tensors, meta, err := c.Merge()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, 0o644, func(w io.Writer) error { return Write(w, path, tensors, meta) }); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return nil
}
