package train

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/spec"
)

// SourceShape is the model config of src as SourceConfig gives it, except
// that a Hugging Face model's comes from its config.json alone: its
// weights files are not opened before the model is known to fit (hpcrun
// generate and eval ask first).
func SourceShape(src string) (config.Config, error) {
	if dir, err := ckpt.Resolve(src); err == nil && dir != "" {
		return SourceConfig(src)
	}
	hf := ""
	if st, err := os.Stat(src); err == nil && st.IsDir() {
		hf = src
	} else if filepath.Ext(src) == ".safetensors" || filepath.Base(src) == interop.HFConfig {
		hf = filepath.Dir(src)
	}
	if hf == "" {
		return SourceConfig(src) // an llm.c file: its header alone
	}
	s, err := interop.ReadHFConfig(hf)
	if err != nil {
		return config.Config{}, err
	}
	cfg := config.DefaultConfig()
	cfg.Model, cfg.Arch, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Positions, cfg.Vocab = s.Model, s.Arch, s.Layers, s.Dim, s.Heads, s.Positions, s.Vocab
	return cfg, nil
}

// CheckWeightsFit refuses, before any rank loads it, the model at src
// whose shape (SourceShape: from its state.json or config.json, not its
// weights files) is out of bounds, or whose weights alone (fp32) need more
// than mem bytes; mem 0 (unknown, or a GPU's) checks the shape only.
func CheckWeightsFit(src string, mem int64) error {
	cfg, err := SourceShape(src)
	if err != nil {
		return err
	}
	if err := config.CheckSize(cfg.Layers, cfg.Dim, cfg.PositionRows(), cfg.Vocab, func(n string) string { return n }); err != nil {
		return fmt.Errorf("%s: %v", src, err)
	}
	if need := 4 * spec.ParamCount(cfg, cfg.Vocab); mem > 0 && need > mem {
		return fmt.Errorf("%s: the model's weights alone need %s, more than the %s of this machine", src, units.Bytes(need, 2), units.Bytes(mem, 2))
	}
	return nil
}
