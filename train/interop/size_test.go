package interop

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Sizes in a config.json or an llm.c header are bounded before anything
// is allocated for them: each absurd one is a one-line error naming the key,
// and opening costs the test next to no memory (before, each allocated
// until the process died, or panicked in makeslice).
func TestHugeShapesRefusedBeforeAllocating(t *testing.T) {
	hfDir := func(cfg string) func(t *testing.T) string {
		return func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, HFConfig), []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			return dir
		}
	}
	llmc := func(layers, channels, vocab int32) func(t *testing.T) string {
		return func(t *testing.T) string {
			hdr := make([]byte, llmcHeader)
			for i, v := range []int32{llmcMagic, 3, 1024, vocab, layers, 12, channels, vocab} {
				binary.LittleEndian.PutUint32(hdr[4*i:], uint32(v))
			}
			p := filepath.Join(t.TempDir(), "m.bin")
			if err := os.WriteFile(p, hdr, 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) string
		want  string
	}{
		{"n_layer 10**12", hfDir(`{"model_type":"gpt2","n_embd":768,"n_layer":1000000000000,"n_head":12,"n_positions":1024,"vocab_size":50257}`), "n_layer = 1000000000000: more than"},
		{"n_embd 2**62", hfDir(`{"model_type":"gpt2","n_embd":4611686018427387904,"n_layer":2,"n_head":1,"n_positions":1024,"vocab_size":50257}`), "n_embd = 4611686018427387904: more than"},
		{"vocab_size 2**40", hfDir(`{"model_type":"gpt2","n_embd":768,"n_layer":2,"n_head":12,"n_positions":1024,"vocab_size":1099511627776}`), "vocab_size = 1099511627776: more than"},
		{"1.7e12 parameters", hfDir(`{"model_type":"gpt2","n_embd":131072,"n_layer":4096,"n_head":16,"n_positions":1024,"vocab_size":50257}`), "parameters, more than"},
		{"bert num_hidden_layers", hfDir(`{"model_type":"bert","hidden_size":768,"num_hidden_layers":1000000000,"num_attention_heads":12,"max_position_embeddings":512,"vocab_size":30522,"type_vocab_size":2,"intermediate_size":3072}`), "num_hidden_layers = 1000000000: more than"},
		{"llm.c layers 2**31-1", llmc(1<<31-1, 768, 50257), "header num_layers = 2147483647: more than"},
		{"llm.c channels 3*2**29", llmc(12, 3<<29, 50257), "header channels = 1610612736: more than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := c.setup(t)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Open(path)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Open: %v, want one line with %q", err, c.want)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("Open allocated %d MB before refusing", grew>>20)
			}
		})
	}
}
