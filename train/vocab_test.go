package train

import (
	"path/filepath"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/spec"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// One vocabulary rule for every tokenizer: data.PlanVocab gives the ids
// that data.Prepare embeds, and BenchStep builds its model with them (it
// sized an hf tokenizer's model by the byte tokenizer's 256 ids, and a
// BERT's with no tokenizer set as well).
func TestOneVocabRule(t *testing.T) {
	hf := tinyHF // 262 ids
	for _, c := range []struct {
		name, model, tokenizer, vocabFile, data string
		vocab                                   int // the config's
		want                                    int
		exact                                   bool
	}{
		{"byte", "gpt", "byte", "", "synthetic", 0, 256, true},
		{"byte padded", "gpt", "byte", "", "synthetic", 300, 300, true},
		{"default gpt", "gpt", "", "", "synthetic", 0, 256, true},
		{"gpt2", "gpt", "gpt2", "", "synthetic", 0, 50257, true},
		{"hf", "gpt", "hf", filepath.Join(hf, "tokenizer.json"), "synthetic", 0, 262, true},
		{"hf dir", "llama", "hf", hf, "synthetic", 0, 262, true},
		{"wordpiece file", "bert", "wordpiece", "tokenizer/testdata/wordpiece/uncased/vocab.txt", "synthetic", 0, 46, true},
		{"wordpiece built", "bert", "wordpiece", "", "synthetic", 0, -1, true},
		{"default bert", "bert", "", "", "synthetic", 0, -1, true},
		{"wordpiece of a file", "bert", "wordpiece", "", "reviews.csv", 0, tokenizer.WordPieceVocabSize(config.Config{}), false},
		{"wordpiece of a file, sized", "bert", "wordpiece", "", "reviews.csv", 500, 500, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := smallConfig(c.model)
			cfg.Tokenizer, cfg.VocabFile, cfg.Data, cfg.Vocab = c.tokenizer, c.vocabFile, c.data, c.vocab
			cfg.BatchSize, cfg.Samples = 2, 64
			got, exact, err := data.PlanVocab(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if exact != c.exact || c.want > 0 && got != c.want {
				t.Fatalf("PlanVocab = %d, exact %v; want %d, %v", got, exact, c.want, c.exact)
			}
			if !exact {
				return // the data file is not there: nothing to prepare or bench
			}
			d, err := data.Prepare(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Vocab != got {
				t.Errorf("Prepare embeds %d ids, PlanVocab says %d", d.Vocab, got)
			}
			st, err := BenchStep(cfg, tensor.NewCPU(), 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if want := spec.ParamCount(cfg, got); st.Params != want {
				t.Errorf("BenchStep's model has %d parameters, want %d (a vocabulary of %d)", st.Params, want, got)
			}
		})
	}
}
