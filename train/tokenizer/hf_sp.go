package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The SentencePiece-style BPE of a tokenizer.json (Llama 2, Mistral 7B):
// no byte-level alphabet, the symbols are the text's characters, a space
// is "▁" (U+2581: the normalizer's Prepend and Replace, or the Metaspace
// pre-tokenizer), a character the vocabulary lacks is its UTF-8 bytes as
// the tokens <0xHH> (byte_fallback), else the unknown token; the decoder
// undoes it (Replace "▁" by " ", ByteFallback, Fuse, Strip; or Metaspace).

// metaspace is the Metaspace pre-tokenizer: spaces become the replacement,
// which is put before a piece as its prepend scheme says, and with split
// each replacement starts a new piece.
type metaspace struct {
	repl    string
	prepend string // "always", "first" or "never"
	split   bool
}

// hfMetaspace is the Metaspace pre-tokenizer's or decoder's fields.
type hfMetaspace struct {
	Replacement    string `json:"replacement"`
	PrependScheme  string `json:"prepend_scheme"`
	AddPrefixSpace *bool  `json:"add_prefix_space"` // before prepend_scheme: true is "always"
	Split          *bool  `json:"split"`
}

func readMetaspace(raw json.RawMessage) (*metaspace, error) {
	var c hfMetaspace
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("Metaspace: %w", err)
	}
	m := &metaspace{repl: c.Replacement, prepend: c.PrependScheme, split: c.Split == nil || *c.Split}
	if m.repl == "" {
		m.repl = "▁"
	}
	if m.prepend == "" {
		m.prepend = "always"
		if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			m.prepend = "never"
		}
	}
	if m.prepend != "always" && m.prepend != "first" && m.prepend != "never" {
		return nil, fmt.Errorf("Metaspace prepend_scheme %q: want always, first or never", m.prepend)
	}
	return m, nil
}

// pieces is the Metaspace step of a piece; atStart says it begins the
// text (what prepend_scheme "first" asks).
func (m *metaspace) pieces(p string, atStart bool) []string {
	p = strings.ReplaceAll(p, " ", m.repl)
	if !strings.HasPrefix(p, m.repl) && (m.prepend == "always" || m.prepend == "first" && atStart) {
		p = m.repl + p
	}
	if !m.split {
		return []string{p}
	}
	var out []string
	for p != "" {
		_, first := utf8.DecodeRuneInString(p)
		i := strings.Index(p[first:], m.repl)
		if i < 0 {
			break
		}
		out, p = append(out, p[:first+i]), p[first+i:]
	}
	if p != "" {
		out = append(out, p)
	}
	return out
}

// encodeSymbols appends the ids of text (no added token in it) for a
// tokenizer without a byte-level alphabet: normalized, pre-tokenized,
// each piece's characters (or their byte tokens, or the unknown token)
// merged by BPE.
func (t *HF) encodeSymbols(ids []int, text string, atStart bool) ([]int, error) {
	for _, f := range t.normal {
		text = f(text)
	}
	pieces := []string{text}
	if t.meta != nil {
		pieces = t.meta.pieces(text, atStart)
	}
	pieces, err := t.preTokenize(pieces)
	if err != nil {
		return ids, err
	}
	var word []int
	var buf [utf8.UTFMax]byte
	for _, p := range pieces {
		if id, ok := t.vocab[p]; ok && t.ignoreMerges {
			ids = append(ids, id)
			continue
		}
		word = word[:0]
		unk := false
		for _, r := range p {
			if id, ok := t.vocab[string(r)]; ok {
				word, unk = append(word, id), false
				continue
			}
			if t.byteFallback {
				n := utf8.EncodeRune(buf[:], r)
				if bs, ok := t.byteIDs(buf[:n]); ok {
					word, unk = append(word, bs...), false
					continue
				}
			}
			if !(unk && t.fuseUnk) {
				word = append(word, t.unk)
			}
			unk = true
		}
		ids = append(ids, t.bpe(word)...)
	}
	return ids, nil
}

// byteIDs are the <0xHH> tokens of bs, if the vocabulary has them all.
func (t *HF) byteIDs(bs []byte) ([]int, bool) {
	out := make([]int, len(bs))
	for i, b := range bs {
		if out[i] = t.byteTok[b]; out[i] < 0 {
			return nil, false
		}
	}
	return out, true
}

// decodeStep is one decoder of the chain, over the tokens' texts.
type decodeStep func(tokens []string) []string

// hfDecoder is a decoder of tokenizer.json.
type hfDecoder struct {
	Type     string            `json:"type"`
	Decoders []json.RawMessage `json:"decoders"`
	Pattern  struct {
		String *string `json:"String"`
	} `json:"pattern"`
	Content string `json:"content"`
	Start   int    `json:"start"`
	Stop    int    `json:"stop"`
}

// addDecoder appends the decoder's steps: Replace (of a string),
// ByteFallback, Fuse, Strip, Metaspace or a Sequence of them.
func (t *HF) addDecoder(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return errors.New("no decoder: a tokenizer without ByteLevel needs one (Llama 2's: Replace, ByteFallback, Fuse, Strip)")
	}
	var c hfDecoder
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("decoder: %w", err)
	}
	switch c.Type {
	case "Sequence":
		for _, r := range c.Decoders {
			if err := t.addDecoder(r); err != nil {
				return err
			}
		}
		return nil
	case "Replace":
		if c.Pattern.String == nil {
			return errors.New("decoder Replace with a regex is not supported (a String pattern)")
		}
		from, to := *c.Pattern.String, c.Content
		t.decode = append(t.decode, func(ts []string) []string {
			for i := range ts {
				ts[i] = strings.ReplaceAll(ts[i], from, to)
			}
			return ts
		})
	case "ByteFallback":
		t.decode = append(t.decode, byteFallbackDecode)
	case "Fuse":
		t.decode = append(t.decode, func(ts []string) []string { return []string{strings.Join(ts, "")} })
	case "Strip":
		content, n := utf8.DecodeRuneInString(c.Content)
		if n == 0 || n != len(c.Content) || c.Start < 0 || c.Stop < 0 {
			return fmt.Errorf("decoder Strip %q start %d stop %d: want one character and counts >= 0", c.Content, c.Start, c.Stop)
		}
		t.decode = append(t.decode, func(ts []string) []string {
			for i, tok := range ts {
				rs := []rune(tok)
				lo, hi := 0, len(rs)
				for lo < min(c.Start, len(rs)) && rs[lo] == content {
					lo++
				}
				for hi > lo && len(rs)-hi < c.Stop && rs[hi-1] == content {
					hi--
				}
				ts[i] = string(rs[lo:hi])
			}
			return ts
		})
	case "Metaspace":
		m, err := readMetaspace(raw)
		if err != nil {
			return fmt.Errorf("decoder %w", err)
		}
		t.decode = append(t.decode, func(ts []string) []string {
			for i := range ts {
				space := " "
				if i == 0 && m.prepend != "never" {
					space = "" // the first token's replacements are all dropped, as the library does
				}
				ts[i] = strings.ReplaceAll(ts[i], m.repl, space)
			}
			return ts
		})
	default:
		return fmt.Errorf("decoder %q is not supported without ByteLevel (Replace, ByteFallback, Fuse, Strip, Metaspace or a Sequence of them)", c.Type)
	}
	return nil
}

// byteFallbackDecode turns runs of <0xHH> tokens into their bytes' text,
// or one U+FFFD a byte when they are not UTF-8.
func byteFallbackDecode(ts []string) []string {
	var out []string
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, tok := range ts {
		if len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
			if b, err := strconv.ParseUint(tok[3:5], 16, 8); err == nil {
				run = append(run, byte(b))
				continue
			}
		}
		flush()
		out = append(out, tok)
	}
	flush()
	return out
}

// decodeSymbols is Decode for a tokenizer without a byte-level alphabet:
// the tokens' texts (added tokens as written) through the decoder chain.
func (t *HF) decodeSymbols(ids []int) string {
	var ts []string
	for _, id := range ids {
		if id >= 0 && id < len(t.tokens) {
			ts = append(ts, t.tokens[id])
		}
	}
	for _, step := range t.decode {
		ts = step(ts)
	}
	return strings.Join(ts, "")
}

// symbolModel checks and completes a tokenizer without a byte-level
// alphabet: every character must have a way to an id (the byte tokens of
// byte_fallback, all 256, or the unknown token), and the decoder must
// undo the normalization.
func (t *HF) symbolModel(unkToken *string, decoder json.RawMessage) error {
	for b := range t.byteTok {
		id, ok := t.vocab[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id = -1
		}
		t.byteTok[b] = id
	}
	if unkToken != nil {
		id, ok := t.vocab[*unkToken]
		if !ok {
			return fmt.Errorf("unk_token %q is not in the vocabulary", *unkToken)
		}
		t.unk = id
	}
	if t.unk < 0 {
		var all [256]byte
		for i := range all {
			all[i] = byte(i)
		}
		if _, ok := t.byteIDs(all[:]); !t.byteFallback || !ok {
			return errors.New("a BPE without a ByteLevel pre-tokenizer needs byte_fallback with the 256 tokens <0x00>..<0xFF>, or an unk_token")
		}
	}
	return t.addDecoder(decoder)
}
