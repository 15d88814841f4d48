package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// The Hugging Face tokenizer fixtures, described in testdata/hf/README.md.
const (
	tinyHF        = "testdata/hf/tiny"         // byte b is id b, four merges, <|eot|> and <pad>
	templateHF    = "testdata/hf/template"     // tiny's, <|begin_of_text|> before each sequence
	templateEOTHF = "testdata/hf/template-eot" // template's, <|eot|> after each sequence too
)

// hfCorpus are the texts of testdata/hf/corpus.json, which exercise the
// pre-tokenizers.
func hfCorpus(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("testdata/hf/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	if err := json.Unmarshal(b, &texts); err != nil {
		t.Fatal(err)
	}
	return texts
}

// llama3Pattern is Llama 3's pre-tokenizer expression.
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// tokenizerJSONFromRanks writes the tokenizer.json of a tiktoken rank table
// (id = rank): the vocabulary in byte-level characters and the merges that
// rebuild each token, derived as the conversion of tiktoken files to
// tokenizers does: a token's merge is the last step of the BPE of its bytes
// over the tokens ranked before it.
func tokenizerJSONFromRanks(t *testing.T, ranks map[string]int, pre any, ignoreMerges bool) []byte {
	t.Helper()
	byteLevel := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			b.WriteRune(byteRunes[s[i]])
		}
		return b.String()
	}
	type tok struct {
		s    string
		rank int
	}
	toks := make([]tok, 0, len(ranks))
	vocab := make(map[string]int, len(ranks))
	for s, r := range ranks {
		toks = append(toks, tok{s, r})
		vocab[byteLevel(s)] = r
	}
	sort.Slice(toks, func(i, j int) bool { return toks[i].rank < toks[j].rank })
	var merges [][2]string
	for _, tk := range toks {
		if len(tk.s) < 2 {
			continue
		}
		parts := make([]string, len(tk.s))
		for i := range len(tk.s) {
			parts[i] = tk.s[i : i+1]
		}
		for len(parts) > 2 {
			best, at := tk.rank, -1
			for i := 0; i+1 < len(parts); i++ {
				if r, ok := ranks[parts[i]+parts[i+1]]; ok && r < best {
					best, at = r, i
				}
			}
			if at < 0 {
				break
			}
			parts[at] += parts[at+1]
			parts = append(parts[:at+1], parts[at+2:]...)
		}
		if len(parts) != 2 {
			t.Fatalf("token %q (rank %d) is not one merge of earlier tokens: %q", tk.s, tk.rank, parts)
		}
		merges = append(merges, [2]string{byteLevel(parts[0]), byteLevel(parts[1])})
	}
	file := map[string]any{
		"version":       "1.0",
		"added_tokens":  []map[string]any{{"id": 50256, "content": "<|endoftext|>", "special": true}},
		"normalizer":    nil,
		"pre_tokenizer": pre,
		"decoder":       map[string]any{"type": "ByteLevel"},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": ignoreMerges, "byte_fallback": false},
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// r50k is GPT-2's rank table, embedded in the tiktoken loader.
func r50k(t *testing.T) map[string]int {
	t.Helper()
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe("https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken")
	if err != nil {
		t.Fatal(err)
	}
	return ranks
}

// The tokenizer.json of GPT-2 (ByteLevel with its expression) and of a
// Llama-3-style file (Split with Llama 3's expression, then ByteLevel
// without, ignore_merges) encode like tiktoken, an independent
// implementation, with the same ranks and expression; decoding gives the
// text back.
func TestHFTokenizerMatchesTiktoken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two 50k-token files")
	}
	ranks := r50k(t)
	specials := map[string]int{"<|endoftext|>": 50256}
	for _, c := range []struct {
		name    string
		pre     any
		ignore  bool
		pattern string
	}{
		{"gpt2", map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, false,
			`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`},
		{"llama3-style", map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}}, true, llama3Pattern},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokenizerJSONFromRanks(t, ranks, c.pre, c.ignore), 0o644); err != nil {
				t.Fatal(err)
			}
			tok, err := LoadHF(dir)
			if err != nil {
				t.Fatal(err)
			}
			bpe, err := tiktoken.NewCoreBPE(ranks, specials, c.pattern)
			if err != nil {
				t.Fatal(err)
			}
			ref := tiktoken.NewTiktoken(bpe, &tiktoken.Encoding{Name: c.name, PatStr: c.pattern, MergeableRanks: ranks, SpecialTokens: specials}, map[string]any{"<|endoftext|>": true})
			if tok.VocabSize() != 50257 || tok.Specials().EOT != 50256 {
				t.Fatalf("vocab %d, specials %+v: want 50257 and <|endoftext|> = 50256", tok.VocabSize(), tok.Specials())
			}
			corpus := hfCorpus(t)
			if b, err := os.ReadFile("../../README.md"); err == nil {
				corpus = append(corpus, string(b))
			}
			for _, text := range corpus {
				got := tok.Encode(text)
				want := ref.Encode(text, []string{"all"}, nil)
				if len(got) == 0 && len(want) == 0 {
					continue
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%.40q: ids %v, tiktoken %v", text, head(got), head(want))
				}
				if back := tok.Decode(got); back != text {
					t.Errorf("%.40q decodes to %.40q", text, back)
				}
			}
		})
	}
}

func head(ids []int) []int { return ids[:min(len(ids), 24)] }

// The tiny fixture's file, its ids derived by hand.
func TestHFTokenizerByHand(t *testing.T) {
	tok, err := LoadHF(filepath.Join(tinyHF, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	// "hello": h+e, l+l, he+ll, then o; " world" starts with Ġw; the
	// trailing space is its own piece; each digit is one.
	text := "hello<|eot|> world 123"
	want := []int{258, 'o', 260, 259, 'o', 'r', 'l', 'd', ' ', '1', '2', '3'}
	if got := tok.Encode(text); !reflect.DeepEqual(got, want) {
		t.Errorf("Encode(%q) = %v, want %v", text, got, want)
	}
	if got := tok.Decode(want); got != text {
		t.Errorf("Decode = %q, want %q", got, text)
	}
	// e + U+0301 is é after NFC: its two UTF-8 bytes.
	if got := tok.Encode("e\u0301"); !reflect.DeepEqual(got, []int{0xC3, 0xA9}) {
		t.Errorf("Encode(e + combining acute) = %v, want [195 169] (NFC é)", got)
	}
	if s := tok.Specials(); s.EOT != 260 || s.Pad != 261 {
		t.Errorf("specials %+v: want eos 260, pad 261 from tokenizer_config.json", s)
	}
}

// What the tokenizer cannot read is refused with what to use instead.
func TestHFTokenizerRefuses(t *testing.T) {
	vocab := map[string]any{}
	for b, r := range byteRunes {
		vocab[string(r)] = b
	}
	byteLevel := map[string]any{"type": "ByteLevel"}
	for _, c := range []struct {
		name string
		file map[string]any
		want string
	}{
		{"wordpiece", map[string]any{"model": map[string]any{"type": "WordPiece", "vocab": vocab}}, "only BPE"},
		{"byte fallback without byte tokens", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab, "byte_fallback": true}, "pre_tokenizer": map[string]any{"type": "Metaspace"}},
			"needs byte_fallback with the 256 tokens <0x00>..<0xFF>, or an unk_token"},
		{"no byte level", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab}}, "needs byte_fallback"},
		{"unk not in vocab", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab, "unk_token": "<unk>"}}, `unk_token "<unk>" is not in the vocabulary`},
		{"no decoder", map[string]any{"model": map[string]any{"type": "BPE", "vocab": map[string]any{"<unk>": 0}, "unk_token": "<unk>"}}, "no decoder"},
		{"byte-level decoder", map[string]any{"model": map[string]any{"type": "BPE", "vocab": map[string]any{"<unk>": 0}, "unk_token": "<unk>"}, "decoder": byteLevel}, `decoder "ByteLevel" is not supported without ByteLevel`},
		{"metaspace and more", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab}, "pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Digits"}, map[string]any{"type": "Metaspace"}}}},
			"Metaspace with other pre-tokenizers"},
		{"unknown merge", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"a zz"}}, "pre_tokenizer": byteLevel}, `merge 0 ("a" "zz")`},
		{"missing byte", map[string]any{"model": map[string]any{"type": "BPE", "vocab": map[string]any{"a": 0}}, "pre_tokenizer": byteLevel}, "not a byte-level vocabulary"},
		{"replace normalizer", map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab}, "pre_tokenizer": byteLevel, "normalizer": map[string]any{"type": "Replace"}}, `normalizer "Replace"`},
	} {
		b, _ := json.Marshal(c.file)
		if _, err := parseHFTokenizer(b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.want)
		}
	}
	if _, err := LoadHF(filepath.Join(t.TempDir(), "nothing")); err == nil {
		t.Error("a missing file loads")
	}
}

// Added tokens match as the tokenizers library matches them: lstrip and
// rstrip take the white space beside them, single_word only a whole word;
// a non-special added token decodes as written too.
func TestHFTokenizerAddedTokenFlags(t *testing.T) {
	vocab := map[string]any{}
	for b, r := range byteRunes {
		vocab[string(r)] = b
	}
	file := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 256, "content": "<mask>", "special": true, "lstrip": true},
			{"id": 257, "content": "<sep>", "special": true, "rstrip": true},
			{"id": 258, "content": "cat", "special": false, "single_word": true},
			{"id": 259, "content": "<|eot|>", "special": true},
		},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "use_regex": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	}
	b, _ := json.Marshal(file)
	tok, err := parseHFTokenizer(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text string
		want []int
	}{
		{"hi <mask>", []int{'h', 'i', 256}},    // the space before <mask> is its
		{"a<sep>  b", []int{'a', 257, 'b'}},    // the spaces after <sep> are its
		{"a cat", []int{'a', ' ', 258}},        // a word of its own
		{"concatenate", tokIDs("concatenate")}, // inside a word: text
		{"x<|eot|>y", []int{'x', 259, 'y'}},    // neither
	} {
		if got := tok.Encode(c.text); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if got := tok.Decode([]int{'a', ' ', 258}); got != "a cat" {
		t.Errorf("Decode = %q, want %q", got, "a cat")
	}
	if s, err := tok.readSpecials(filepath.Join(t.TempDir(), "tokenizer_config.json")); err != nil || s.EOT != 259 {
		t.Errorf("end of text %d, want the last special token 259 (not the non-special 258)", s.EOT)
	}
}

// tokIDs are the ids of a text of one-byte tokens (byte b has id b).
func tokIDs(s string) []int {
	ids := make([]int, len(s))
	for i := range len(s) {
		ids[i] = int(s[i])
	}
	return ids
}

// A step after ByteLevel would see its characters, which this tokenizer
// maps last: refused.
func TestHFTokenizerRefusesStepAfterByteLevel(t *testing.T) {
	vocab := map[string]any{}
	for b, r := range byteRunes {
		vocab[string(r)] = b
	}
	file := map[string]any{
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "ByteLevel", "use_regex": false},
			map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated"}}},
		"model": map[string]any{"type": "BPE", "vocab": vocab},
	}
	b, _ := json.Marshal(file)
	if _, err := parseHFTokenizer(b); err == nil || !strings.Contains(err.Error(), "after ByteLevel") {
		t.Errorf("Split after ByteLevel: %v", err)
	}
}

// tokenizer.json's post-processor puts its special tokens around a
// sequence: EncodeSequence puts Llama 3's <|begin_of_text|> (its
// TemplateProcessing) before the text, and a Llama 2 file's bos_token when
// its tokenizer_config.json sets add_bos_token; Encode stays without. The
// run's sequences (a training document, a prompt) are train's
// TestPostProcessorBeginsEachSequence.
func TestHFTokenizerPostProcessor(t *testing.T) {
	tok, err := LoadHF(templateHF)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode("hello"); !reflect.DeepEqual(got, []int{258, 'o'}) {
		t.Errorf("Encode(hello) = %v: the post-processor adds nothing to Encode", got)
	}
	if got, _ := EncodeSequence(tok, "hello"); !reflect.DeepEqual(got, []int{262, 258, 'o'}) {
		t.Errorf("EncodeSequence(hello) = %v, want [262 258 111]", got)
	}

	// Llama 2's older files: no post-processor, tokenizer_config.json's
	// add_bos_token and bos_token instead.
	old := t.TempDir()
	if err := os.CopyFS(old, os.DirFS(tinyHF)); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(old, "tokenizer_config.json"), []byte(`{"eos_token": "<|eot|>", "bos_token": "<pad>", "add_bos_token": true}`), 0o644)
	if tok, err = LoadHF(old); err != nil {
		t.Fatal(err)
	}
	if got, _ := EncodeSequence(tok, "he"); !reflect.DeepEqual(got, []int{261, 256}) {
		t.Errorf("add_bos_token: %v, want [261 256]", got)
	}
	if tok, err = LoadHF(tinyHF); err != nil { // no add_bos_token: nothing added
		t.Fatal(err)
	}
	if got, _ := EncodeSequence(tok, "he"); !reflect.DeepEqual(got, []int{256}) {
		t.Errorf("without add_bos_token: %v, want [256]", got)
	}
}

// A post-processor the tokenizer cannot apply is refused in one line.
func TestHFTokenizerPostProcessorRefused(t *testing.T) {
	vocab := map[string]any{}
	for b, r := range byteRunes {
		vocab[string(r)] = b
	}
	seqA := map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}
	for _, c := range []struct {
		name string
		post map[string]any
		want string
	}{
		{"unknown type", map[string]any{"type": "Frobnicate"}, `post_processor "Frobnicate" is not supported`},
		{"missing special", map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, seqA}},
			`special token "<s>" of the single template is not in its special_tokens`},
		{"id outside", map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>"}}, seqA},
			"special_tokens": map[string]any{"<s>": map[string]any{"ids": []int{9999}}}}, "outside the vocabulary"},
		{"no sequence", map[string]any{"type": "TemplateProcessing", "single": []any{}}, "no sequence $A"},
	} {
		b, _ := json.Marshal(map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab}, "pre_tokenizer": map[string]any{"type": "ByteLevel"}, "post_processor": c.post})
		if _, err := parseHFTokenizer(b); err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line saying %q", c.name, err, c.want)
		}
	}
}

// A template that also ends each sequence with end-of-text (<s> $A </s>):
// EncodeSequence puts both around the text. How documents are joined and a
// prompt is cut is train's TestTemplateEndingWithEOTJoinsOnce.
func TestHFTokenizerTemplateEndsWithEOT(t *testing.T) {
	tok, err := LoadHF(templateEOTHF)
	if err != nil {
		t.Fatal(err)
	}
	eot := tok.Specials().EOT
	if got, _ := EncodeSequence(tok, "hello"); !reflect.DeepEqual(got, []int{262, 258, 'o', eot}) {
		t.Fatalf("EncodeSequence(hello) = %v, want [262 258 111 %d]", got, eot)
	}
}

// FuzzParseHFTokenizer: no tokenizer.json, however broken, panics the
// parser, and a tokenizer it accepts encodes and decodes a text without
// panicking (a pattern that backtracks without bound fails the encoding).
func FuzzParseHFTokenizer(f *testing.F) {
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel","use_regex":true}}`), "ab ab")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a+)+$"},"behavior":"Isolated"}}`), "aaaab")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"▁a":0,"<unk>":1},"merges":[],"unk_token":"<unk>"},"pre_tokenizer":{"type":"Metaspace","replacement":"▁"}}`), "a a")
	f.Add([]byte(`{"added_tokens":[{"id":9,"content":"<|x|>","special":true}],"model":{"type":"BPE","vocab":{},"merges":[]}}`), "<|x|>")
	f.Add([]byte(`{}`), "")
	f.Fuzz(func(t *testing.T, b []byte, text string) {
		tok, err := parseHFTokenizer(b)
		if err != nil {
			return
		}
		if len(text) > 256 {
			text = text[:256]
		}
		ids, err := tok.EncodeChecked(text, true)
		if err != nil {
			return
		}
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() && id >= len(tok.tokens) {
				t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
			}
		}
		tok.Decode(ids)
	})
}

// A timeout regexp2 reports at once (its starved clock jumped) is retried;
// one that keeps coming, or another error, is returned.
func TestMatchRetriesSpuriousTimeouts(t *testing.T) {
	spurious := errors.New("match timeout after 5s on input `x`")
	calls := 0
	m, err := match(func() (*regexp2.Match, error) {
		calls++
		if calls == 1 {
			return nil, spurious
		}
		return nil, nil
	})
	if err != nil || m != nil || calls != 2 {
		t.Errorf("a spurious timeout: %v after %d calls, want a retry that succeeds", err, calls)
	}
	calls = 0
	if _, err := match(func() (*regexp2.Match, error) { calls++; return nil, spurious }); err != spurious || calls != 4 {
		t.Errorf("timeouts every time: %v after %d calls, want the timeout after 4", err, calls)
	}
	other := errors.New("some other failure")
	calls = 0
	if _, err := match(func() (*regexp2.Match, error) { calls++; return nil, other }); err != other || calls != 1 {
		t.Errorf("another error: %v after %d calls, want it at once", err, calls)
	}
}
