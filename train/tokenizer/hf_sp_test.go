package tokenizer

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// spVocab is a SentencePiece-style vocabulary made for the tests: <unk>,
// <s>, </s> (0-2), the byte tokens <0x00>..<0xFF> (3-258), then the
// characters and merges listed, ids from 259 on.
func spVocab() (map[string]any, map[string]int) {
	vocab := map[string]any{"<unk>": 0, "<s>": 1, "</s>": 2}
	ids := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
		ids[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for i, tok := range []string{"▁", "h", "e", "l", "o", "w", "r", "d", "é", "▁h", "el", "lo", "▁hel", "▁hello", "▁w", "▁▁"} {
		vocab[tok], ids[tok] = 259+i, 259+i
	}
	return vocab, ids
}

// spMerges are the merges of spVocab, by rank.
var spMerges = [][2]string{{"▁", "h"}, {"e", "l"}, {"l", "o"}, {"▁h", "el"}, {"▁hel", "lo"}, {"▁", "w"}, {"▁", "▁"}}

// spTokenizer is Llama 2's tokenizer.json layout over spVocab: legacy
// (the normalizer's Prepend and Replace, a Replace/ByteFallback/Fuse/Strip
// decoder) or metaspace (the Metaspace pre-tokenizer, prepend_scheme
// first, no split, and the same decoder, as newer conversions write it),
// <s> and </s> added.
func spTokenizer(t *testing.T, style string) *HF {
	t.Helper()
	vocab, _ := spVocab()
	decoder := map[string]any{"type": "Sequence", "decoders": []any{
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
		map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
		map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}}
	file := map[string]any{
		"decoder":      decoder,
		"added_tokens": []map[string]any{{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true}, {"id": 2, "content": "</s>", "special": true}},
		"model":        map[string]any{"type": "BPE", "vocab": vocab, "merges": spMerges, "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true},
	}
	switch style {
	case "legacy":
		file["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}}
	case "metaspace":
		file["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := parseHFTokenizer(b)
	if err != nil {
		t.Fatalf("%s: %v", style, err)
	}
	return tok
}

// Llama 2's SentencePiece-style tokenizer.json, both layouts: the ids of
// texts worked out by hand from the vocabulary and the merges (the
// leading "▁", spaces as "▁", merges by rank, characters the vocabulary
// lacks as their UTF-8 byte tokens), and the round trip of a corpus with
// Unicode and runs of white space.
func TestHFTokenizerSentencePiece(t *testing.T) {
	_, id := spVocab()
	b := func(x byte) int { return 3 + int(x) }
	for _, style := range []string{"legacy", "metaspace"} {
		tok := spTokenizer(t, style)
		for _, tc := range []struct {
			text string
			want []int
		}{
			// ▁ h e l l o ▁ w o r l d: ▁h, el, lo, ▁hel, ▁hello, ▁w.
			{"hello world", []int{id["▁hello"], id["▁w"], id["o"], id["r"], id["l"], id["d"]}},
			// a and b are not in the vocabulary: their bytes; two spaces ▁▁.
			{"a  b", []int{id["▁"], b('a'), id["▁▁"], b('b')}},
			// é is a character of the vocabulary, 世 three byte tokens.
			{"hé世", []int{id["▁h"], id["é"], b(0xE4), b(0xB8), b(0x96)}},
			{"<s>hello</s>", []int{id["<s>"], id["h"], id["el"], id["lo"], id["</s>"]}},
		} {
			want := tc.want
			if style == "legacy" && tc.text == "<s>hello</s>" {
				// The legacy normalizer prepends to every piece between added tokens.
				want = []int{id["<s>"], id["▁hello"], id["</s>"]}
			}
			if got := tok.Encode(tc.text); !reflect.DeepEqual(got, want) {
				t.Errorf("%s: Encode(%q) = %v, want %v", style, tc.text, got, want)
			}
		}
		if got := tok.Decode([]int{b(0xE4), b(0xB8), id["h"], b(0xFF)}); got != "\uFFFD\uFFFDh\uFFFD" {
			t.Errorf("%s: bytes that are not UTF-8 decode to %q, want one U+FFFD each", style, got)
		}
	}
	// The legacy layout gives back every text without a "▁" of its own
	// (one decodes as a space, as in the library; Metaspace's "first"
	// drops a leading space, as the library does: not a round trip).
	tok := spTokenizer(t, "legacy")
	for _, text := range append(hfCorpus(t), "  two leading, three trailing   ", "\t\ttabs\n\n\nnewlines \u00a0nbsp", "mixed é 世界 🙂 hello") {
		if back := tok.Decode(tok.Encode(text)); back != text {
			t.Errorf("%.40q decodes to %.40q", text, back)
		}
	}
	if got := tok.Decode(tok.Encode("a ▁ b")); got != "a   b" {
		t.Errorf("a literal ▁: %q, want a space", got)
	}
	meta := spTokenizer(t, "metaspace")
	if got := meta.Decode(meta.Encode(" hello")); got != "hello" {
		t.Errorf("metaspace: %q, want the leading space dropped", got)
	}
	if got := meta.Decode(meta.Encode("hello  world")); got != "hello  world" {
		t.Errorf("metaspace: %q", got)
	}
}

// The Metaspace pre-tokenizer's prepend schemes and split (each "▁" starts
// a piece, merged with what follows), and its decoder (the first token's
// "▁" dropped).
func TestMetaspace(t *testing.T) {
	for _, tc := range []struct {
		m       metaspace
		text    string
		atStart bool
		want    []string
	}{
		{metaspace{"▁", "always", true}, "hello  world", false, []string{"▁hello", "▁", "▁world"}},
		{metaspace{"▁", "first", true}, "a b", false, []string{"a", "▁b"}},
		{metaspace{"▁", "first", false}, "a b", true, []string{"▁a▁b"}},
		{metaspace{"▁", "never", false}, "a b", true, []string{"a▁b"}},
		{metaspace{"▁", "always", false}, " a", true, []string{"▁a"}},
	} {
		if got := tc.m.pieces(tc.text, tc.atStart); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v %q at start %v: %q, want %q", tc.m, tc.text, tc.atStart, got, tc.want)
		}
	}
	tok := &HF{tokens: []string{"▁hello", "▁w", "or", "▁▁"}}
	if err := tok.addDecoder(json.RawMessage(`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}`)); err != nil {
		t.Fatal(err)
	}
	if got := tok.decodeSymbols([]int{0, 1, 2, 3}); got != "hello wor  " {
		t.Errorf("Metaspace decoder: %q", got)
	}
}
