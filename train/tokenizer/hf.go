package tokenizer

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"github.com/hpcrun/hpcrun/train/config"
	"golang.org/x/text/unicode/norm"
)

// HF is a Hugging Face BPE tokenizer read from its tokenizer.json:
// byte-level (GPT-2, Llama 3, SmolLM, Mistral-Nemo and most decoders
// trained since) or SentencePiece-style (Llama 2, Mistral 7B: hf_sp.go).
// The added tokens, the normalizer, the pre-tokenizers and the BPE merges
// the file names, applied as the tokenizers library applies them. Encode
// gives the ids of tokenizer(text, add_special_tokens=False): added tokens
// written in the text are recognised.
type HF struct {
	path    string
	vocab   map[string]int // the model's tokens in byte-level form
	tokens  []string       // id -> text of an added token, or byte-level form
	added   map[int]bool   // ids of added tokens (true: special): decoded as written
	merges  map[[2]int]merge
	addedRE *regexp2.Regexp // the added tokens, longest first, a group each; nil: none
	addedAt []int           // the id of addedRE's group i+1
	normal  []func(string) string
	pre     []preStep
	// byteLevel: the pre-tokenizer maps bytes to byte-level characters
	// (and the decoder maps them back).
	byteLevel    bool
	ignoreMerges bool
	specials     Specials
	// before and after are the ids the post-processor puts around a
	// sequence (EncodeSequence): Llama 3's <|begin_of_text|> before.
	before, after []int
	// Without byteLevel, a SentencePiece-style BPE (hf_sp.go):
	// the Metaspace pre-tokenizer (nil: none), characters the vocabulary
	// lacks as their <0xHH> byte tokens (byteFallback) or unk (fused when
	// fuseUnk), and the decoder's chain.
	meta         *metaspace
	byteFallback bool
	byteTok      [256]int // the id of each byte's <0xHH> token, -1 for none
	unk          int
	fuseUnk      bool
	decode       []decodeStep
}

// merge is what joining a pair of ids gives, and its priority.
type merge struct{ rank, id int }

// preStep splits each piece of text into smaller ones; it fails when a
// pattern does not finish on the piece (matchTimeout).
type preStep func(piece string) ([]string, error)

// matchTimeout bounds one regular-expression match of a tokenizer.json
// pattern: a pattern that backtracks catastrophically ((a+)+$ on a long run
// of a's) fails the encoding instead of spinning forever. Legitimate
// pre-tokenizer patterns match a piece in microseconds; the budget is
// large because it is wall-clock time, which a loaded machine stretches.
const matchTimeout = 5 * time.Second

// match runs one step of a match (find), and again when regexp2 reports a
// timeout that fired before half of matchTimeout had passed: its shared
// clock, a goroutine that a loaded machine can starve, may jump past the
// deadline of a match that has just started (a known regexp2 race). A
// genuine runaway still fails, after the budget.
func match(find func() (*regexp2.Match, error)) (*regexp2.Match, error) {
	for tries := 0; ; tries++ {
		start := time.Now()
		m, err := find()
		if err == nil || tries == 3 || time.Since(start) >= matchTimeout/2 || !strings.Contains(err.Error(), "match timeout") {
			return m, err
		}
	}
}

// compilePattern compiles a tokenizer.json pattern with matchTimeout.
func compilePattern(expr string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, err
	}
	re.MatchTimeout = matchTimeout
	return re, nil
}

// mustCompilePattern is compilePattern of a pattern of hpcrun's own.
func mustCompilePattern(expr string) *regexp2.Regexp {
	re, err := compilePattern(expr)
	if err != nil {
		panic(err)
	}
	return re
}

// matchError says which pattern failed to finish where in the text.
func matchError(what string, re *regexp2.Regexp, at int, err error) error {
	return fmt.Errorf("tokenizer: %s %q did not finish on the text at character %d (a pattern that backtracks without bound; fix tokenizer.json): %w", what, re.String(), at, err)
}

// hfFile is the part of tokenizer.json the tokenizer reads.
type hfFile struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		SingleWord bool   `json:"single_word"`
		Normalized bool   `json:"normalized"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         struct {
		Type         string            `json:"type"`
		Vocab        map[string]int    `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
		ByteFallback bool              `json:"byte_fallback"`
		IgnoreMerges bool              `json:"ignore_merges"`
		UnkToken     *string           `json:"unk_token"`
		FuseUnk      bool              `json:"fuse_unk"`
		Prefix       *string           `json:"continuing_subword_prefix"`
		Suffix       *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

// hfComponent is a normalizer or pre-tokenizer of tokenizer.json.
type hfComponent struct {
	Type           string            `json:"type"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Individual     bool              `json:"individual_digits"`
	Behavior       string            `json:"behavior"`
	Prepend        string            `json:"prepend"`
	Content        string            `json:"content"`
	Invert         bool              `json:"invert"`
	Pattern        struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
}

// gpt2Pattern is GPT-2's pre-tokenizer expression, the ByteLevel
// pre-tokenizer's when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// LoadHF reads a tokenizer.json, or the one in directory path, and the
// special tokens its tokenizer_config.json names (eos_token, pad_token)
// when there is one beside it.
func LoadHF(path string) (*HF, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "tokenizer.json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseHFTokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	t.path = path
	t.specials, err = t.readSpecials(filepath.Join(filepath.Dir(path), "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", path, err)
	}
	return t, nil
}

// hfPostProcessor is the part of tokenizer.json's post_processor read:
// TemplateProcessing's single template and special tokens,
// BertProcessing's and RobertaProcessing's cls and sep, a Sequence's
// processors.
type hfPostProcessor struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int `json:"ids"`
	} `json:"special_tokens"`
	CLS []json.RawMessage `json:"cls"` // [token, id]
	SEP []json.RawMessage `json:"sep"`
}

// addPostProcessor reads the special tokens the post-processor puts
// around one sequence (what tokenizer(text) adds with
// add_special_tokens=True): TemplateProcessing's single template, the
// [CLS] and [SEP] of BertProcessing and RobertaProcessing; ByteLevel's
// adds none, a Sequence's are its processors' in turn.
func (t *HF) addPostProcessor(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var c hfPostProcessor
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("post_processor: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		for _, r := range c.Processors {
			if err := t.addPostProcessor(r); err != nil {
				return err
			}
		}
		return nil
	case "BertProcessing", "RobertaProcessing":
		cls, err1 := t.processorToken(c.CLS)
		sep, err2 := t.processorToken(c.SEP)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("post_processor %s: %w", c.Type, err)
		}
		t.before, t.after = append(t.before, cls), append([]int{sep}, t.after...)
		return nil
	case "TemplateProcessing":
		var before, after []int
		seen := false
		for _, item := range c.Single {
			switch {
			case item.Sequence != nil && item.Sequence.ID == "A" && !seen:
				seen = true
			case item.SpecialToken != nil:
				st, ok := c.SpecialTokens[item.SpecialToken.ID]
				if !ok || len(st.IDs) == 0 {
					return fmt.Errorf("post_processor TemplateProcessing: special token %q of the single template is not in its special_tokens", item.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || id >= len(t.tokens) {
						return fmt.Errorf("post_processor TemplateProcessing: special token %q has id %d, outside the vocabulary", item.SpecialToken.ID, id)
					}
				}
				if seen {
					after = append(after, st.IDs...)
				} else {
					before = append(before, st.IDs...)
				}
			default:
				return errors.New("post_processor TemplateProcessing: the single template wants special tokens around one sequence $A")
			}
		}
		if !seen {
			return errors.New("post_processor TemplateProcessing: the single template has no sequence $A")
		}
		t.before, t.after = append(t.before, before...), append(after, t.after...)
		return nil
	}
	return fmt.Errorf("post_processor %q is not supported (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel or a Sequence of them)", c.Type)
}

// processorToken reads a [token, id] pair of BertProcessing's cls or sep.
func (t *HF) processorToken(pair []json.RawMessage) (int, error) {
	var id int
	if len(pair) != 2 || json.Unmarshal(pair[1], &id) != nil || id < 0 || id >= len(t.tokens) {
		return 0, fmt.Errorf("want a [token, id] pair with an id in the vocabulary, got %d values", len(pair))
	}
	return id, nil
}

// EncodeSequence implements Sequencer: the ids of text with the special
// tokens the post-processor puts around a sequence (tokenizer(text) with
// add_special_tokens=True): Llama 3's <|begin_of_text|> before it, or
// Llama 2's <s> from tokenizer_config.json's add_bos_token. A text a
// pattern does not finish on gets the ids before it (EncodeChecked says why).
func (t *HF) EncodeSequence(text string) []int {
	ids, _ := t.EncodeChecked(text, true)
	return ids
}

// EncodeChecked implements Checked: Encode, or EncodeSequence when seq is
// set, failing when a tokenizer.json pattern does not finish on text.
func (t *HF) EncodeChecked(text string, seq bool) ([]int, error) {
	var ids []int
	if seq {
		ids = append(ids, t.before...)
	}
	ids, err := t.encode(ids, text)
	if err != nil {
		return ids, err
	}
	if seq {
		ids = append(ids, t.after...)
	}
	return ids, nil
}

func parseHFTokenizer(b []byte) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	m := f.Model
	switch {
	case m.Type != "BPE" && m.Type != "":
		return nil, fmt.Errorf("model type %q: only BPE tokenizers are supported (WordPiece vocabularies load as vocab.txt)", m.Type)
	case len(m.Vocab) == 0:
		return nil, errors.New("model.vocab is empty")
	case m.Prefix != nil && *m.Prefix != "" || m.Suffix != nil && *m.Suffix != "":
		return nil, errors.New("continuing_subword_prefix / end_of_word_suffix are not supported")
	}
	t := &HF{vocab: m.Vocab, added: map[int]bool{}, merges: make(map[[2]int]merge, len(m.Merges)), ignoreMerges: m.IgnoreMerges,
		byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, unk: -1}
	size := 0
	for tok, id := range m.Vocab {
		if id < 0 || id >= config.MaxVocab {
			return nil, fmt.Errorf("token %q has id %d: want 0..%d", tok, id, config.MaxVocab-1)
		}
		size = max(size, id+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= config.MaxVocab || a.Content == "" {
			return nil, fmt.Errorf("added token %q with id %d: want a text and an id 0..%d", a.Content, a.ID, config.MaxVocab-1)
		}
		size = max(size, a.ID+1)
	}
	t.tokens = make([]string, size)
	for tok, id := range m.Vocab {
		t.tokens[id] = tok
	}
	added := f.AddedTokens
	sort.SliceStable(added, func(i, j int) bool { return len(added[i].Content) > len(added[j].Content) })
	var alts []string
	for _, a := range added {
		if a.Normalized && !a.Special && len(f.Normalizer) > 0 && string(f.Normalizer) != "null" {
			return nil, fmt.Errorf("added token %q is matched after normalization (normalized, not special): not supported", a.Content)
		}
		t.tokens[a.ID], t.added[a.ID] = a.Content, a.Special
		// As the tokenizers library matches them: lstrip and rstrip take the
		// white space beside the token into its match, single_word wants no
		// word character beside it.
		alt := regexp2.Escape(a.Content)
		if a.SingleWord {
			alt = `(?<!\w)` + alt + `(?!\w)`
		}
		if a.LStrip {
			alt = `\s*` + alt
		}
		if a.RStrip {
			alt += `\s*`
		}
		alts = append(alts, "("+alt+")")
		t.addedAt = append(t.addedAt, a.ID)
	}
	if len(alts) > 0 {
		t.addedRE = mustCompilePattern(strings.Join(alts, "|"))
	}
	for i, raw := range m.Merges {
		a, b, err := mergePair(raw)
		if err != nil {
			return nil, fmt.Errorf("merge %d: %w", i, err)
		}
		ia, oka := m.Vocab[a]
		ib, okb := m.Vocab[b]
		id, ok := m.Vocab[a+b]
		if !oka || !okb || !ok {
			return nil, fmt.Errorf("merge %d (%q %q): a token is not in the vocabulary", i, a, b)
		}
		if _, dup := t.merges[[2]int{ia, ib}]; !dup {
			t.merges[[2]int{ia, ib}] = merge{rank: i, id: id}
		}
	}
	var err error
	if t.normal, err = normalizers(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.addPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.addPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if !t.byteLevel {
		return t, t.symbolModel(m.UnkToken, f.Decoder)
	}
	for b, r := range byteRunes {
		if _, ok := m.Vocab[string(r)]; !ok {
			return nil, fmt.Errorf("byte 0x%02x (%q) has no token: not a byte-level vocabulary", b, r)
		}
	}
	return t, nil
}

// mergePair reads a merge written "a b" (tokenizers before 0.20) or
// ["a", "b"].
func mergePair(raw json.RawMessage) (string, string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("%q is not two tokens", s)
		}
		return a, b, nil
	}
	var p []string
	if err := json.Unmarshal(raw, &p); err != nil || len(p) != 2 {
		return "", "", fmt.Errorf("%s is not a pair of tokens", raw)
	}
	return p[0], p[1], nil
}

// normalizers reads the normalizer: none, the Unicode normal forms,
// lowercasing, or a sequence of them.
func normalizers(raw json.RawMessage) ([]func(string) string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "Sequence":
		var out []func(string) string
		for _, r := range c.Normalizers {
			fs, err := normalizers(r)
			if err != nil {
				return nil, err
			}
			out = append(out, fs...)
		}
		return out, nil
	case "NFC":
		return []func(string) string{norm.NFC.String}, nil
	case "NFD":
		return []func(string) string{norm.NFD.String}, nil
	case "NFKC":
		return []func(string) string{norm.NFKC.String}, nil
	case "NFKD":
		return []func(string) string{norm.NFKD.String}, nil
	case "Lowercase":
		return []func(string) string{strings.ToLower}, nil
	case "Prepend":
		return []func(string) string{func(s string) string {
			if s == "" {
				return s
			}
			return c.Prepend + s
		}}, nil
	case "Replace":
		if c.Pattern.String == nil {
			return nil, errors.New(`normalizer "Replace" with a regex or no pattern is not supported (a String pattern)`)
		}
		from, to := *c.Pattern.String, c.Content
		return []func(string) string{func(s string) string { return strings.ReplaceAll(s, from, to) }}, nil
	}
	return nil, fmt.Errorf("normalizer %q is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace or a Sequence of them)", c.Type)
}

// addPreTokenizer appends the pre-tokenizer's steps.
func (t *HF) addPreTokenizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	if t.meta != nil && c.Type != "Sequence" || c.Type == "Metaspace" && (t.byteLevel || len(t.pre) > 0) {
		return errors.New("pre_tokenizer Metaspace with other pre-tokenizers is not supported: it must be the only one")
	}
	if t.byteLevel && c.Type != "Sequence" {
		// ByteLevel maps the bytes in place: the steps after it would see
		// its characters, where this tokenizer maps them last.
		return fmt.Errorf("pre_tokenizer %q after ByteLevel is not supported: ByteLevel must be the last step", c.Type)
	}
	switch c.Type {
	case "Sequence":
		for _, r := range c.Pretokenizers {
			if err := t.addPreTokenizer(r); err != nil {
				return err
			}
		}
		return nil
	case "ByteLevel":
		if c.AddPrefixSpace {
			t.pre = append(t.pre, func(p string) ([]string, error) {
				if !strings.HasPrefix(p, " ") {
					p = " " + p
				}
				return []string{p}, nil
			})
		}
		if c.UseRegex == nil || *c.UseRegex {
			t.pre = append(t.pre, splitStep(mustCompilePattern(gpt2Pattern), false))
		}
		t.byteLevel = true
		return nil
	case "Split":
		if c.Behavior != "Isolated" && c.Behavior != "Removed" {
			return fmt.Errorf("pre_tokenizer Split with behavior %q is not supported (Isolated or Removed)", c.Behavior)
		}
		if c.Invert {
			return errors.New("pre_tokenizer Split with invert is not supported")
		}
		var expr string
		switch {
		case c.Pattern.Regex != nil:
			expr = *c.Pattern.Regex
		case c.Pattern.String != nil:
			expr = regexp2.Escape(*c.Pattern.String)
		default:
			return errors.New("pre_tokenizer Split has no pattern")
		}
		re, err := compilePattern(expr)
		if err != nil {
			return fmt.Errorf("pre_tokenizer Split pattern %q: %w", expr, err)
		}
		t.pre = append(t.pre, splitStep(re, c.Behavior == "Removed"))
		return nil
	case "Metaspace":
		m, err := readMetaspace(raw)
		if err != nil {
			return fmt.Errorf("pre_tokenizer %w", err)
		}
		t.meta = m
		return nil
	case "Digits":
		expr := `\p{N}+` // Rust's char::is_numeric
		if c.Individual {
			expr = `\p{N}`
		}
		t.pre = append(t.pre, splitStep(mustCompilePattern(expr), false))
		return nil
	}
	return fmt.Errorf("pre_tokenizer %q is not supported (ByteLevel, Split, Digits, Metaspace or a Sequence of them)", c.Type)
}

// splitStep cuts a piece at re's matches: each match is a piece, and so is
// the text between two of them (dropped when removed is set).
func splitStep(re *regexp2.Regexp, removed bool) preStep {
	return func(p string) ([]string, error) {
		var out []string
		runes := []rune(p)
		last := 0
		m, err := match(func() (*regexp2.Match, error) { return re.FindRunesMatch(runes) })
		for m != nil {
			if m.Index > last {
				out = append(out, string(runes[last:m.Index]))
			}
			if !removed && m.Length > 0 {
				out = append(out, string(runes[m.Index:m.Index+m.Length]))
			}
			last = m.Index + m.Length
			prev := m
			m, err = match(func() (*regexp2.Match, error) { return re.FindNextMatch(prev) })
		}
		if err != nil {
			return nil, matchError("pre_tokenizer pattern", re, last, err)
		}
		if last < len(runes) {
			out = append(out, string(runes[last:]))
		}
		return out, nil
	}
}

// byteRunes is GPT-2's byte-level alphabet: each byte's character, the
// printable ones as themselves and the others from U+0100 on.
var byteRunes = func() [256]rune {
	var r [256]rune
	next := rune(256)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			r[b] = rune(b)
		} else {
			r[b] = next
			next++
		}
	}
	return r
}()

// runeBytes inverts byteRunes.
var runeBytes = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteRunes {
		m[r] = byte(b)
	}
	return m
}()

// ByteLevel is b written in GPT-2's byte-level alphabet (a printable
// character for each byte), as a byte-level tokenizer.json's vocabulary and
// merges write it.
func ByteLevel(b []byte) string {
	var s strings.Builder
	for _, c := range b {
		s.WriteRune(byteRunes[c])
	}
	return s.String()
}

// Name implements Tokenizer.
func (*HF) Name() string { return "hf" }

// Path is the tokenizer.json it was read from.
func (t *HF) Path() string { return t.path }

// VocabSize implements Tokenizer: the largest id plus one.
func (t *HF) VocabSize() int { return len(t.tokens) }

// Specials implements Tokenizer.
func (t *HF) Specials() Specials { return t.specials }

// Encode implements Tokenizer. A text a pattern does not finish on gets
// the ids before it (EncodeChecked says why).
func (t *HF) Encode(text string) []int {
	ids, _ := t.encode(nil, text)
	return ids
}

// encode appends the ids of text to ids.
func (t *HF) encode(ids []int, text string) ([]int, error) {
	if t.addedRE == nil {
		return t.encodeText(ids, text, true)
	}
	runes := []rune(text)
	last := 0
	m, err := match(func() (*regexp2.Match, error) { return t.addedRE.FindRunesMatch(runes) })
	for m != nil {
		if ids, err = t.encodeText(ids, string(runes[last:m.Index]), last == 0); err != nil {
			return ids, err
		}
		for i, g := range m.Groups()[1:] {
			if g.Length > 0 {
				ids = append(ids, t.addedAt[i])
				break
			}
		}
		last = m.Index + m.Length
		prev := m
		m, err = match(func() (*regexp2.Match, error) { return t.addedRE.FindNextMatch(prev) })
	}
	if err != nil {
		return ids, matchError("added tokens' pattern", t.addedRE, last, err)
	}
	return t.encodeText(ids, string(runes[last:]), last == 0)
}

// encodeText appends the ids of text that holds no added token; atStart
// says it begins the text given to Encode.
func (t *HF) encodeText(ids []int, text string, atStart bool) ([]int, error) {
	if text == "" {
		return ids, nil
	}
	if !t.byteLevel {
		return t.encodeSymbols(ids, text, atStart)
	}
	for _, f := range t.normal {
		text = f(text)
	}
	pieces, err := t.preTokenize([]string{text})
	if err != nil {
		return ids, err
	}
	var word []int
	var b strings.Builder
	for _, p := range pieces {
		b.Reset()
		for i := 0; i < len(p); i++ {
			b.WriteRune(byteRunes[p[i]])
		}
		w := b.String()
		if id, ok := t.vocab[w]; ok && t.ignoreMerges {
			ids = append(ids, id)
			continue
		}
		word = word[:0]
		for _, r := range w {
			word = append(word, t.vocab[string(r)]) // every byte is in a byte-level vocabulary (checked at load)
		}
		ids = append(ids, t.bpe(word)...)
	}
	return ids, nil
}

// preTokenize runs the pre-tokenizer's steps over pieces, in order.
func (t *HF) preTokenize(pieces []string) ([]string, error) {
	for _, step := range t.pre {
		var next []string
		for _, p := range pieces {
			out, err := step(p)
			if err != nil {
				return nil, err
			}
			next = append(next, out...)
		}
		pieces = next
	}
	return pieces, nil
}

// bpe merges the word's adjacent ids, the lowest-ranked merge first (the
// leftmost of equal ranks), until none applies. The candidate merges wait
// in a heap and the symbols form a linked list, as in the tokenizers
// library: O(n log n) in the word's length, where rescanning the word for
// each merge took minutes on a long run of letters.
func (t *HF) bpe(word []int) []int {
	n := len(word)
	if n < 2 {
		return word
	}
	next, prev := make([]int, n), make([]int, n)
	for i := range n {
		next[i], prev[i] = i+1, i-1
	}
	next[n-1] = -1
	h := &mergeHeap{}
	push := func(i int) {
		if i >= 0 && next[i] >= 0 {
			if m, ok := t.merges[[2]int{word[i], word[next[i]]}]; ok {
				heap.Push(h, candidate{m.rank, i, word[i], word[next[i]], m.id})
			}
		}
	}
	for i := range n - 1 {
		push(i)
	}
	for h.Len() > 0 {
		c := heap.Pop(h).(candidate)
		j := next[c.at]
		if word[c.at] != c.left || j < 0 || word[j] != c.right || word[c.at] < 0 {
			continue // a merge since changed a side: stale
		}
		word[c.at], word[j] = c.id, -1
		next[c.at] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = c.at
		}
		push(prev[c.at])
		push(c.at)
	}
	out := word[:0]
	for i := 0; i >= 0; i = next[i] {
		out = append(out, word[i])
	}
	return out
}

// candidate is a merge of the symbols at at and after it, left and right
// when it was found, into id.
type candidate struct{ rank, at, left, right, id int }

// mergeHeap orders candidates by rank, then position.
type mergeHeap []candidate

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].at < h[j].at
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(candidate)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Decode implements Tokenizer: added tokens as written, the others from
// their byte-level characters back to bytes.
func (t *HF) Decode(ids []int) string {
	if !t.byteLevel {
		return t.decodeSymbols(ids)
	}
	var out []byte
	for _, id := range ids {
		if id < 0 || id >= len(t.tokens) {
			continue
		}
		s := t.tokens[id]
		if _, ok := t.added[id]; ok {
			out = append(out, s...)
			continue
		}
		for _, r := range s {
			if b, ok := runeBytes[r]; ok {
				out = append(out, b)
			} else {
				out = utf8.AppendRune(out, r)
			}
		}
	}
	return string(out)
}

// readSpecials finds the end-of-text and padding tokens: tokenizer_config's
// eos_token and pad_token when the file names them, else the first added
// token that reads as an end of text (<|endoftext|>, <|end_of_text|>,
// </s>, <eos>), else the last added special token. Without a
// post-processor in tokenizer.json, its add_bos_token and add_eos_token
// say what EncodeSequence puts around a sequence.
func (t *HF) readSpecials(configPath string) (Specials, error) {
	var cfg struct {
		EOS    json.RawMessage `json:"eos_token"`
		Pad    json.RawMessage `json:"pad_token"`
		BOS    json.RawMessage `json:"bos_token"`
		AddBOS *bool           `json:"add_bos_token"`
		AddEOS *bool           `json:"add_eos_token"`
	}
	if b, err := os.ReadFile(configPath); err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return Specials{}, fmt.Errorf("%s: %w", configPath, err)
		}
	}
	lookup := func(raw json.RawMessage) (int, bool) {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			var obj struct {
				Content string `json:"content"`
			}
			if json.Unmarshal(raw, &obj) != nil {
				return 0, false
			}
			s = obj.Content
		}
		for id, tok := range t.tokens {
			if s != "" && tok == s {
				return id, true
			}
		}
		return 0, false
	}
	eos, ok := lookup(cfg.EOS)
	if !ok {
		ids := make([]int, 0, len(t.added))
		for id, special := range t.added {
			if special {
				ids = append(ids, id)
			}
		}
		sort.Ints(ids)
		for _, id := range ids {
			switch strings.ToLower(strings.TrimFunc(t.tokens[id], unicode.IsSpace)) {
			case "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>":
				eos, ok = id, true
			}
			if ok {
				break
			}
		}
		if !ok && len(ids) > 0 {
			eos, ok = ids[len(ids)-1], true
		}
	}
	if !ok {
		return Specials{}, errors.New("no end-of-text token: the file has no added tokens and no tokenizer_config.json names an eos_token")
	}
	pad, ok := lookup(cfg.Pad)
	if !ok {
		pad = eos
	}
	// A tokenizer.json without a post-processor (Llama 2's older files)
	// says in tokenizer_config.json whether a sequence starts with
	// bos_token and ends with eos_token.
	if len(t.before) == 0 && len(t.after) == 0 {
		if cfg.AddBOS != nil && *cfg.AddBOS {
			bos, ok := lookup(cfg.BOS)
			if !ok {
				return Specials{}, fmt.Errorf("%s: add_bos_token without a bos_token in the vocabulary", configPath)
			}
			t.before = []int{bos}
		}
		if cfg.AddEOS != nil && *cfg.AddEOS {
			t.after = []int{eos}
		}
	}
	return Specials{Pad: pad, CLS: eos, EOT: eos}, nil
}
