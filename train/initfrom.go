package train

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// ApplyInitFrom gives c the model shape of its init_from weights (model,
// layers, dim, heads, positions, vocab; a Llama's kv heads, ffn, norm eps,
// rope theta and scaling and head tying; the GPT-2 tokenizer for GPT-2's
// 50257-id vocabulary when none is chosen, else the tokenizer.json beside
// the weights). explicit reports the config keys
// the user set (flags): one whose value contradicts the file is an error
// that names both. Without init_from it does nothing.
func ApplyInitFrom(c *config.Config, explicit func(key string) bool) error {
	if c.InitFrom == "" {
		return nil
	}
	s, err := interop.Inspect(c.InitFrom)
	if err != nil {
		return err
	}
	if explicit == nil {
		explicit = func(string) bool { return false }
	}
	for _, d := range []struct {
		key  string
		flag any
		file any
		set  func()
	}{
		{"model", c.Model, s.Model, func() { c.Model = s.Model }},
		{"arch", c.Arch, s.Arch, func() { c.Arch = s.Arch }},
		{"layers", c.Layers, s.Layers, func() { c.Layers = s.Layers }},
		{"dim", c.Dim, s.Dim, func() { c.Dim = s.Dim }},
		{"heads", c.Heads, s.Heads, func() { c.Heads = s.Heads }},
		{"positions", c.Positions, s.Positions, func() { c.Positions = s.Positions }},
		{"vocab", c.Vocab, s.Vocab, func() { c.Vocab = s.Vocab }},
		{"kv_heads", c.KVHeads, s.KVHeads, func() { c.KVHeads = s.KVHeads }},
		{"ffn", c.FFN, s.FFN, func() { c.FFN = s.FFN }},
		{"norm_eps", c.NormEps, s.NormEps, func() { c.NormEps = s.NormEps }},
		{"rope_theta", c.RopeTheta, s.RopeTheta, func() { c.RopeTheta = s.RopeTheta }},
		{"rope_factor", c.RopeFactor, s.RopeFactor, func() { c.RopeFactor = s.RopeFactor }},
		{"rope_low_freq", c.RopeLowFreq, s.RopeLowFreq, func() { c.RopeLowFreq = s.RopeLowFreq }},
		{"rope_high_freq", c.RopeHighFreq, s.RopeHighFreq, func() { c.RopeHighFreq = s.RopeHighFreq }},
		{"rope_original_seq", c.RopeOriginalSeq, s.RopeOriginalSeq, func() { c.RopeOriginalSeq = s.RopeOriginalSeq }},
		{"untied_head", c.UntiedHead, s.UntiedHead, func() { c.UntiedHead = s.UntiedHead }},
	} {
		if explicit(d.key) && d.flag != d.file {
			return fmt.Errorf("--%s %v contradicts %s, whose model has %s %v: leave --%s out with --init-from", d.key, d.flag, s.Source, d.key, d.file, d.key)
		}
		d.set()
	}
	c.Preset = ""
	if c.Tokenizer == "" && s.Vocab == tokenizer.GPT2Vocab {
		c.Tokenizer = "gpt2"
	}
	// Another decoder reads the tokenizer.json it was trained with.
	hf := filepath.Join(filepath.Dir(s.Source), "tokenizer.json")
	if _, err := os.Stat(hf); err == nil && c.Tokenizer == "" && s.Model != "bert" && !explicit("vocab_file") {
		c.Tokenizer, c.VocabFile = "hf", hf
	}
	if s.Model == "bert" {
		// A pretrained BERT reads its own vocab.txt, so that it sees the ids
		// it was trained with.
		vocab := filepath.Join(filepath.Dir(s.Source), "vocab.txt")
		if _, err := os.Stat(vocab); err == nil && c.VocabFile == "" && !explicit("vocab_file") {
			c.VocabFile = vocab
		}
		if c.Tokenizer == "" {
			c.Tokenizer = "wordpiece"
		}
	}
	return nil
}

// checkInitFrom checks that the init_from weights have this config's model
// shape: a train.toml edited after submission fails here, naming both.
func checkInitFrom(cfg config.Config, vocab int, s interop.Spec) error {
	if s.Model == "bert" && s.TypeVocab != config.BERTTypes {
		return fmt.Errorf("init_from %s has type_vocab_size %d: hpcrun's BERT has %d token types", s.Source, s.TypeVocab, config.BERTTypes)
	}
	for _, d := range []struct {
		key        string
		have, file any
	}{
		{"model", cfg.Model, s.Model}, {"arch", cfg.Arch, s.Arch}, {"layers", cfg.Layers, s.Layers}, {"dim", cfg.Dim, s.Dim},
		{"heads", cfg.Heads, s.Heads}, {"positions", cfg.PositionRows(), s.Positions}, {"vocab", vocab, s.Vocab},
		{"kv_heads", cfg.KVHeads, s.KVHeads}, {"ffn", cfg.FFN, s.FFN}, {"norm_eps", cfg.NormEps, s.NormEps}, {"rope_theta", cfg.RopeTheta, s.RopeTheta},
		{"rope_factor", cfg.RopeFactor, s.RopeFactor}, {"rope_low_freq", cfg.RopeLowFreq, s.RopeLowFreq},
		{"rope_high_freq", cfg.RopeHighFreq, s.RopeHighFreq}, {"rope_original_seq", cfg.RopeOriginalSeq, s.RopeOriginalSeq},
		{"untied_head", cfg.UntiedHead, s.UntiedHead},
	} {
		if d.have != d.file {
			return fmt.Errorf("init_from %s has %s %v, this run's config has %v", s.Source, d.key, d.file, d.have)
		}
	}
	return nil
}

// loadPretrained fills this rank's parameters from cfg.InitFrom, reading
// only this rank's slices.
func (t *trainer) loadPretrained() error {
	cfg := t.cfg
	cfg.ResumeFrom = ""
	if err := loadWeights(t.model.ParamSet(), cfg, t.data.Vocab); err != nil {
		return err
	}
	t.logf("weights from %s", cfg.InitFrom)
	return nil
}
