package train

import (
	"cmp"

	"github.com/hpcrun/hpcrun/train/config"
)

// PlanVocab is the vocabulary a run of cfg will embed, before padding,
// found without reading its data (hpcrun plan must be quick on any data):
// the larger of the config's vocab and its tokenizer's (newTokenizer's, the
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
		return wordPieceSize(cfg), false, nil
	}
	tok, err := newTokenizer(cfg, nil)
	if err != nil {
		return 0, false, err
	}
	return max(cfg.Vocab, tok.VocabSize()), true, nil
}

// defaultWordPieceVocab is the size of a WordPiece vocabulary built from the
// training texts when the config sets no vocab.
const defaultWordPieceVocab = 8192

// wordPieceSize is the size of the WordPiece vocabulary built from the
// training texts when no vocab file is given.
func wordPieceSize(cfg config.Config) int {
	return cmp.Or(cfg.Vocab, defaultWordPieceVocab)
}
