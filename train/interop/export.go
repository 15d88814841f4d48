package interop

import (
	"encoding/json"
	"fmt"

	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// ExportHF writes the checkpoint ck as a Hugging Face directory: GPT-2 for
// a GPT, LlamaForCausalLM for a Llama (with the run's tokenizer.json), BERT
// for a BERT of the Hugging Face layout (--arch hf); hpcrun ckpt export
// --hf. The weights are stored as dtype (F32, BF16 or F16: the
// checkpoint's fp32 masters rounded to nearest even), which config.json's
// torch_dtype names.
func ExportHF(ck *ckpt.Checkpoint, dir, dtype string) error {
	st := ck.State
	var cfg config.Config
	if err := json.Unmarshal(st.Config, &cfg); err != nil {
		return fmt.Errorf("export %s: config: %v", ck.Dir, err)
	}
	if st.Model == "llama" {
		tensors, _, err := ck.Merge()
		if err != nil {
			return err
		}
		tok := ""
		if cfg.TokenizerName() == "hf" {
			tok = cfg.VocabFile
		}
		return WriteLlamaHF(dir, LlamaSpec(cfg, st.Vocab), tensors, HFOptions{Tokenizer: tok, DType: dtype})
	}
	if st.Model != "gpt" && !(st.Model == "bert" && cfg.Arch == "hf") {
		return fmt.Errorf("export %s: a %s checkpoint of hpcrun's own layout: --hf writes GPT-2 (model gpt), Llama (model llama) and BERT (model bert with --arch hf, as --init-from a BERT trains)", ck.Dir, st.Model)
	}
	tensors, _, err := ck.Merge()
	if err != nil {
		return err
	}
	spec := Spec{Model: st.Model, Arch: cfg.Arch, Layers: cfg.Layers, Dim: cfg.Dim, Heads: cfg.Heads, Positions: cfg.PositionRows(), Vocab: st.Vocab, TypeVocab: 2, Seq: cfg.Seq}
	if st.Model == "bert" {
		return WriteHFBERT(dir, spec, tensors, HFOptions{Prefix: "bert.", DType: dtype})
	}
	return WriteHF(dir, spec, tensors, HFOptions{DType: dtype})
}
