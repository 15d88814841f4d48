package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// TestHFTokenizerFilesEncodeAsTheRun: the tokenizer files an export
// writes for GPT-2's BPE and for the byte tokenizer, read back as a
// tokenizer.json, give the ids and the text the run's tokenizer gives.
func TestHFTokenizerFilesEncodeAsTheRun(t *testing.T) {
	gpt2, err := NewGPT2()
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"First Citizen:\nBefore we proceed any further, hear me speak.", "  naïve café 1234567 —  x\t\ty's they'll", "\x00\x01\x02 bytes ÿ €"}
	for _, tc := range []struct {
		tokenizer string
		run       Tokenizer
	}{{"gpt2", gpt2}, {"byte", Byte{}}} {
		files, err := HFFiles(config.Config{Model: "gpt", Tokenizer: tc.tokenizer})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, b := range files {
			os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		hf, err := LoadHF(dir)
		if err != nil {
			t.Fatalf("%s: %v", tc.tokenizer, err)
		}
		for _, text := range texts {
			want, got := tc.run.Encode(text), hf.Encode(text)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %q encodes as %v, the run's tokenizer %v", tc.tokenizer, text, got, want)
			}
			if d, w := hf.Decode(want), tc.run.Decode(want); d != w {
				t.Errorf("%s: decodes %q, the run's tokenizer %q", tc.tokenizer, d, w)
			}
		}
		if hf.Specials().EOT != tc.run.Specials().EOT || hf.VocabSize() != tc.run.VocabSize() {
			t.Errorf("%s: end of text %d, vocabulary %d; the run's %d, %d", tc.tokenizer, hf.Specials().EOT, hf.VocabSize(), tc.run.Specials().EOT, tc.run.VocabSize())
		}
		// A GPT trained with that tokenizer.json (--tokenizer hf) exports
		// it as it is; a Llama's interop.ExportHF copies.
		again, err := HFFiles(config.Config{Model: "gpt", Tokenizer: "hf", VocabFile: dir})
		if err != nil || string(again["tokenizer.json"]) != string(files["tokenizer.json"]) || string(again["tokenizer_config.json"]) != string(files["tokenizer_config.json"]) {
			t.Errorf("%s as --tokenizer hf: %v, files %d", tc.tokenizer, err, len(again))
		}
		if f, _ := HFFiles(config.Config{Model: "llama", Tokenizer: "hf", VocabFile: dir}); f != nil {
			t.Errorf("a Llama's hf tokenizer: %d files, want none (interop copies it)", len(f))
		}
	}
}
