package train

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSourceShape reads a Hugging Face GPT-2's shape from its config.json
// alone (its weights file is not there, nor opened), by the directory or
// a file in it, and CheckWeightsFit refuses it where its weights cannot fit.
func TestSourceShape(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"gpt2","n_layer":2,"n_embd":32,"n_head":4,"n_positions":64,"vocab_size":100}`), 0o644)
	for _, src := range []string{dir, filepath.Join(dir, "config.json"), filepath.Join(dir, "model.safetensors")} {
		cfg, err := SourceShape(src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if cfg.Model != "gpt" || cfg.Layers != 2 || cfg.Dim != 32 || cfg.Heads != 4 || cfg.Positions != 64 || cfg.Vocab != 100 {
			t.Errorf("%s: %+v", src, cfg)
		}
	}
	if err := CheckWeightsFit(dir, 0); err != nil {
		t.Errorf("shape only: %v", err)
	}
	if err := CheckWeightsFit(dir, 1000); err == nil || !strings.Contains(err.Error(), "the model's weights alone need ") || !strings.Contains(err.Error(), "more than the 1000 B of this machine") {
		t.Errorf("1000 B of memory: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"gpt_neox"}`), 0o644)
	if _, err := SourceShape(dir); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("a GPT-NeoX: %v", err)
	}
}
