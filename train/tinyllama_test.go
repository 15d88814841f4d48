package train

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// scripts/tiny_llama.py, the Llama reference the engine's Llama will be
// checked against: its vectorised forward agrees with its loop-by-loop
// one (selftest), and the directory it makes is what Hugging Face writes:
// LlamaForCausalLM's tensor names and shapes in bfloat16 safetensors, and
// a tokenizer.json this package reads and round-trips.
func TestTinyLlamaScript(t *testing.T) {
	py := numpyPython(t)
	script := filepath.Join("..", "scripts", "tiny_llama.py")
	if out, err := exec.Command(py, script, "selftest").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("selftest: %v: %s", err, out)
	}
	dir := t.TempDir()
	if out, err := exec.Command(py, script, "make", dir, "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
		"--ffn", "160", "--vocab", "320", "--dtype", "bfloat16").CombinedOutput(); err != nil {
		t.Fatalf("make: %v: %s", err, out)
	}
	h, err := ckpt.ReadHeader(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int{"model.embed_tokens.weight": {320, 64}, "model.norm.weight": {64}, "lm_head.weight": {320, 64}}
	for i := range 2 {
		p := "model.layers." + string(rune('0'+i)) + "."
		for name, shape := range map[string][]int{
			"input_layernorm.weight": {64}, "post_attention_layernorm.weight": {64},
			"self_attn.q_proj.weight": {64, 64}, "self_attn.k_proj.weight": {32, 64}, "self_attn.v_proj.weight": {32, 64},
			"self_attn.o_proj.weight": {64, 64}, "mlp.gate_proj.weight": {160, 64}, "mlp.up_proj.weight": {160, 64},
			"mlp.down_proj.weight": {64, 160},
		} {
			want[p+name] = shape
		}
	}
	if len(h.Tensors) != len(want) {
		t.Errorf("%d tensors, want %d", len(h.Tensors), len(want))
	}
	for _, e := range h.Tensors {
		if s, ok := want[e.Name]; !ok || e.DType != "BF16" || !equalInts(e.Shape, s) {
			t.Errorf("%s: %s %v, want BF16 %v", e.Name, e.DType, e.Shape, s)
		}
	}
	tok, err := tokenizer.LoadHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 320 || tok.Specials().EOT != 317 {
		t.Errorf("vocab %d, end of text %d: want 320 and <|end_of_text|> (317)", tok.VocabSize(), tok.Specials().EOT)
	}
	var corpus []string // texts that exercise the pre-tokenizers
	b, err := os.ReadFile("tokenizer/testdata/hf/corpus.json")
	if err == nil {
		err = json.Unmarshal(b, &corpus)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range corpus {
		ids := tok.Encode(text)
		if back := tok.Decode(ids); back != text {
			t.Errorf("%.40q decodes to %.40q", text, back)
		}
	}
	if text := "The quick brown fox jumps over the lazy dog."; len(tok.Encode(text)) > len(text)*3/4 {
		t.Errorf("%q: %d ids for %d bytes: the merges learned on it do not apply", text, len(tok.Encode(text)), len(text))
	}
}
