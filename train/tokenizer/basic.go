package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
	"golang.org/x/text/unicode/norm"
)

// basicTokenizer is BERT's BasicTokenizer, the step before word pieces. In
// order: it removes NUL, U+FFFD and the control characters (Unicode category
// C*, but tab, newline and carriage return) and reads tab, newline, carriage
// return and the space separators (Zs) as spaces; puts spaces around every
// CJK ideograph; splits on white space; lower-cases each word and strips its
// accents (NFD, then drop the non-spacing marks, Mn) as the vocabulary asks;
// and splits off every punctuation character (category P*, and the ASCII
// symbols $+<=>^`|~).
type basicTokenizer struct {
	lower        bool // do_lower_case
	stripAccents bool // strip_accents; BERT strips when it lower-cases
	cjk          bool // tokenize_chinese_chars
}

// uncased is the basic tokenizer of BERT's uncased vocabularies, and of the
// ones hpcrun builds.
var uncased = basicTokenizer{lower: true, stripAccents: true, cjk: true}

// tokens returns the words and punctuation of text.
func (b basicTokenizer) tokens(text string) []string {
	var clean strings.Builder
	for _, r := range text {
		switch {
		case r == 0 || r == unicode.ReplacementChar || isControl(r):
		case isWhitespace(r):
			clean.WriteByte(' ')
		case b.cjk && isCJK(r):
			clean.WriteByte(' ')
			clean.WriteRune(r)
			clean.WriteByte(' ')
		default:
			clean.WriteRune(r)
		}
	}
	var lower cases.Caser
	if b.lower {
		lower = cases.Lower(language.Und) // as Python's str.lower: final sigma, İ to i̇
	}
	var out []string
	for _, w := range strings.FieldsFunc(clean.String(), unicode.IsSpace) {
		switch {
		case isASCII(w): // no accents, and ASCII's own lower case
			if b.lower {
				w = strings.ToLower(w)
			}
		default:
			if b.lower {
				w = lower.String(w)
			}
			if b.stripAccents {
				w = stripAccents(w)
			}
		}
		out = splitPunct(out, w)
	}
	return out
}

// stripAccents decomposes w (NFD) and drops the non-spacing marks.
func stripAccents(w string) string {
	d := norm.NFD.String(w)
	if !strings.ContainsFunc(d, isMn) {
		return d
	}
	return strings.Map(func(r rune) rune {
		if isMn(r) {
			return -1
		}
		return r
	}, d)
}

func isMn(r rune) bool { return unicode.Is(unicode.Mn, r) }

func isASCII(w string) bool {
	for i := 0; i < len(w); i++ {
		if w[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// splitPunct appends w's runs of other characters and each of its
// punctuation characters to out.
func splitPunct(out []string, w string) []string {
	start := 0
	for i, r := range w {
		if isPunct(r) {
			if start < i {
				out = append(out, w[start:i])
			}
			out = append(out, string(r))
			start = i + len(string(r))
		}
	}
	if start < len(w) {
		out = append(out, w[start:])
	}
	return out
}

// isWhitespace is BERT's white space: space, tab, newline, carriage return
// and the space separators (Zs).
func isWhitespace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || r == '\t' || r == '\n' || r == '\r'
	}
	return unicode.Is(unicode.Zs, r)
}

// isControl is BERT's control character: category C* (Cc, Cf, Co, Cs and the
// unassigned Cn), but tab, newline and carriage return, which are white space.
func isControl(r rune) bool {
	if r < utf8.RuneSelf {
		return (r < ' ' || r == 0x7f) && r != '\t' && r != '\n' && r != '\r'
	}
	return unicode.Is(unicode.C, r) || !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z)
}

// isPunct is BERT's punctuation: category P*, and all the ASCII characters
// that are neither letters, digits, space nor control (33-47, 58-64, 91-96,
// 123-126), $ + < = > ^ ` | ~ among them.
func isPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 33 && r <= 47 || r >= 58 && r <= 64 || r >= 91 && r <= 96 || r >= 123 && r <= 126
	}
	return unicode.IsPunct(r)
}

// isCJK reports whether r is in one of the CJK Unified Ideographs blocks BERT
// splits into single characters (Unified Ideographs and Extensions A to E,
// and the two Compatibility Ideographs blocks); Hiragana, Katakana and Hangul
// are not among them and stay words.
func isCJK(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FFF ||
		r >= 0x3400 && r <= 0x4DBF ||
		r >= 0x20000 && r <= 0x2A6DF ||
		r >= 0x2A700 && r <= 0x2B73F ||
		r >= 0x2B740 && r <= 0x2B81F ||
		r >= 0x2B820 && r <= 0x2CEAF ||
		r >= 0xF900 && r <= 0xFAFF ||
		r >= 0x2F800 && r <= 0x2FA1F
}

// tokenizerConfig is what hpcrun reads of a Hugging Face
// tokenizer_config.json: how the vocabulary's texts were cased.
type tokenizerConfig struct {
	DoLowerCase          *bool `json:"do_lower_case"`
	StripAccents         *bool `json:"strip_accents"` // null: as do_lower_case
	TokenizeChineseChars *bool `json:"tokenize_chinese_chars"`
}

// readBasicTokenizer reads the basic tokenizer of a vocabulary from the
// tokenizer_config.json at path; without that file the vocabulary is
// uncased, as BERT's tokenizer assumes.
func readBasicTokenizer(path string) (basicTokenizer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return uncased, nil
	}
	if err != nil {
		return basicTokenizer{}, err
	}
	var c tokenizerConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return basicTokenizer{}, fmt.Errorf("%s: %w", path, err)
	}
	t := uncased
	if c.DoLowerCase != nil {
		t.lower = *c.DoLowerCase
	}
	t.stripAccents = t.lower
	if c.StripAccents != nil {
		t.stripAccents = *c.StripAccents
	}
	if c.TokenizeChineseChars != nil {
		t.cjk = *c.TokenizeChineseChars
	}
	return t, nil
}
