package train

import (
	"reflect"
	"slices"
	"testing"
)

func TestByteTokenizer(t *testing.T) {
	var tok ByteTokenizer
	ids := tok.Encode("hé\x01")
	want := []int{'h', 0xc3, 0xa9, ' '}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("Encode = %v, want %v", ids, want)
	}
	if got := tok.Decode(tok.Encode("hello")); got != "hello" {
		t.Fatalf("round trip = %q", got)
	}
	if tok.VocabSize() != 256 {
		t.Fatalf("VocabSize = %d", tok.VocabSize())
	}
}

func TestGPT2TokenizerOffline(t *testing.T) {
	tok, err := NewGPT2Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	// Reference ids from GPT-2's published tokenizer.
	ids := tok.Encode("Hello world, this is a test.")
	want := []int{15496, 995, 11, 428, 318, 257, 1332, 13}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("Encode = %v, want %v", ids, want)
	}
	if got := tok.Decode(ids); got != "Hello world, this is a test." {
		t.Fatalf("Decode = %q", got)
	}
	if tok.Specials().EOT != 50256 || tok.VocabSize() != 50257 {
		t.Fatalf("specials %+v vocab %d", tok.Specials(), tok.VocabSize())
	}
}

func TestWordPiece(t *testing.T) {
	tok, err := LoadWordPiece("testdata/vocab.txt")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		text string
		want []int
	}{
		{"The movie", []int{5, 6}},
		{"unwanted, running!", []int{7, 8, 9, 10, 12, 13, 11}},
		{"unknownword", []int{1}},
		{"", nil},
	}
	for _, tt := range tests {
		if got := tok.Encode(tt.text); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if got := tok.Decode([]int{7, 8, 9, 6}); got != "unwanted movie" {
		t.Errorf("Decode = %q", got)
	}
	if sp := tok.Specials(); sp != (Specials{Pad: 0, CLS: 2, EOT: 3}) {
		t.Errorf("Specials = %+v", sp)
	}
}

func TestWordPieceErrors(t *testing.T) {
	if _, err := LoadWordPiece("testdata/missing.txt"); err == nil {
		t.Error("missing vocab file: no error")
	}
	if _, err := NewWordPiece([]string{"[PAD]", "a"}); err == nil {
		t.Error("vocab without [UNK]/[CLS]/[SEP]: no error")
	}
}

func TestBuildWordPieceVocab(t *testing.T) {
	texts := []string{"good movie", "bad movie", "good film!", "Zq"}
	v := BuildWordPieceVocab(texts, 1000)
	tok, err := NewWordPiece(v)
	if err != nil {
		t.Fatal(err)
	}
	// "movie" and "good" are whole words (seen twice); "zq" splits into characters.
	ids := tok.Encode("good movie zq")
	if len(ids) != 4 {
		t.Fatalf("Encode = %v (%q), want 4 ids", ids, tok.Decode(ids))
	}
	if got := tok.Decode(ids); got != "good movie zq" {
		t.Fatalf("Decode = %q", got)
	}
	if !reflect.DeepEqual(v, BuildWordPieceVocab(texts, 1000)) {
		t.Fatal("vocab is not deterministic")
	}
	// The cap leaves out words but never characters.
	if small := BuildWordPieceVocab(texts, 5); slices.Contains(small, "movie") || !slices.Contains(small, "##q") {
		t.Fatalf("size cap: %v", small)
	}
}
