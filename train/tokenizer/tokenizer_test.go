package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

func TestByteTokenizer(t *testing.T) {
	var tok Byte
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
	tok, err := NewGPT2()
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

// TestWordPieceBasicTokenizer encodes accented, CJK, emoji, control and
// punctuation characters with BERT's basic tokenizer rules, against ids
// derived by hand from its definition: control characters (C*) go, Zs is
// white space, CJK ideographs split one each, an uncased vocabulary
// lower-cases (Python's str.lower: final sigma) and strips accents (NFD, no
// Mn), and punctuation is P* and the ASCII non-alphanumerics; emoji and other
// symbols (S*) stay in their word. The vocabularies are in testdata/wordpiece.
func TestWordPieceBasicTokenizer(t *testing.T) {
	tests := []struct {
		vocab string
		text  string
		want  []int
	}{
		// uncased: no tokenizer_config.json, so do_lower_case and strip_accents.
		{"uncased", "Café", []int{5}},
		{"uncased", "Cafe\u0301", []int{5}},            // e and a combining acute (Mn)
		{"uncased", "DÉJÀ-vu,", []int{6, 7, 8, 9}},     // deja - vu ,
		{"uncased", "naïve!", []int{10, 11}},           // naive !
		{"uncased", "中文字ok", []int{12, 13, 14, 15}},    // 中 文 字 ok: each ideograph a word
		{"uncased", "\U00020000\uF900", []int{16, 17}}, // Extension B; a compatibility ideograph, its NFD U+8C48
		{"uncased", "ok😀", []int{15, 18}},              // an emoji (So) is no punctuation: ok ##😀
		{"uncased", "❤️", []int{19}},                   // U+2764 U+FE0F: the variation selector is Mn
		{"uncased", "👍🏽", []int{20, 21}},               // the skin tone (Sk) stays: 👍 ##🏽
		{"uncased", "€5 a×b", []int{22, 23, 24}},       // Sc and Sm are no punctuation: € ##5, a×b
		{"uncased", "co\u00adop", []int{25}},           // soft hyphen (Cf) removed
		{"uncased", "x\x00y\u200bz\x07", []int{26}},    // NUL, zero-width space (Cf), bell (Cc) removed
		{"uncased", "¿Qué? «hi»", []int{27, 28, 29, 30, 31, 32}},
		{"uncased", "ひらがな", []int{33}},                                     // Hiragana is no CJK ideograph; が is か U+3099 (Mn)
		{"uncased", "한", []int{34}},                                        // NFD: the three conjoining jamo (Lo)
		{"uncased", "ΟΔΟΣ", []int{35}},                                     // οδος, final sigma
		{"uncased", "c\u00a0d\u3000e\u2028f\t\r\n", []int{36, 37, 38, 39}}, // NBSP and ideographic space (Zs), line separator
		{"uncased", "$^`|~！", []int{40, 41, 42, 43, 44, 45}},               // ASCII symbols; U+FF01 is Po
		{"uncased", "Unknown 😀", []int{1, 1}},
		// cased: tokenizer_config.json says do_lower_case false, so
		// strip_accents false.
		{"cased", "Café DÉJÀ-vu, cafe", []int{5, 6, 7, 8, 9, 10}},
		{"cased", "中文", []int{11, 12}},
		{"cased", "❤️ ❤", []int{1, 13}}, // the variation selector stays: no ##U+FE0F
		{"cased", "ひらがな Αθήνα", []int{14, 15}},
		{"cased", "\u200bx\x00 CAFE", []int{16, 1}},
	}
	toks := map[string]*WordPiece{}
	for _, tt := range tests {
		tok := toks[tt.vocab]
		if tok == nil {
			var err error
			if tok, err = LoadWordPiece(filepath.Join("testdata", "wordpiece", tt.vocab, "vocab.txt")); err != nil {
				t.Fatal(err)
			}
			toks[tt.vocab] = tok
		}
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Encode(%+q) = %v (%s), want %v", tt.vocab, tt.text, got, tok.Decode(got), tt.want)
		}
	}
	// The pieces above, as one text, give their ids in a row.
	var text strings.Builder
	var want []int
	for _, tt := range tests[:18] {
		text.WriteString(tt.text + " ")
		want = append(want, tt.want...)
	}
	if got := toks["uncased"].Encode(text.String()); !slices.Equal(got, want) {
		t.Errorf("uncased: Encode(%+q) = %v, want %v", text.String(), got, want)
	}
}

// TestWordPieceTokenizerConfig reads do_lower_case, strip_accents and
// tokenize_chinese_chars from the tokenizer_config.json beside vocab.txt.
func TestWordPieceTokenizerConfig(t *testing.T) {
	tests := []struct {
		config string
		vocab  []string // after [PAD] [UNK] [CLS] [SEP], from id 4
		text   string
		want   []int
	}{
		// Lower-cased as Python's str.lower (İ is i and U+0307), accents kept.
		{`{"do_lower_case": true, "strip_accents": false}`, []string{"café", "οδος", "i\u0307stanbul"}, "CAFÉ ΟΔΟΣ İstanbul Cafe", []int{4, 5, 6, 1}},
		{`{"do_lower_case": false, "strip_accents": true}`, []string{"Cafe", "cafe"}, "Café", []int{4}},
		{`{"tokenize_chinese_chars": false}`, []string{"中文", "cafe"}, "中文 Café", []int{4, 5}},
		{`{"do_lower_case": true, "strip_accents": null}`, []string{"cafe"}, "Café", []int{4}},
	}
	for _, tt := range tests {
		dir := t.TempDir()
		vocab := append([]string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}, tt.vocab...)
		if err := os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte(strings.Join(vocab, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(tt.config), 0o644); err != nil {
			t.Fatal(err)
		}
		tok, err := LoadWordPiece(filepath.Join(dir, "vocab.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode(tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Encode(%q) = %v (%s), want %v", tt.config, tt.text, got, tok.Decode(got), tt.want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "vocab.txt"), []byte("[PAD]\n[UNK]\n[CLS]\n[SEP]\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"do_lower_case": "yes"}`), 0o644)
	if _, err := LoadWordPiece(filepath.Join(dir, "vocab.txt")); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json") {
		t.Errorf("a bad tokenizer_config.json: err = %v", err)
	}
}

// endlessLines is an io.Reader of "w\n" without end, counting the bytes
// it gave.
type endlessLines struct{ read int }

func (e *endlessLines) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = "w\n"[(e.read+i)%2]
	}
	e.read += len(p)
	return len(p), nil
}

// A vocab.txt of more lines than a vocabulary holds is refused while it is
// read, one line past the limit (20M lines were read whole and taken, and
// plan said the run fit); New, which plan reads it with, refuses it with
// the same words.
func TestWordPieceVocabLimit(t *testing.T) {
	if !strings.Contains(fmt.Sprint(maxVocabLines), "16777216") {
		t.Fatalf("the limit is %d, want config.MaxVocab", maxVocabLines)
	}
	old := maxVocabLines
	maxVocabLines = 1000
	defer func() { maxVocabLines = old }()
	r := &endlessLines{}
	_, err := readWordPieceVocab(r, "endless")
	if err == nil || !strings.Contains(err.Error(), "wordpiece vocab endless: more than 1000 lines, the most ids hpcrun's vocabulary holds") {
		t.Fatalf("an endless vocab: %v", err)
	}
	if r.read > 1<<20 {
		t.Errorf("read %d bytes of an endless vocab before refusing it", r.read)
	}
	path := filepath.Join(t.TempDir(), "vocab.txt")
	lines := []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]"}
	for i := len(lines); i <= 1000; i++ {
		lines = append(lines, fmt.Sprint("w", i))
	}
	os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	if _, err := LoadWordPiece(path); err == nil || !strings.Contains(err.Error(), path+": more than 1000 lines") {
		t.Errorf("LoadWordPiece of 1001 lines: %v", err)
	}
	if _, err := New(config.Config{Model: "bert", Tokenizer: "wordpiece", VocabFile: path}, nil); err == nil || !strings.Contains(err.Error(), "more than 1000 lines") {
		t.Errorf("New of 1001 lines (what plan reads through PlanVocab): %v", err)
	}
	os.WriteFile(path, []byte(strings.Join(lines[:1000], "\n")+"\n"), 0o644)
	if tok, err := LoadWordPiece(path); err != nil || tok.VocabSize() != 1000 {
		t.Errorf("LoadWordPiece of 1000 lines: %v", err)
	}
	os.WriteFile(path, []byte("[PAD]\n"+strings.Repeat("x", 70000)+"\n"), 0o644)
	if _, err := LoadWordPiece(path); err == nil || !strings.Contains(err.Error(), "line 2 is longer than 65536 bytes") {
		t.Errorf("LoadWordPiece of a 70000-byte line: %v", err)
	}
}

// FuzzReadWordPieceVocab: any vocab.txt is refused with one line, or gives
// a tokenizer that encodes text into ids of its vocabulary.
func FuzzReadWordPieceVocab(f *testing.F) {
	f.Add([]byte("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n##s\n"), "the cats")
	f.Add([]byte("[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[UNK]\n"), "x")
	f.Add([]byte(strings.Repeat("w\n", 40)), "w w")
	f.Add([]byte("[PAD]\n"+strings.Repeat("x", 70000)), "")
	f.Fuzz(func(t *testing.T, b []byte, text string) {
		old := maxVocabLines
		maxVocabLines = 32
		defer func() { maxVocabLines = old }()
		vocab, err := readWordPieceVocab(strings.NewReader(string(b)), "vocab.txt")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("a message of more than one line: %q", err)
			}
			return
		}
		if len(vocab) > maxVocabLines {
			t.Fatalf("%d tokens past the limit of %d", len(vocab), maxVocabLines)
		}
		tok, err := NewWordPiece(vocab)
		if err != nil {
			return
		}
		for _, id := range tok.Encode(text) {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d of %q outside the vocabulary of %d", id, text, tok.VocabSize())
			}
		}
	})
}
