package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// writeByteLevelTokenizer writes a small Hugging Face tokenizer.json into
// dir: GPT-2's byte-level alphabet (byte b has id b), four merges
// (T h, i s, Th is, Ġ a: ids 256-259) and <|endoftext|> (260).
func writeByteLevelTokenizer(t *testing.T, dir string) {
	t.Helper()
	writeByteLevelTokenizerEOT(t, dir, 260)
}

// writeByteLevelTokenizerEOT is writeByteLevelTokenizer's file with
// <|endoftext|> at id eot: past 260 the ids between are unused, as in
// Llama 3's tokenizer.json between its merges and its special tokens.
func writeByteLevelTokenizerEOT(t *testing.T, dir string, eot int) {
	t.Helper()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[tokenizer.ByteLevel([]byte{byte(b)})] = b
	}
	vocab["Th"], vocab["is"], vocab["This"], vocab["Ġa"] = 256, 257, 258, 259
	file := map[string]any{
		"added_tokens":  []map[string]any{{"id": eot, "content": "<|endoftext|>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"T h", "i s", "Th is", "Ġ a"}},
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHFTokenizerRun: a tokenizer.json tokenizes text into a token file,
// trains a GPT with --tokenizer hf, is recorded in train.toml, and eval
// scores the text the same from the token file or the text; generate
// decodes with it.
func TestHFTokenizerRun(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	tok := filepath.Join(e.dir, "tok")
	writeByteLevelTokenizer(t, tok)
	text := filepath.Join(e.dir, "input.txt")
	body := strings.Repeat("This is a tale that is told again and again. ", 60)
	os.WriteFile(text, []byte(body), 0o644)
	_, errOut := e.mustRunErr("data", "tokenize", "--tokenizer", tok, text, "-o", "train.bin")
	// Saved a sentence: This (4 bytes, 1 token), " is" twice (Ġ is),
	// " a", " again" twice and " and" (Ġa).
	if want := len(body) - 60*(3+2+1+2+1); !strings.Contains(errOut, strconv.Itoa(want)+" tokens") {
		t.Errorf("data tokenize: %q, want %d tokens", errOut, want)
	}
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--data", "train.bin", "--tokenizer", "hf", "--vocab-file", tok,
		"--seq", "32", "--bsz", "4", "--steps", "2", "--layers", "1", "--dim", "32", "--heads", "2", "--eval-every", "0", "--device", "cpu")
	run := e.onlyRun()
	toml, _ := os.ReadFile(filepath.Join(run, "train.toml"))
	if !strings.Contains(string(toml), `tokenizer = "hf"`) || !strings.Contains(string(toml), "vocab_file = ") {
		t.Errorf("train.toml does not record the hf tokenizer and its file:\n%s", toml)
	}
	viaBin := e.mustRun("eval", filepath.Base(run), "--data", "train.bin", "--seq", "32", "--device", "cpu")
	viaText := e.mustRun("eval", filepath.Base(run), "--data", text, "--seq", "32", "--device", "cpu")
	if viaBin != viaText {
		t.Errorf("eval of the same text: %q via the token file, %q via the text", viaBin, viaText)
	}
	var gen struct {
		Text     string `json:"text"`
		TokenIDs []int  `json:"token_ids"`
	}
	out := e.mustRun("generate", filepath.Base(run), "--prompt", "This is", "--tokens", "3", "--device", "cpu", "--json")
	if json.Unmarshal([]byte(out), &gen) != nil || len(gen.TokenIDs) != 3 || !strings.HasPrefix(gen.Text, "This is") {
		t.Errorf("generate --json: %q", out)
	}
}
