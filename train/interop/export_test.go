package interop_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
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
	if err := interop.ExportHF(ck, hf); err != nil {
		t.Fatal(err)
	}
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
	if err := interop.ExportHF(&ckpt.Checkpoint{Dir: "x", State: ckpt.State{Model: "bert", Config: []byte(`{"model":"bert"}`)}}, filepath.Join(dir, "b")); err == nil || !strings.Contains(err.Error(), "a bert checkpoint of hpcrun's own layout") {
		t.Errorf("exporting a bert checkpoint: %v", err)
	}
}
