package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
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
