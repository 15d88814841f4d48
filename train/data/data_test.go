package data

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

func TestReadIMDb(t *testing.T) {
	csv := "review,sentiment\n\"A fine, moving film\",positive\nDull.,negative\nok,1\nmeh,NEG\n"
	ex, err := ReadIMDb(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	want := []Example{{"A fine, moving film", 1}, {"Dull.", 0}, {"ok", 1}, {"meh", 0}}
	if len(ex) != len(want) {
		t.Fatalf("got %d examples", len(ex))
	}
	for i := range want {
		if ex[i] != want[i] {
			t.Errorf("example %d = %+v, want %+v", i, ex[i], want[i])
		}
	}
	// Columns in the other order.
	ex, err = ReadIMDb(strings.NewReader("sentiment,review\n0,bad\n"))
	if err != nil || len(ex) != 1 || ex[0] != (Example{"bad", 0}) {
		t.Fatalf("swapped columns: %v %v", ex, err)
	}
}

func TestReadIMDbErrors(t *testing.T) {
	tests := []struct{ name, csv, want string }{
		{"empty", "", "empty CSV"},
		{"header only", "review,sentiment\n", "no reviews"},
		{"wrong columns", "text,label\nfoo,1\n", "want columns review and sentiment"},
		{"bad label", "review,sentiment\nfoo,maybe\n", `line 2: sentiment "maybe"`},
		{"short row", "review,sentiment\nfoo\n", "line 2: 1 fields"},
	}
	for _, tt := range tests {
		_, err := ReadIMDb(strings.NewReader(tt.csv))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tt.name, err, tt.want)
		}
	}
}

func TestSyntheticSentimentIsLearnable(t *testing.T) {
	ex := SyntheticSentiment(2000, 7)
	pos := map[string]bool{}
	for _, w := range synthPositive {
		pos[w] = true
	}
	neg := map[string]bool{}
	for _, w := range synthNegative {
		neg[w] = true
	}
	ones := 0
	for _, e := range ex {
		p, n := 0, 0
		for _, w := range strings.Fields(e.Text) {
			if pos[w] {
				p++
			}
			if neg[w] {
				n++
			}
		}
		if (p > n) != (e.Label == 1) {
			t.Fatalf("%q labelled %d: majority rule broken", e.Text, e.Label)
		}
		ones += e.Label
	}
	if ones < 900 || ones > 1100 {
		t.Fatalf("%d positives of 2000: labels not balanced", ones)
	}
	if SyntheticSentiment(3, 7)[2] != ex[2] {
		t.Fatal("same seed gave another set")
	}
}

func TestPrepareErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		edit func(*config.Config)
		want string
	}{
		{"missing file", func(c *config.Config) { c.Data = filepath.Join(dir, "nope.csv") }, "no such file"},
		{"empty csv", func(c *config.Config) { c.Data = write("e.csv", "") }, "empty CSV"},
		{"wrong columns", func(c *config.Config) { c.Data = write("w.csv", "a,b\n1,2\n") }, "want columns review and sentiment"},
		{"bad label", func(c *config.Config) { c.Data = write("l.csv", "review,sentiment\nx,7\n") }, `sentiment "7"`},
		{"gpt short text", func(c *config.Config) { c.Model, c.Data = "gpt", write("t.txt", "abc") }, "lower --seq or give a longer file"},
		{"gpt empty text", func(c *config.Config) { c.Model, c.Data = "gpt", write("t0.txt", " \n") }, "empty"},
		{"seq too long", func(c *config.Config) { c.ApplyPreset("gpt2-124m"); c.Seq = 2048 }, "longer than the 1024 positions"},
		{"vocab too small", func(c *config.Config) { c.Tokenizer, c.Vocab = "byte", 100 }, "smaller than the byte tokenizer"},
		{"heads", func(c *config.Config) { c.TP, c.NTasks = 3, 3 }, "heads 4 is not a multiple of tp 3"},
		{"tokenizer", func(c *config.Config) { c.Tokenizer = "sentencepiece" }, `tokenizer "sentencepiece"`},
	}
	for _, tt := range tests {
		cfg := config.DefaultConfig()
		tt.edit(&cfg)
		_, err := Prepare(cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tt.name, err, tt.want)
		}
	}
}

// A GPT trains on the built-in text when given no --data, the same on
// every rank.
func TestPrepareGPTSynthetic(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Model = "gpt"
	d, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Tokenizer.Name() != "byte" || d.Train.Len() < 1000 || SyntheticText(1) != SyntheticText(1) {
		t.Errorf("gpt on the built-in text: %s", d.Describe())
	}
}

func TestPrepareClassifier(t *testing.T) {
	cfg := config.DefaultConfig()
	d, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Train.Len() != synthTrain || d.Val.Len() != 512 {
		t.Fatalf("%s", d.Describe())
	}
	sp := d.Tokenizer.Specials()
	for i := 0; i < d.Train.Len(); i++ {
		row := d.Train.Tokens[i*cfg.Seq : (i+1)*cfg.Seq]
		n := int(d.Train.Lengths[i])
		if row[0] != int32(sp.CLS) || n < 2 || n > cfg.Seq {
			t.Fatalf("sample %d: %v (length %d)", i, row, n)
		}
		for _, id := range row[n:] {
			if id != int32(sp.Pad) {
				t.Fatalf("sample %d not padded after %d: %v", i, n, row)
			}
		}
	}
}

func TestPrepareText(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.txt")
	os.WriteFile(p, []byte(strings.Repeat("to be or not to be. ", 50)), 0o644)
	cfg := config.DefaultConfig()
	cfg.Model, cfg.Data, cfg.Seq = "gpt", p, 16
	d, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Tokenizer.Name() != "byte" || d.Vocab != 256 {
		t.Fatalf("%s", d.Describe())
	}
	// 1000 bytes: 62 windows of 16, 6 to validate.
	if d.Train.Len() != 56 || d.Val.Len() != 6 {
		t.Fatalf("%s", d.Describe())
	}
	for i := 0; i < 15; i++ {
		if d.Train.Targets[i] != d.Train.Tokens[i+1] {
			t.Fatalf("targets are not the tokens shifted by one")
		}
	}
}

// A text past MaxTextBytes is refused before it is read: a sparse file of
// 30 GB (no byte of it allocated) by its size, /dev/zero, which has no
// size and no end, once a byte past the limit is read.
func TestLoadTextRefusesHugeFiles(t *testing.T) {
	sparse := filepath.Join(t.TempDir(), "huge.txt")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(sparse, 30<<30); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	_, err = LoadText(sparse)
	if err == nil || !strings.Contains(err.Error(), "data "+sparse+": 30.0 GiB of text, more than the 1 GiB hpcrun reads as text: split it (split -C 1024M "+sparse+" part-)") {
		t.Errorf("LoadText of a 30 GiB sparse file: %v", err)
	}
	old := maxText
	maxText = 1 << 20
	defer func() { maxText = old }()
	_, err = LoadText("/dev/zero")
	if err == nil || !strings.Contains(err.Error(), "data /dev/zero: not a regular file, and longer, more than the 1 MiB hpcrun reads as text: split it (split -C 1M /dev/zero part-)") || !strings.Contains(err.Error(), "hpcrun data tokenize") {
		t.Errorf("LoadText of /dev/zero: %v", err)
	}
}

// An IMDb CSV past MaxTextBytes is refused as a text is (it had no limit:
// a 30 GB sparse CSV was read until out of memory): a sparse file (no byte
// of it allocated) by its size, /dev/zero once a byte past the limit is
// read; a CSV within the limit still loads.
func TestLoadIMDbRefusesHugeFiles(t *testing.T) {
	dir := t.TempDir()
	sparse := filepath.Join(dir, "huge.csv")
	if err := os.WriteFile(sparse, []byte("review,sentiment\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 30<<30); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	_, err := LoadIMDb(sparse)
	if err == nil || err.Error() != "data "+sparse+": 30.0 GiB of CSV, more than the 1 GiB hpcrun reads as CSV: keep fewer of its reviews (a rank holds them all in memory)" {
		t.Errorf("LoadIMDb of a 30 GiB sparse file: %v", err)
	}
	old := maxText
	maxText = 1 << 20
	defer func() { maxText = old }()
	_, err = LoadIMDb("/dev/zero")
	if err == nil || err.Error() != "data /dev/zero: not a regular file, and longer, more than the 1 MiB hpcrun reads as CSV: keep fewer of its reviews (a rank holds them all in memory)" {
		t.Errorf("LoadIMDb of /dev/zero: %v", err)
	}
	small := filepath.Join(dir, "small.csv")
	if err := os.WriteFile(small, []byte("review,sentiment\ngood,1\nbad,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ex, err := LoadIMDb(small); err != nil || len(ex) != 2 {
		t.Errorf("LoadIMDb of a small CSV: %v, %v", ex, err)
	}
}
