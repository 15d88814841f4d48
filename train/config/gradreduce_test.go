package config

import (
	"strings"
	"testing"
)

// TestGradReduce: fp32 and bf16 are accepted (bf16 at precision bf16,
// with or without ZeRO), anything else refused with one line that says
// what to change.
func TestGradReduce(t *testing.T) {
	for _, c := range []struct {
		value, precision string
		zero             int
		err              string
	}{
		{"", "fp32", 0, ""}, {"fp32", "bf16", 1, ""}, {"bf16", "bf16", 0, ""},
		{"fp16", "bf16", 0, "use fp32 or bf16"},
		{"bf16", "fp32", 0, "--precision bf16"},
		{"bf16", "bf16", 1, ""}, {"bf16", "bf16", 3, ""},
	} {
		cfg := DefaultConfig()
		cfg.GradReduce, cfg.Precision, cfg.Zero, cfg.NTasks = c.value, c.precision, c.zero, 2
		err := cfg.Validate()
		switch {
		case c.err == "" && err != nil:
			t.Errorf("grad_reduce %q at %s, zero %d: %v", c.value, c.precision, c.zero, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n")):
			t.Errorf("grad_reduce %q at %s, zero %d: %v, want one line saying %q", c.value, c.precision, c.zero, err, c.err)
		}
		if got := cfg.GradReduceBF16(); got != (c.value == "bf16") {
			t.Errorf("grad_reduce %q: GradReduceBF16 %v", c.value, got)
		}
	}
}
