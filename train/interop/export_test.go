package interop_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/interop"
)

// runInProcess trains cfg on cfg.NTasks in-process ranks and returns rank
// 0's result.
func runInProcess(t *testing.T, cfg trainconfig.Config, runDir string) *train.Result {
	t.Helper()
	res := make([]*train.Result, cfg.NTasks)
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		r, err := train.Run(context.Background(), cfg, c, train.Options{RunDir: runDir, Device: nil})
		res[c.Rank()] = r
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}

// TestExportInitFromRoundTrip: a GPT trained at tp 2 (a 64-row position
// table, seq 16) and exported with ExportHF (ckpt export --hf) is read back by
// --init-from at tp 1 and 2 with the validation loss of the checkpoint's
// weights: exactly at the saved tp, within 1e-5 at the other.
func TestExportInitFromRoundTrip(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text.txt")
	os.WriteFile(text, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog. ", 200)), 0o644)
	cfg := trainconfig.DefaultConfig()
	cfg.Model, cfg.Preset, cfg.Data, cfg.Device = "gpt", "", text, "cpu"
	cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, cfg.Positions = 2, 32, 4, 16, 64
	cfg.BatchSize, cfg.Steps, cfg.EvalEvery, cfg.EvalSamples = 4, 3, 3, 8
	cfg.NTasks, cfg.TP = 2, 2
	runDir := filepath.Join(dir, "run")
	trained := runInProcess(t, cfg, runDir)
	last := trained.Evals[len(trained.Evals)-1]
	if last.Step != 3 || trained.Evals[0].Step != 0 {
		t.Fatalf("evals %+v: want step 0 first and step 3 last", trained.Evals)
	}
	step, err := ckpt.Latest(filepath.Join(runDir, "ckpt"))
	if err != nil || step == "" {
		t.Fatalf("no checkpoint: %v", err)
	}
	ck, err := ckpt.Open(step, false)
	if err != nil {
		t.Fatal(err)
	}
	hf := filepath.Join(dir, "hf")
	if err := interop.ExportHF(ck, hf, "F32"); err != nil {
		t.Fatal(err)
	}
	checkBF16Export(t, ck, hf, filepath.Join(dir, "hf-bf16"))
	for _, tp := range []int{2, 1} {
		c := trainconfig.DefaultConfig()
		c.Model, c.Preset, c.Data, c.Device, c.Seq = "gpt", "", text, "cpu", 16
		c.BatchSize, c.Steps, c.EvalEvery, c.EvalSamples, c.NTasks, c.TP = 4, 1, 1, 8, tp, tp
		c.InitFrom = hf
		if err := train.ApplyInitFrom(&c, nil); err != nil {
			t.Fatal(err)
		}
		if c.Positions != 64 || c.Layers != 2 || c.Dim != 32 {
			t.Fatalf("the exported config.json gave %+v", c)
		}
		got := runInProcess(t, c, "").Evals[0]
		if got.Step != 0 {
			t.Fatalf("first eval at step %d, want 0", got.Step)
		}
		if tp == 2 && got.Loss != last.Loss {
			t.Errorf("tp 2: loss from the export %.9f, the checkpoint's %.9f: not identical", got.Loss, last.Loss)
		}
		if d := got.Loss - last.Loss; d > 1e-5 || d < -1e-5 {
			t.Errorf("tp %d: loss from the export %.7f, the checkpoint's %.7f", tp, got.Loss, last.Loss)
		}
	}
	if err := interop.ExportHF(&ckpt.Checkpoint{Dir: "x", State: ckpt.State{Model: "bert", Config: []byte(`{"model":"bert"}`)}}, filepath.Join(dir, "b"), "F32"); err == nil || !strings.Contains(err.Error(), "a bert checkpoint of hpcrun's own layout") {
		t.Errorf("exporting a bert checkpoint: %v", err)
	}
}

// checkBF16Export exports ck again with dtype BF16 into dir: config.json
// says torch_dtype bfloat16, every tensor is stored BF16, and each value is
// the F32 export's (in hf) rounded to nearest even.
func checkBF16Export(t *testing.T, ck *ckpt.Checkpoint, hf, dir string) {
	t.Helper()
	if err := interop.ExportHF(ck, dir, "BF16"); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err != nil || json.Unmarshal(b, &cfg) != nil || cfg["torch_dtype"] != "bfloat16" {
		t.Fatalf("the bf16 export's config.json: torch_dtype %v (%v)", cfg["torch_dtype"], err)
	}
	read := func(path string) (*ckpt.Header, map[string][]float32) {
		h, err := ckpt.ReadHeader(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		vals := map[string][]float32{}
		for _, e := range h.Tensors {
			n := 1
			for _, d := range e.Shape {
				n *= d
			}
			v := make([]float32, n)
			if err := h.ReadValues(f, e, 0, v); err != nil {
				t.Fatal(err)
			}
			vals[e.Name] = v
		}
		return h, vals
	}
	_, full := read(filepath.Join(hf, "model.safetensors"))
	h, half := read(filepath.Join(dir, "model.safetensors"))
	if len(half) != len(full) || len(half) == 0 {
		t.Fatalf("the bf16 export has %d tensors, the fp32 one %d", len(half), len(full))
	}
	for _, e := range h.Tensors {
		if e.DType != "BF16" {
			t.Fatalf("tensor %s stored %s, want BF16", e.Name, e.DType)
		}
		for i, v := range full[e.Name] {
			if want := tensor.Float32FromBF16(tensor.BF16FromFloat32(v)); half[e.Name][i] != want {
				t.Fatalf("tensor %s[%d] = %g in the bf16 export, want %g rounded: %g", e.Name, i, half[e.Name][i], v, want)
			}
		}
	}
}
