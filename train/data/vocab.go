package data

import (
	"fmt"

	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// PlanVocab is the vocabulary a run of cfg will embed, before padding,
// found without reading its data (hpcrun plan must be quick on any data):
// the larger of the config's vocab and its tokenizer's (tokenizer.New's, the
// one switch from a tokenizer's name to its ids). Only a WordPiece built
// from a data file depends on the data: then exact is false and vocab is
// the most it can hold.
func PlanVocab(cfg config.Config) (vocab int, exact bool, err error) {
	if cfg.TokenizerName() == "wordpiece" && cfg.VocabFile == "" {
		if cfg.Data == "synthetic" && !cfg.LM() {
			d, err := Prepare(cfg) // built in memory: no file to read
			if err != nil {
				return 0, false, err
			}
			return d.Vocab, true, nil
		}
		return tokenizer.WordPieceVocabSize(cfg), false, nil
	}
	tok, err := tokenizer.New(cfg, nil)
	if err != nil {
		return 0, false, err
	}
	return max(cfg.Vocab, tok.VocabSize()), true, nil
}

// ModelVocab is the number of ids the model embeds: the tokenizer's, or the
// config's vocab when that is larger.
func ModelVocab(cfg config.Config, tok tokenizer.Tokenizer) (int, error) {
	n := tok.VocabSize()
	if cfg.Vocab == 0 {
		return n, nil
	}
	if cfg.Vocab < n {
		return 0, fmt.Errorf("vocab %d is smaller than the %s tokenizer's %d ids: raise --vocab or leave it 0", cfg.Vocab, tok.Name(), n)
	}
	return cfg.Vocab, nil
}
