// Package tokenizer turns text into token ids and back: the byte tokenizer
// of tiny runs, GPT-2's BPE (offline), BERT's WordPiece and a Hugging Face
// tokenizer.json's BPE (GPT-2's, Llama 3's, SentencePiece's). New makes the
// one a run's config names; HFFiles writes it for a Hugging Face export.
package tokenizer

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/hpcrun/hpcrun/train/config"
	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// Tokenizer turns text into token ids and back. Every rank builds the same
// tokenizer from the same config and data, so ids agree across the job.
type Tokenizer interface {
	// Name is the tokenizer's kind: "byte", "gpt2", "wordpiece" or "hf".
	Name() string
	// Encode returns the ids of text, without special tokens.
	Encode(text string) []int
	// Decode returns the text of ids (special tokens included as text).
	Decode(ids []int) string
	// VocabSize is the number of ids, before padding for tensor parallelism.
	VocabSize() int
	// Specials are the ids of the padding, classification and end tokens.
	Specials() Specials
}

// Sequencer is a Tokenizer that puts special tokens around a sequence
// (a Hugging Face tokenizer.json's post-processor: Llama's begin-of-text).
type Sequencer interface {
	// EncodeSequence returns the ids of text as one sequence of the
	// model's input, its special tokens included.
	EncodeSequence(text string) []int
}

// Checked is a Tokenizer whose encoding can fail on its input: a
// tokenizer.json pattern that does not finish on a text (HF).
type Checked interface {
	// EncodeChecked is Encode, or EncodeSequence when seq is set, with the
	// error that cut it short.
	EncodeChecked(text string, seq bool) ([]int, error)
}

// EncodeSequence is the ids of text as one sequence of the model's input
// (a training document, an evaluation text, a prompt): tok's
// EncodeSequence when it is a Sequencer, else Encode; an error when tok
// could not encode text.
func EncodeSequence(tok Tokenizer, text string) ([]int, error) {
	if c, ok := tok.(Checked); ok {
		return c.EncodeChecked(text, true)
	}
	if s, ok := tok.(Sequencer); ok {
		return s.EncodeSequence(text), nil
	}
	return tok.Encode(text), nil
}

// EncodeText is tok's Encode of text, with an error when tok could not
// encode it (Checked).
func EncodeText(tok Tokenizer, text string) ([]int, error) {
	if c, ok := tok.(Checked); ok {
		return c.EncodeChecked(text, false)
	}
	return tok.Encode(text), nil
}

// New makes the tokenizer a run of cfg uses, the one switch from a
// tokenizer's name to its ids; a WordPiece vocabulary without a vocab file
// is built from texts (BuildWordPieceVocab, WordPieceVocabSize ids at most).
func New(cfg config.Config, texts []string) (Tokenizer, error) {
	name := cfg.TokenizerName()
	switch name {
	case "byte":
		return Byte{}, nil
	case "gpt2":
		return NewGPT2()
	case "wordpiece":
		if cfg.VocabFile != "" {
			return LoadWordPiece(cfg.VocabFile)
		}
		return NewWordPiece(BuildWordPieceVocab(texts, WordPieceVocabSize(cfg)))
	case "hf":
		return LoadHF(cfg.VocabFile)
	}
	return nil, fmt.Errorf("tokenizer %q: use byte, gpt2, wordpiece or hf", name)
}

// defaultWordPieceVocab is the size of a WordPiece vocabulary built from the
// training texts when the config sets no vocab.
const defaultWordPieceVocab = 8192

// WordPieceVocabSize is the size of the WordPiece vocabulary New builds
// from the training texts when cfg gives no vocab file: cfg's vocab, else
// 8192.
func WordPieceVocabSize(cfg config.Config) int {
	return cmp.Or(cfg.Vocab, defaultWordPieceVocab)
}

// Specials are the ids a model needs besides the text's own.
type Specials struct {
	Pad int // fills a classifier's sequence after its text
	CLS int // starts a classifier's sequence
	EOT int // separates documents in a language-model stream
}

// Byte maps each byte of UTF-8 text to its own id (vocabulary 256).
// Bytes 0, 1 and 2 never occur in text (they are read as spaces) and serve as
// the padding, CLS and end-of-text tokens. It needs no files: the tokenizer
// of tiny runs.
type Byte struct{}

// Name implements Tokenizer.
func (Byte) Name() string { return "byte" }

// Encode implements Tokenizer.
func (Byte) Encode(text string) []int {
	ids := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		b := int(text[i])
		if b < 3 {
			b = ' '
		}
		ids[i] = b
	}
	return ids
}

// Decode implements Tokenizer.
func (Byte) Decode(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		b = append(b, byte(id))
	}
	return string(b)
}

// VocabSize implements Tokenizer.
func (Byte) VocabSize() int { return 256 }

// Specials implements Tokenizer.
func (Byte) Specials() Specials { return Specials{Pad: 0, CLS: 1, EOT: 2} }

// GPT2 is GPT-2's byte-level BPE (r50k_base, 50257 ids), loaded
// from ranks embedded in the binary: it works offline.
type GPT2 struct {
	enc *tiktoken.Tiktoken
}

var (
	gpt2Once sync.Once
	gpt2Enc  *tiktoken.Tiktoken
	gpt2Err  error
)

// NewGPT2 returns the GPT-2 tokenizer.
func NewGPT2() (*GPT2, error) {
	gpt2Once.Do(func() {
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		gpt2Enc, gpt2Err = tiktoken.GetEncoding("r50k_base")
	})
	if gpt2Err != nil {
		return nil, fmt.Errorf("gpt2 tokenizer: %w", gpt2Err)
	}
	return &GPT2{enc: gpt2Enc}, nil
}

// Name implements Tokenizer.
func (*GPT2) Name() string { return "gpt2" }

// Encode implements Tokenizer. "<|endoftext|>" in text is encoded as text,
// not as the special token.
func (t *GPT2) Encode(text string) []int { return t.enc.Encode(text, nil, nil) }

// Decode implements Tokenizer.
func (t *GPT2) Decode(ids []int) string { return t.enc.Decode(ids) }

// VocabSize implements Tokenizer.
func (*GPT2) VocabSize() int { return GPT2Vocab }

// GPT2Vocab is the size of GPT-2's BPE vocabulary.
const GPT2Vocab = 50257

// Specials implements Tokenizer: GPT-2 has one special token, <|endoftext|>.
func (*GPT2) Specials() Specials { return Specials{Pad: 50256, CLS: 50256, EOT: 50256} }

// WordPiece is BERT's tokenizer: its basic tokenizer (white space,
// punctuation and CJK ideographs split, lower-casing and accent stripping as
// the vocabulary was made), then greedy longest-match-first word pieces ("##"
// marks a piece that continues a word). Its vocabulary comes from a BERT
// vocab.txt (one token a line, with the tokenizer_config.json beside it) or
// is built from the training texts by BuildWordPieceVocab.
type WordPiece struct {
	vocab    []string
	ids      map[string]int
	specials Specials
	unk      int
	basic    basicTokenizer
}

// The special tokens a WordPiece vocabulary must hold.
const (
	wpPad = "[PAD]"
	wpUNK = "[UNK]"
	wpCLS = "[CLS]"
	wpSEP = "[SEP]"
)

// maxWordChars is the longest word WordPiece splits; longer words are [UNK],
// as in BERT.
const maxWordChars = 100

// NewWordPiece makes a WordPiece tokenizer over an uncased vocab (id =
// index): texts are lower-cased and their accents stripped.
func NewWordPiece(vocab []string) (*WordPiece, error) {
	t := &WordPiece{vocab: vocab, ids: make(map[string]int, len(vocab)), basic: uncased}
	for i, w := range vocab {
		if _, dup := t.ids[w]; !dup {
			t.ids[w] = i
		}
	}
	var missing []string
	get := func(w string) int {
		id, ok := t.ids[w]
		if !ok {
			missing = append(missing, w)
		}
		return id
	}
	t.specials = Specials{Pad: get(wpPad), CLS: get(wpCLS), EOT: get(wpSEP)}
	t.unk = get(wpUNK)
	if len(missing) > 0 {
		return nil, fmt.Errorf("wordpiece vocab lacks %s: use a BERT vocab.txt", strings.Join(missing, ", "))
	}
	return t, nil
}

// LoadWordPiece reads a BERT vocab.txt (one token a line, id = line number)
// and, when there is one beside it, the tokenizer_config.json that says how
// texts are cased: do_lower_case (default true), strip_accents (default: as
// do_lower_case) and tokenize_chinese_chars (default true), as BERT's
// tokenizer reads them.
func LoadWordPiece(path string) (*WordPiece, error) {
	basic, err := readBasicTokenizer(filepath.Join(filepath.Dir(path), "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("wordpiece vocab %s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("wordpiece vocab: %w", err)
	}
	defer f.Close()
	vocab, err := readWordPieceVocab(f, path)
	if err != nil {
		return nil, err
	}
	t, err := NewWordPiece(vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t.basic = basic
	return t, nil
}

// maxVocabLines is config.MaxVocab, lowered by tests.
var maxVocabLines = config.MaxVocab

// readWordPieceVocab reads a vocab.txt's tokens, one a line, and stops at
// the first line past maxVocabLines: a file of 20M lines is refused after
// one line more than the limit, not held whole and checked after.
func readWordPieceVocab(r io.Reader, path string) ([]string, error) {
	var vocab []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if len(vocab) == maxVocabLines {
			return nil, fmt.Errorf("wordpiece vocab %s: more than %d lines, the most ids hpcrun's vocabulary holds: give a BERT vocab.txt (one token a line)", path, maxVocabLines)
		}
		vocab = append(vocab, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("wordpiece vocab %s: line %d is longer than %d bytes: not a vocab.txt (one token a line)", path, len(vocab)+1, bufio.MaxScanTokenSize)
		}
		return nil, fmt.Errorf("wordpiece vocab %s: %w", path, err)
	}
	return vocab, nil
}

// BuildWordPieceVocab builds an uncased vocabulary of at most size tokens
// from texts: the special tokens, every character seen (alone and as a "##" piece), then
// whole words by falling frequency (ties in byte order), each seen at least
// twice. It is deterministic, so every rank builds the same one.
func BuildWordPieceVocab(texts []string, size int) []string {
	counts := map[string]int{}
	chars := map[string]bool{}
	for _, text := range texts {
		for _, w := range uncased.tokens(text) {
			counts[w]++
			for _, r := range w {
				chars[string(r)] = true
			}
		}
	}
	vocab := []string{wpPad, wpUNK, wpCLS, wpSEP, "[MASK]"}
	cs := make([]string, 0, len(chars))
	for c := range chars {
		cs = append(cs, c)
	}
	sort.Strings(cs)
	vocab = append(vocab, cs...)
	for _, c := range cs {
		vocab = append(vocab, "##"+c)
	}
	words := make([]string, 0, len(counts))
	for w, n := range counts {
		if n >= 2 && len([]rune(w)) > 1 {
			words = append(words, w)
		}
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	for _, w := range words {
		if len(vocab) >= size {
			break
		}
		vocab = append(vocab, w)
	}
	return vocab
}

// Name implements Tokenizer.
func (*WordPiece) Name() string { return "wordpiece" }

// Vocab is the vocabulary, id = index.
func (t *WordPiece) Vocab() []string { return t.vocab }

// Encode implements Tokenizer.
func (t *WordPiece) Encode(text string) []int {
	var ids []int
	for _, w := range t.basic.tokens(text) {
		ids = t.appendWord(ids, w)
	}
	return ids
}

// appendWord appends the pieces of one word, or [UNK] when it cannot be
// split into vocabulary pieces.
func (t *WordPiece) appendWord(ids []int, w string) []int {
	rs := []rune(w)
	if len(rs) > maxWordChars {
		return append(ids, t.unk)
	}
	n := len(ids)
	for start := 0; start < len(rs); {
		end, id := len(rs), -1
		for ; end > start; end-- {
			piece := string(rs[start:end])
			if start > 0 {
				piece = "##" + piece
			}
			if v, ok := t.ids[piece]; ok {
				id = v
				break
			}
		}
		if id < 0 {
			return append(ids[:n], t.unk)
		}
		ids = append(ids, id)
		start = end
	}
	return ids
}

// Decode implements Tokenizer: pieces are joined with spaces, "##" pieces to
// the word before them.
func (t *WordPiece) Decode(ids []int) string {
	var sb strings.Builder
	for i, id := range ids {
		tok := wpUNK
		if id >= 0 && id < len(t.vocab) {
			tok = t.vocab[id]
		}
		if rest, ok := strings.CutPrefix(tok, "##"); ok {
			sb.WriteString(rest)
			continue
		}
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(tok)
	}
	return sb.String()
}

// VocabSize implements Tokenizer.
func (t *WordPiece) VocabSize() int { return len(t.vocab) }

// Specials implements Tokenizer.
func (t *WordPiece) Specials() Specials { return t.specials }
