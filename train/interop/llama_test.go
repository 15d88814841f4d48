package interop

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Llama config.json hpcrun cannot run as written is refused with a
// one-line error that names the key.
func TestLlamaConfigRefused(t *testing.T) {
	base := `"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 128, "vocab_size": 320`
	for _, tc := range []struct{ extra, want string }{
		{``, ""},
		{`, "rope_scaling": {"rope_type": "linear", "factor": 2}`, `rope_scaling of type "linear"`},
		{`, "attention_bias": true`, "no biases"},
		{`, "hidden_act": "gelu"`, `hidden_act "gelu"`},
		{`, "head_dim": 32`, "head_dim 32"},
		{`, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 32}`, "low_freq_factor < high_freq_factor"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, HFConfig), []byte("{"+base+tc.extra+"}"), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := ReadHFConfig(dir)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("plain config: %v", err)
		case tc.want == "" && (s.Model != "llama" || s.KVHeads != 2 || s.FFN != 160 || s.RopeTheta != 10000 || !s.UntiedHead):
			t.Errorf("plain config: %+v", s)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.extra, err, tc.want)
		}
	}
}
