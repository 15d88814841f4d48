package train

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestTokenFileEqualsTextTokenized: a text tokenized with GPT-2 into one
// token file, or into three shards read through a glob, gives the same
// training and validation windows as the text tokenized in process.
func TestTokenFileEqualsTextTokenized(t *testing.T) {
	dir := t.TempDir()
	text := textFile(t)
	b, _ := os.ReadFile(text)
	tok, err := NewGPT2Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(string(b))
	one := filepath.Join(dir, "all.bin")
	if err := WriteTokenFile(one, ids); err != nil {
		t.Fatal(err)
	}
	n := len(ids) / 3
	for i, part := range [][]int{ids[:n], ids[n : 2*n], ids[2*n:]} {
		if err := WriteTokenFile(filepath.Join(dir, "shard_"+string(rune('0'+i))+".bin"), part); err != nil {
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

// TestTokenFileRejections: a bad magic, a truncated file, a token outside
// the vocabulary and an empty glob are one-line errors naming the file.
func TestTokenFileRejections(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.bin")
	if err := WriteTokenFile(good, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}); err != nil {
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
	if err := WriteTokenFile(big, []int{1, 2, 60000, 4}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		data string
		want string
	}{
		{write("magic.bin", bad), "magic.bin: magic 67305985, token files have 20240520"},
		{write("short.bin", b[:len(b)-2]), "short.bin: 1042 bytes, its header's 10 tokens need 1044"},
		{big, "big.bin: token 60000 at position 2 is outside the model's vocabulary of 50257"},
		{filepath.Join(dir, "none_*.bin"), "none_*.bin: no such file"},
	} {
		cfg := smallConfig("gpt")
		cfg.Data = c.data
		_, err := Prepare(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", c.data, err, c.want)
		}
	}
	if err := WriteTokenFile(filepath.Join(dir, "x.bin"), []int{70000}); err == nil || !strings.Contains(err.Error(), "does not fit in uint16") {
		t.Errorf("token 70000: %v", err)
	}
}
