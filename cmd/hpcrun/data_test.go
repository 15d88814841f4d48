package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDataTokenizeLargeVocab: data tokenize --tokenizer with a tokenizer of
// more than 65,536 ids (its end-of-text at Llama 3's 128001) writes llm.c's
// uint32 token file, end-of-text between the texts; with GPT-2's 50,257
// ids it writes the uint16 one.
func TestDataTokenizeLargeVocab(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	os.WriteFile(a, []byte("This"), 0o644)
	os.WriteFile(b, []byte("is a"), 0o644)
	for _, c := range []struct {
		eot            int
		magic, version uint32
		width          int
	}{
		{128001, 20240801, 7, 4},
		{50256, 20240520, 1, 2},
	} {
		tok := filepath.Join(dir, "tok", "eot"+string(rune('0'+c.width)))
		writeByteLevelTokenizerEOT(t, tok, c.eot)
		out := filepath.Join(dir, "out"+string(rune('0'+c.width))+".bin")
		if msg, err := runApp(t, "data", "tokenize", "--tokenizer", tok, a, b, "-o", out); err != nil {
			t.Fatalf("data tokenize, end-of-text %d: %v\n%s", c.eot, err, msg)
		}
		f, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		// This (258), end-of-text, i s (257), Ġ a (259).
		want := []uint32{258, uint32(c.eot), 257, 259}
		h := func(i int) uint32 { return binary.LittleEndian.Uint32(f[4*i:]) }
		if h(0) != c.magic || h(1) != c.version || h(2) != uint32(len(want)) || len(f) != 1024+c.width*len(want) {
			t.Fatalf("end-of-text %d: magic %d version %d, %d tokens in %d bytes; want %d %d, %d in %d",
				c.eot, h(0), h(1), h(2), len(f), c.magic, c.version, len(want), 1024+c.width*len(want))
		}
		var got []uint32
		for p := 1024; p < len(f); p += c.width {
			if c.width == 4 {
				got = append(got, binary.LittleEndian.Uint32(f[p:]))
			} else {
				got = append(got, uint32(binary.LittleEndian.Uint16(f[p:])))
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("end-of-text %d: tokens %v, want %v", c.eot, got, want)
		}
	}
}

// TestDataTokenizeRunawayPattern: a tokenizer.json whose Split pattern
// backtracks without bound ((a+)+$ on 34 a's and a b) fails data tokenize
// with the pattern and the text's position, instead of spinning forever,
// and leaves no token file.
func TestDataTokenizeRunawayPattern(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	writeByteLevelTokenizerEOT(t, tok, 50256)
	b, err := os.ReadFile(filepath.Join(tok, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	f["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
	}}
	b, _ = json.Marshal(f)
	os.WriteFile(filepath.Join(tok, "tokenizer.json"), b, 0o644)
	text := filepath.Join(dir, "a.txt")
	os.WriteFile(text, []byte(strings.Repeat("a", 34)+"b"), 0o644)
	out := filepath.Join(dir, "out.bin")
	done := make(chan error, 1)
	go func() {
		_, err := runApp(t, "data", "tokenize", "--tokenizer", tok, text, "-o", out)
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("data tokenize still runs after 60 s on a pattern that backtracks without bound")
	}
	if err == nil || !strings.Contains(err.Error(), `"(a+)+$" did not finish on the text at character 0`) {
		t.Errorf("data tokenize: %v, want the pattern and the position", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a token file was left behind")
	}
}

// data tokenize --json says what it wrote: the file, the token count and
// the format the vocabulary chose.
func TestDataTokenizeJSON(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.txt")
	os.WriteFile(a, []byte("This is a"), 0o644)
	tok := filepath.Join(dir, "tok")
	writeByteLevelTokenizerEOT(t, tok, 128001)
	out := filepath.Join(dir, "out.bin")
	msg, err := runApp(t, "data", "tokenize", "--json", "--tokenizer", tok, a, "-o", out)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Output, Format string
		Tokens         int
	}
	if err := json.Unmarshal([]byte(msg), &got); err != nil || got.Output != out || got.Format != "uint32" || got.Tokens != 4 {
		t.Errorf("data tokenize --json: %q (%v), want the file, 4 tokens, uint32", msg, err)
	}
}
