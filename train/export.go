package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// ExportHF writes the checkpoint ck as a Hugging Face directory
// (interop.ExportHF: config.json and the weights) with the files of the
// tokenizer its run used, so that the directory loads with it
// (tokenizer.HFFiles); hpcrun ckpt export --hf, its weights as dtype (F32,
// BF16 or F16).
func ExportHF(ck *ckpt.Checkpoint, dir, dtype string) error {
	var cfg config.Config
	if err := json.Unmarshal(ck.State.Config, &cfg); err != nil {
		return fmt.Errorf("export %s: config: %v", ck.Dir, err)
	}
	if err := interop.ExportHF(ck, dir, dtype); err != nil {
		return err
	}
	files, err := tokenizer.HFFiles(cfg)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("export: %w", err)
		}
	}
	return nil
}
