package interop

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// FuzzHFSpec: no config.json panics the reader of a Hugging Face model's
// shape; a shape it accepts has positive sizes.
func FuzzHFSpec(f *testing.F) {
	f.Add([]byte(`{"model_type":"gpt2","n_layer":2,"n_head":2,"n_embd":8,"n_positions":16,"vocab_size":50257}`))
	f.Add([]byte(`{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"hidden_size":16,"intermediate_size":32,"max_position_embeddings":64,"vocab_size":256,"rope_theta":1e308,"rms_norm_eps":-1}`))
	f.Add([]byte(`{"model_type":"bert","num_hidden_layers":-1,"hidden_size":0}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		spec, err := hfSpec("config.json", b)
		if err != nil {
			return
		}
		if spec.Layers <= 0 || spec.Dim <= 0 || spec.Heads <= 0 || spec.Vocab <= 0 {
			t.Fatalf("accepted a shape that is not one: %+v", spec)
		}
	})
}

// FuzzLLMCHeader: no llm.c checkpoint header, whatever its sizes, panics
// the reader or makes it allocate what the file does not hold.
func FuzzLLMCHeader(f *testing.F) {
	hdr := func(vals ...int32) []byte {
		b := make([]byte, llmcHeader)
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		return b
	}
	f.Add(hdr(llmcMagic, 3, 16, 64, 1, 2, 8, 64))
	f.Add(hdr(llmcMagic, 5, 1<<30, 1<<30, 1<<30, 1, 1<<30, 1))
	f.Add(hdr(llmcMagic, 3, -1, 0, 0, 0, 0, 0))
	f.Add([]byte("short"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		path := filepath.Join(dir, "m.bin")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := openLLMC(path)
		if err != nil {
			return
		}
		w.Close()
	})
}
