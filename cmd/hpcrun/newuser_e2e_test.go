package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These tests follow README.md as a new user would (issue 28): each is a
// command as typed, and what it must say or do.

// TestTokenFileRunRecordsItsTokenizer: a GPT trained on a token file
// (GPT-2 BPE, from hpcrun data tokenize) records the tokenizer in
// train.toml, and eval scores the same text the same whether given the
// token file or the text it came from.
func TestTokenFileRunRecordsItsTokenizer(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	text := filepath.Join(e.dir, "input.txt")
	os.WriteFile(text, []byte(strings.Repeat("This License applies to any program or other work which contains a notice. ", 80)), 0o644)
	e.mustRun("data", "tokenize", text, "-o", "train.bin")
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--data", "train.bin", "--seq", "32", "--bsz", "4",
		"--steps", "2", "--layers", "1", "--dim", "32", "--heads", "2", "--eval-every", "0", "--device", "cpu")
	run := e.onlyRun()
	toml, _ := os.ReadFile(filepath.Join(run, "train.toml"))
	if !strings.Contains(string(toml), `tokenizer = "gpt2"`) {
		t.Errorf("train.toml does not record the gpt2 tokenizer:\n%s", toml)
	}
	viaBin := e.mustRun("eval", filepath.Base(run), "--data", "train.bin", "--seq", "32", "--device", "cpu")
	viaText := e.mustRun("eval", filepath.Base(run), "--data", text, "--seq", "32", "--device", "cpu")
	if viaBin != viaText {
		t.Errorf("eval of the same text: %q via the token file, %q via the text", viaBin, viaText)
	}
}
