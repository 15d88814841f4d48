package train

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSourceShape reads a Hugging Face GPT-2's shape from its config.json
// alone (its weights file is not there, nor opened), by the directory or
// a file in it.
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
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"llama"}`), 0o644)
	if _, err := SourceShape(dir); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Errorf("a llama: %v", err)
	}
}
