package data

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/hpcrun/hpcrun/internal/units"
)

// Example is one labelled text of a classification set.
type Example struct {
	Text  string
	Label int // 0 negative, 1 positive
}

// LoadIMDb reads an IMDb-format CSV: a header naming a "review" and a
// "sentiment" column (in any order, other columns ignored), then one review a
// row with sentiment positive/negative, pos/neg or 1/0. A file over
// MaxTextBytes is refused, as LoadText refuses one.
func LoadIMDb(path string) ([]Example, error) {
	f, err := openBounded(path, "CSV", "keep fewer of its reviews (a rank holds them all in memory)")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ex, err := ReadIMDb(f)
	if err != nil {
		return nil, f.wrap(err)
	}
	return ex, nil
}

// ReadIMDb parses IMDb-format CSV from r (see LoadIMDb).
func ReadIMDb(r io.Reader) ([]Example, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = true
	head, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("empty CSV: want a header line review,sentiment and one row per review")
	}
	if err != nil {
		return nil, fmt.Errorf("CSV header: %w", err)
	}
	textCol, labelCol := -1, -1
	for i, h := range head {
		switch strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))) {
		case "review":
			textCol = i
		case "sentiment":
			labelCol = i
		}
	}
	if textCol < 0 || labelCol < 0 {
		return nil, fmt.Errorf("CSV header %q: want columns review and sentiment", strings.Join(head, ","))
	}
	var out []Example
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("CSV: %w", err)
		}
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) <= max(textCol, labelCol) {
			return nil, fmt.Errorf("line %d: %d fields, want at least %d (review,sentiment)", line, len(rec), max(textCol, labelCol)+1)
		}
		label, err := parseLabel(rec[labelCol])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, Example{Text: rec[textCol], Label: label})
	}
	if len(out) == 0 {
		return nil, errors.New("CSV has a header but no reviews")
	}
	return out, nil
}

func parseLabel(s string) (int, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "positive", "pos", "1":
		return 1, nil
	case "negative", "neg", "0":
		return 0, nil
	}
	return 0, fmt.Errorf("sentiment %q: use positive/negative, pos/neg or 1/0", s)
}

// Words of the synthetic sentiment set.
var (
	synthPositive = []string{"good", "great", "excellent", "wonderful", "loved", "amazing", "brilliant", "superb", "enjoyable", "fantastic", "moving", "beautiful"}
	synthNegative = []string{"bad", "awful", "terrible", "boring", "hated", "dull", "poor", "horrible", "worst", "weak", "annoying", "mess"}
	synthNeutral  = []string{"the", "movie", "film", "was", "plot", "actors", "story", "and", "a", "it", "this", "scene", "director", "ending", "music", "i", "with", "of", "cast", "script", "camera", "to", "in", "its", "character", "dialogue", "at", "times", "quite", "really"}
)

// SyntheticSentiment makes n reviews a small model can learn: filler words
// with two to four sentiment words of the label's polarity and at most one
// of the other, so that the label is the majority polarity. The same seed
// gives the same set on every rank.
func SyntheticSentiment(n int, seed uint64) []Example {
	r := rand.New(rand.NewPCG(seed, 0x5e471))
	out := make([]Example, n)
	for i := range out {
		label := r.IntN(2)
		pos, neg := synthNegative, synthPositive
		if label == 1 {
			pos, neg = synthPositive, synthNegative
		}
		words := make([]string, 6+r.IntN(12))
		for j := range words {
			words[j] = synthNeutral[r.IntN(len(synthNeutral))]
		}
		// Distinct positions: the label's words always outnumber the other's.
		at := r.Perm(len(words))
		k := 2 + r.IntN(3)
		for j := 0; j < k; j++ {
			words[at[j]] = pos[r.IntN(len(pos))]
		}
		if r.IntN(2) == 0 {
			words[at[k]] = neg[r.IntN(len(neg))]
		}
		out[i] = Example{Text: strings.Join(words, " "), Label: label}
	}
	return out
}

// synthTextBytes is the size of the built-in text (SyntheticText).
const synthTextBytes = 256 << 10

// Words of the built-in text's sentences.
var (
	synthAdj    = []string{"red", "old", "small", "quiet", "bright", "tired", "clever", "young"}
	synthNoun   = []string{"cat", "dog", "fox", "bird", "miller", "sailor", "child", "horse"}
	synthVerb   = []string{"saw", "followed", "helped", "found", "called", "watched"}
	synthPlace  = []string{"by the river", "in the garden", "at the mill", "on the hill", "near the road", "under the bridge"}
	synthTime   = []string{"In the morning", "At noon", "In the evening", "At night"}
	synthEnding = []string{"and they went home.", "and it began to rain.", "and nobody said a word.", "and the day was over."}
)

// SyntheticText is the language model's built-in text (--data synthetic,
// the default): about 256 KiB of short stories from a small grammar,
// which a tiny GPT learns in a few hundred steps, so that --model gpt
// works out of the box with nothing to download. The same seed gives the
// same text on every rank.
func SyntheticText(seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 0x7e47))
	pick := func(words []string) string { return words[r.IntN(len(words))] }
	var b strings.Builder
	for b.Len() < synthTextBytes {
		who, whom := pick(synthAdj)+" "+pick(synthNoun), pick(synthAdj)+" "+pick(synthNoun)
		fmt.Fprintf(&b, "%s the %s %s the %s %s, %s\n", pick(synthTime), who, pick(synthVerb), whom, pick(synthPlace), pick(synthEnding))
		if r.IntN(4) == 0 {
			fmt.Fprintf(&b, "The %s %s the %s again.\n\n", who, pick(synthVerb), whom)
		}
	}
	return b.String()
}

// MaxTextBytes bounds a text file that --data (and data tokenize) reads,
// and an IMDb CSV: a rank holds the text, its tokens and its windows in
// memory at once, about six times the text. A larger corpus goes through
// token files, which ranks map rather than read.
const MaxTextBytes = 1 << 30

// maxText is MaxTextBytes, lowered by tests.
var maxText int64 = MaxTextBytes

// LoadText reads a plain text file for the language model, at most
// MaxTextBytes of it: a larger file (a sparse one, or /dev/zero, which
// has no end) is refused before it is read whole.
func LoadText(path string) (string, error) {
	chunk := fmt.Sprint(maxText)
	if maxText%(1<<20) == 0 {
		chunk = fmt.Sprintf("%dM", maxText>>20)
	}
	f, err := openBounded(path, "text", fmt.Sprintf("split it (split -C %s %s part-), tokenize each part (hpcrun data tokenize part-aa -o part-aa.bin, ...) and give --data 'part-*.bin'", chunk, path))
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return "", f.wrap(err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return "", fmt.Errorf("data %s: the text file is empty", path)
	}
	return string(b), nil
}

// boundedFile is a data file that a rank reads whole into memory, at most
// maxText bytes of it.
type boundedFile struct {
	f    *os.File
	left int64 // bytes it may still read, the one past maxText included
	over error // the error of that byte
}

// openBounded opens path, a data file of kind ("text") that is read whole:
// a regular file over maxText bytes is refused by its size, before a byte
// of it is read; Read fails on the byte past maxText (a device, such as
// /dev/zero, which has no size and no end; a pipe; a file that grew). The
// error names path, its size, the limit, and advice: what to give instead.
func openBounded(path, kind, advice string) (*boundedFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data: %w", err)
	}
	tooLarge := func(what string) error {
		return &tooLargeError{fmt.Sprintf("data %s: %s, more than the %s hpcrun reads as %s: %s", path, what, units.Bytes(maxText, 0), kind, advice)}
	}
	if st.Mode().IsRegular() && st.Size() > maxText {
		f.Close()
		return nil, tooLarge(units.Bytes(st.Size(), 1) + " of " + kind)
	}
	what := "not a regular file, and longer"
	if st.Mode().IsRegular() {
		what = "longer once read (it grew)"
	}
	return &boundedFile{f: f, left: maxText + 1, over: tooLarge(what)}, nil
}

// tooLargeError is openBounded's refusal, a whole message of its own.
type tooLargeError struct{ msg string }

func (e *tooLargeError) Error() string { return e.msg }

func (b *boundedFile) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, b.over
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.f.Read(p)
	b.left -= int64(n)
	if b.left <= 0 {
		return n, b.over
	}
	return n, err
}

// Close closes the file.
func (b *boundedFile) Close() error { return b.f.Close() }

// wrap is err of reading the file as the caller returns it: the refusal
// of a file past the limit as it is, however deep the parser wrapped it;
// any other error after the file's name.
func (b *boundedFile) wrap(err error) error {
	var tl *tooLargeError
	if errors.As(err, &tl) {
		return tl
	}
	return fmt.Errorf("data %s: %w", b.f.Name(), err)
}
