package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// TestTokenFileEqualsTextTokenized: a text tokenized with GPT-2 into one
// token file, or into three shards read through a glob, gives the same
// training and validation windows as the text tokenized in process.
func TestTokenFileEqualsTextTokenized(t *testing.T) {
	dir := t.TempDir()
	text := textFile(t)
	b, _ := os.ReadFile(text)
	tok, err := tokenizer.NewGPT2()
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(b))
	one := filepath.Join(dir, "all.bin")
	if err := WriteTokenFile(one, ids, tok.VocabSize()); err != nil {
		t.Fatal(err)
	}
	n := len(ids) / 3
	for i, part := range [][]int{ids[:n], ids[n : 2*n], ids[2*n:]} {
		if err := WriteTokenFile(filepath.Join(dir, "shard_"+string(rune('0'+i))+".bin"), part, tok.VocabSize()); err != nil {
			t.Fatal(err)
		}
	}
	cfg := smallConfig("gpt")
	cfg.Tokenizer, cfg.Data, cfg.Samples = "gpt2", text, 0
	want, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range []string{one, filepath.Join(dir, "shard_*.bin")} {
		cfg.Data, cfg.Tokenizer = data, ""
		got, err := Prepare(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got.Tokenizer.Name() != "gpt2" || got.Vocab != 50257 {
			t.Errorf("%s: tokenizer %s vocab %d, want gpt2 50257", data, got.Tokenizer.Name(), got.Vocab)
		}
		for _, sets := range [][2]*Dataset{{want.Train, got.Train}, {want.Val, got.Val}} {
			w, g := sets[0], sets[1]
			if w.Len() != g.Len() {
				t.Fatalf("%s: %d samples, text gives %d", data, g.Len(), w.Len())
			}
			idx := make([]int, w.Len())
			for i := range idx {
				idx[i] = i
			}
			var bw, bg Batch
			w.Gather(&bw, idx)
			g.Gather(&bg, idx)
			if !reflect.DeepEqual(bw, bg) {
				t.Errorf("%s: the windows differ from the text's", data)
			}
		}
	}
}

// TestTokenFileRejections: a bad magic, an unknown version, a truncated
// file or header, a token outside the vocabulary (of either width) and an
// empty glob are one-line errors naming the file.
func TestTokenFileRejections(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.bin")
	if err := WriteTokenFile(good, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 50257); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o644)
		return p
	}
	bad := append([]byte{1, 2, 3, 4}, b[4:]...)
	big := filepath.Join(dir, "big.bin")
	if err := WriteTokenFile(big, []int{1, 2, 60000, 4}, 1<<16); err != nil {
		t.Fatal(err)
	}
	wide := filepath.Join(dir, "wide.bin")
	if err := WriteTokenFile(wide, []int{1, 100000, 3}, 128256); err != nil {
		t.Fatal(err)
	}
	w, _ := os.ReadFile(wide)
	version := func(magic, v uint32) []byte {
		c := slices.Clone(b)
		binary.LittleEndian.PutUint32(c[0:], magic)
		binary.LittleEndian.PutUint32(c[4:], v)
		return c
	}
	for _, c := range []struct {
		data string
		want string
	}{
		{write("magic.bin", bad), "magic.bin: magic 67305985, token files have 20240520 (uint16 tokens) or 20240801 (uint32)"},
		{write("v2.bin", version(20240520, 2)), "v2.bin: token file magic 20240520, version 2: hpcrun reads magic 20240520 version 1 (uint16 tokens) and magic 20240801 version 7 (uint32)"},
		{write("v1of32.bin", version(20240801, 1)), "v1of32.bin: token file magic 20240801, version 1: hpcrun reads"},
		{write("short.bin", b[:len(b)-2]), "short.bin: 1042 bytes, its header's 10 tokens need 1044"},
		{write("short32.bin", w[:len(w)-2]), "short32.bin: 1034 bytes, its header's 3 tokens need 1036"},
		{write("header.bin", w[:100]), "header.bin: 100 bytes, shorter than the 1024-byte token file header"},
		{big, "big.bin: token 60000 at position 2 is outside the model's vocabulary of 50257"},
		{wide, "wide.bin: token 100000 at position 1 is outside the model's vocabulary of 50257"},
		{filepath.Join(dir, "none_*.bin"), "none_*.bin: no such file"},
	} {
		cfg := smallConfig("gpt")
		cfg.Data = c.data
		_, err := Prepare(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", c.data, err, c.want)
		}
	}
	if err := WriteTokenFile(filepath.Join(dir, "x.bin"), []int{70000}, 50257); err == nil || !strings.Contains(err.Error(), "token 70000 at position 0 is outside the vocabulary of 50257") {
		t.Errorf("token 70000: %v", err)
	}
}

// tokenFileHeader is the magic, version and token count at the head of the
// token file path, and its size.
func tokenFileHeader(t *testing.T, path string) (magic, version, count int32, size int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < tokenHeader {
		t.Fatalf("%s: %d bytes, %v", path, len(b), err)
	}
	h := func(i int) int32 { return int32(binary.LittleEndian.Uint32(b[4*i:])) }
	return h(0), h(1), h(2), len(b)
}

// readTokens is the tokens of the token files pattern names, read back the
// way a run reads them.
func readTokens(t *testing.T, pattern string, vocab int) []int {
	t.Helper()
	s, err := openTokenFiles(pattern, vocab)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf := make([]int32, s.Len())
	s.read(buf, 0)
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	ids := make([]int, len(buf))
	for i, v := range buf {
		ids[i] = int(v)
	}
	return ids
}

// TestTokenFileRoundTrip: tokens written for a vocabulary of up to 65,536
// ids are llm.c's GPT-2 format (magic 20240520, version 1, uint16), for a
// larger one its Llama 3 format (magic 20240801, version 7, uint32) even
// when every token fits in 16 bits; either reads back as written.
func TestTokenFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for i, c := range []struct {
		vocab                 int
		tokens                []int
		magic, version, width int32
	}{
		{50257, []int{0, 1, 255, 256, 50256, 7}, 20240520, 1, 2},
		{1 << 16, []int{65535, 0, 65534}, 20240520, 1, 2},
		{1<<16 + 1, []int{0, 65536, 1}, 20240801, 7, 4},
		{128256, []int{128000, 0, 65535, 65536, 128255, 42}, 20240801, 7, 4},
		{128256, []int{1, 2, 3}, 20240801, 7, 4},
		{128256, nil, 20240801, 7, 4},
	} {
		path := filepath.Join(dir, fmt.Sprintf("t%d.bin", i))
		if err := WriteTokenFile(path, c.tokens, c.vocab); err != nil {
			t.Fatal(err)
		}
		magic, version, count, size := tokenFileHeader(t, path)
		if magic != c.magic || version != c.version || int(count) != len(c.tokens) || size != tokenHeader+int(c.width)*len(c.tokens) {
			t.Errorf("vocab %d: magic %d version %d, %d tokens in %d bytes; want %d %d, %d in %d",
				c.vocab, magic, version, count, size, c.magic, c.version, len(c.tokens), tokenHeader+int(c.width)*len(c.tokens))
		}
		if got := readTokens(t, path, c.vocab); !slices.Equal(got, c.tokens) && len(got)+len(c.tokens) > 0 {
			t.Errorf("vocab %d: read back %v, wrote %v", c.vocab, got, c.tokens)
		}
	}
}

// TestTokenFileVersion1Unchanged: a GPT-2 token file is byte for byte what
// WriteTokenFile wrote before it learned the uint32 format (the SHA-256 of
// its output then), and what llm.c's write_datafile writes.
func TestTokenFileVersion1Unchanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v1.bin")
	ids := []int{0, 1, 255, 256, 50256, 65535, 4242, 7}
	if err := WriteTokenFile(path, ids, 1<<16); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(got)); sum != "d8b3906f2bd11ddae5cd9e8edbaa2f19a3c953d34ba7d17f429dc39d1d0d6ea3" {
		t.Errorf("sha256 %s, the writer before gave d8b3906f...", sum)
	}
	want := make([]byte, tokenHeader, tokenHeader+2*len(ids))
	binary.LittleEndian.PutUint32(want[0:], 20240520)
	binary.LittleEndian.PutUint32(want[4:], 1)
	binary.LittleEndian.PutUint32(want[8:], uint32(len(ids)))
	for _, id := range ids {
		want = binary.LittleEndian.AppendUint16(want, uint16(id))
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the file differs from llm.c's layout:\n got %x\nwant %x", got[tokenHeader-8:], want[tokenHeader-8:])
	}
}

// TestTokenFileNumPy reads the files WriteTokenFile writes with NumPy, as
// llm.c's and nanoGPT's Python loaders do: the header as 256 little-endian
// int32, the rest as the dtype its magic and version name.
func TestTokenFileNumPy(t *testing.T) {
	py := numpyPython(t)
	const script = `
import json, sys
import numpy as np
with open(sys.argv[1], "rb") as f:
    header = np.frombuffer(f.read(256 * 4), dtype="<i4")
    body = f.read()
magic, version, count = (int(v) for v in header[:3])
dtype = {(20240520, 1): "<u2", (20240801, 7): "<u4"}[(magic, version)]
tokens = np.frombuffer(body, dtype=dtype)
assert count == len(tokens) and len(body) == count * np.dtype(dtype).itemsize, (count, len(body))
assert not header[3:].any(), "header words 3..255 are not zero"
print(json.dumps({"dtype": dtype, "tokens": tokens.tolist()}))
`
	dir := t.TempDir()
	for i, c := range []struct {
		vocab  int
		tokens []int
		dtype  string
	}{
		{50257, []int{50256, 0, 65, 1000}, "<u2"},
		{128256, []int{128000, 9906, 65536, 0, 128255}, "<u4"},
	} {
		path := filepath.Join(dir, fmt.Sprintf("t%d.bin", i))
		if err := WriteTokenFile(path, c.tokens, c.vocab); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(py, "-c", script, path).CombinedOutput()
		if err != nil {
			t.Fatalf("numpy on the vocab %d file: %v\n%s", c.vocab, err, out)
		}
		var got struct {
			DType  string `json:"dtype"`
			Tokens []int  `json:"tokens"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if got.DType != c.dtype || !slices.Equal(got.Tokens, c.tokens) {
			t.Errorf("vocab %d: numpy reads %s %v, want %s %v", c.vocab, got.DType, got.Tokens, c.dtype, c.tokens)
		}
	}
}

// TestTokenFileUint32Prepare: a glob of a uint16 shard and a uint32 shard
// with ids above 65535 makes the same windows as the tokens themselves.
func TestTokenFileUint32Prepare(t *testing.T) {
	dir := t.TempDir()
	const vocab = 70000
	var ids []int
	for i := range 600 {
		ids = append(ids, (i*7919)%256)
	}
	n16 := len(ids)
	for i := range 900 {
		ids = append(ids, (i*104729)%vocab)
	}
	if err := WriteTokenFile(filepath.Join(dir, "shard_0.bin"), ids[:n16], 256); err != nil {
		t.Fatal(err)
	}
	if err := WriteTokenFile(filepath.Join(dir, "shard_1.bin"), ids[n16:], vocab); err != nil {
		t.Fatal(err)
	}
	if m, v, _, _ := tokenFileHeader(t, filepath.Join(dir, "shard_1.bin")); m != 20240801 || v != 7 || slices.Max(ids[n16:]) < 1<<16 {
		t.Fatalf("shard_1: magic %d version %d, max id %d: want a uint32 file with ids above 65535", m, v, slices.Max(ids[n16:]))
	}
	cfg := smallConfig("gpt")
	cfg.Data, cfg.Tokenizer, cfg.Vocab, cfg.Samples = filepath.Join(dir, "shard_*.bin"), "byte", vocab, 0
	d, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	T := cfg.Seq
	if nWin := (len(ids) - 1) / T; d.Train.Len()+d.Val.Len() != nWin {
		t.Fatalf("%d + %d windows, want %d", d.Train.Len(), d.Val.Len(), nWin)
	}
	first := 0
	for _, set := range []*Dataset{d.Train, d.Val} {
		if set == d.Val {
			first = set.first
		}
		idx := make([]int, set.Len())
		for i := range idx {
			idx[i] = i
		}
		var b Batch
		set.Gather(&b, idx)
		for i := range idx {
			w := ids[(first+i)*T : (first+i)*T+T+1]
			for j := range T {
				if int(b.Tokens[i*T+j]) != w[j] || int(b.Targets[i*T+j]) != w[j+1] {
					t.Fatalf("window %d: tokens %v targets %v, want %v", first+i, b.Tokens[i*T:i*T+T], b.Targets[i*T:i*T+T], w)
				}
			}
		}
	}
}

// TestTokenizeLargeVocab: a tokenizer of more than 65,536 ids (here its
// end-of-text is 128001, as Llama 3's) tokenizes into a uint32 token file
// that reads back as its ids.
func TestTokenizeLargeVocab(t *testing.T) {
	dir := t.TempDir()
	vocab := map[string]int{}
	for b := range 256 {
		vocab[tokenizer.ByteLevel([]byte{byte(b)})] = b
	}
	vocab["he"] = 70000
	file := map[string]any{
		"added_tokens":  []map[string]any{{"id": 128001, "content": "<|end_of_text|>", "special": true}},
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h e"}},
	}
	b, _ := json.Marshal(file)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "<|end_of_text|>"}`), 0o644)
	tok, err := tokenizer.LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, c := filepath.Join(dir, "a.txt"), filepath.Join(dir, "c.txt")
	os.WriteFile(a, []byte("hello"), 0o644)
	os.WriteFile(c, []byte("he"), 0o644)
	ids, err := TokenizeFiles(tok, []string{a, c})
	if want := []int{70000, 'l', 'l', 'o', 128001, 70000}; err != nil || !slices.Equal(ids, want) {
		t.Fatalf("TokenizeFiles = %v, %v; want %v", ids, err, want)
	}
	path := filepath.Join(dir, "out.bin")
	if err := WriteTokenFile(path, ids, tok.VocabSize()); err != nil {
		t.Fatal(err)
	}
	if m, v, n, _ := tokenFileHeader(t, path); m != 20240801 || v != 7 || int(n) != len(ids) {
		t.Errorf("magic %d version %d count %d, want 20240801 7 %d", m, v, n, len(ids))
	}
	if got := readTokens(t, path, tok.VocabSize()); !slices.Equal(got, ids) {
		t.Errorf("read back %v, wrote %v", got, ids)
	}
}

// The Hugging Face tokenizer fixtures of package tokenizer, described in
// ../tokenizer/testdata/hf/README.md.
const (
	tinyHF        = "../tokenizer/testdata/hf/tiny"         // byte b is id b, four merges, <|eot|> (260) and <pad>
	templateHF    = "../tokenizer/testdata/hf/template"     // tiny's, <|begin_of_text|> (262) before each sequence
	templateEOTHF = "../tokenizer/testdata/hf/template-eot" // template's, <|eot|> after each sequence too
)

// TokenizeFiles joins the files' tokens with the end-of-text token.
func TestTokenizeFiles(t *testing.T) {
	tok, err := tokenizer.LoadHF(tinyHF)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	os.WriteFile(a, []byte("hello"), 0o644)
	os.WriteFile(b, []byte("he"), 0o644)
	ids, err := TokenizeFiles(tok, []string{a, b})
	if want := []int{258, 'o', 260, 256}; err != nil || !reflect.DeepEqual(ids, want) {
		t.Errorf("TokenizeFiles = %v, %v; want %v", ids, err, want)
	}
}

// A tokenizer.json's post-processor puts its special tokens around each
// sequence where text becomes a model's input: Llama 3's TemplateProcessing
// its <|begin_of_text|> before each training document (data tokenize, a
// text trained or evaluated on); before a prompt, train's
// TestPostProcessorBeginsEachPrompt.
func TestPostProcessorBeginsEachSequence(t *testing.T) {
	tok, err := tokenizer.LoadHF(templateHF)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	os.WriteFile(a, []byte("hello"), 0o644)
	os.WriteFile(b, []byte("he"), 0o644)
	if ids, err := TokenizeFiles(tok, []string{a, b}); err != nil || !reflect.DeepEqual(ids, []int{262, 258, 'o', 260, 262, 256}) {
		t.Errorf("TokenizeFiles = %v, %v; want each document after <|begin_of_text|>", ids, err)
	}
	cfg := smallConfig("gpt")
	cfg.Tokenizer, cfg.VocabFile, cfg.Data, cfg.Vocab = "hf", filepath.Join(templateHF, "tokenizer.json"), textFile(t), 0
	d, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.Train.Tokens[0] != 262 {
		t.Errorf("a text trained on starts with %v, want <|begin_of_text|> (262)", d.Train.Tokens[:4])
	}
}

// A template that also ends each sequence with end-of-text (<s> $A </s>):
// documents are joined by one end-of-text, not two (a prompt, train's
// TestTemplateEndingWithEOTPrompt).
func TestTemplateEndingWithEOTJoinsOnce(t *testing.T) {
	tok, err := tokenizer.LoadHF(templateEOTHF)
	if err != nil {
		t.Fatal(err)
	}
	eot := tok.Specials().EOT
	dir := t.TempDir()
	a, c := filepath.Join(dir, "a.txt"), filepath.Join(dir, "b.txt")
	os.WriteFile(a, []byte("hello"), 0o644)
	os.WriteFile(c, []byte("he"), 0o644)
	if ids, err := TokenizeFiles(tok, []string{a, c}); err != nil || !reflect.DeepEqual(ids, []int{262, 258, 'o', eot, 262, 256, eot}) {
		t.Errorf("TokenizeFiles = %v, %v; want one end-of-text between the documents", ids, err)
	}
}

// The vocabulary check over a mapped token file (when the data is
// prepared) also stops with an error if the file shrinks under it.
func TestTokenFileTruncatedWhilePrepared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.bin")
	ids := make([]int, 20000)
	if err := WriteTokenFile(path, ids, 256); err != nil {
		t.Fatal(err)
	}
	toks, unmap, err := mapTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	os.Truncate(path, tokenHeader)
	if err := checkVocab(toks, path, 256); err == nil || !strings.Contains(err.Error(), "data "+path+": the file shrank") {
		t.Fatalf("checkVocab on a truncated file: %v", err)
	}
}
