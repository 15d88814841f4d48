package train

import "github.com/hpcrun/hpcrun/train/config"

// PlanVocab is the vocabulary a run of cfg will embed, before padding,
// found without reading its data (hpcrun plan must be quick on any data):
// the config's vocab, the byte (256) or GPT-2 (50257) tokenizer's, a
// tokenizer.json's or a WordPiece vocab file's, or the WordPiece vocabulary built from the
// synthetic set. Only a WordPiece built from a data file depends on the
// data: then exact is false and vocab is the most it can hold.
func PlanVocab(cfg config.Config) (vocab int, exact bool, err error) {
	tokenizer := cfg.TokenizerName()
	var n int
	switch {
	case tokenizer == "byte":
		n = ByteTokenizer{}.VocabSize()
	case tokenizer == "gpt2":
		n = gpt2Vocab
	case tokenizer == "hf":
		tok, err := LoadHFTokenizer(cfg.VocabFile)
		if err != nil {
			return 0, false, err
		}
		n = tok.VocabSize()
	case tokenizer == "wordpiece" && cfg.VocabFile != "":
		tok, err := LoadWordPiece(cfg.VocabFile)
		if err != nil {
			return 0, false, err
		}
		n = tok.VocabSize()
	case tokenizer == "wordpiece" && cfg.Data == "synthetic" && !cfg.LM():
		d, err := Prepare(cfg) // built in memory: no file to read
		if err != nil {
			return 0, false, err
		}
		return d.Vocab, true, nil
	default:
		size := cfg.Vocab
		if size == 0 {
			size = defaultWordPieceVocab
		}
		return size, false, nil
	}
	if cfg.Vocab > n {
		return cfg.Vocab, true, nil
	}
	return n, true, nil
}
