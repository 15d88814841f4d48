package ckpt

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSummary sums a tp 2 checkpoint up: the parameters of the full
// tensors, how each is split, the bytes of the step dir's files, and the
// info table.
func TestSummary(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), make([]byte, 1000), 0o644)
	os.WriteFile(filepath.Join(dir, "b"), make([]byte, 24), 0o644)
	c := &Checkpoint{Dir: dir, State: State{Step: 3, Model: "gpt", Vocab: 50, Mesh: Mesh{TP: 2, DP: 1, World: 2},
		Config: []byte("{\n  \"model\": \"gpt\"\n}"), Saved: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Tensors: []TensorInfo{
			{Name: "wte", Full: []int{64, 8}, Split: true, Dim: 0},
			{Name: "qkv", Full: []int{8, 24}, Split: true, Dim: 1, Blocks: 3},
			{Name: "ln", Full: []int{8}},
		}}}
	s := c.Summary()
	if s.Params != 64*8+8*24+8 || s.Bytes != 1024 || len(s.Tensors) != 3 {
		t.Fatalf("summary %+v", s)
	}
	for i, want := range []string{"dim 0 over tp 2", "dim 1 over tp 2 (3 blocks)", "replicated"} {
		if s.Tensors[i].Shard != want || s.Tensors[i].Bytes != 4*int64(prod(s.Tensors[i].Shape)) {
			t.Errorf("tensor %d: %+v, want %q", i, s.Tensors[i], want)
		}
	}
	var b bytes.Buffer
	if err := c.WriteInfo(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"step 3 (epoch 0, sample 0 of it)", "model gpt, vocab 50, 0.00M parameters; mesh tp 2 x dp 1 (2 ranks)", `config {"model":"gpt"}`, "TENSOR  SHAPE   SHARD", "qkv     [8 24]  dim 1 over tp 2 (3 blocks)  768"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("info lacks %q:\n%s", want, b.String())
		}
	}
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
