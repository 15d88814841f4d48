package config

import (
	"math"
	"strings"
	"testing"
)

// Bad Llama shapes are refused with the rule.
func TestLlamaValidate(t *testing.T) {
	for _, tc := range []struct {
		change func(c *Config)
		want   string
	}{
		{func(c *Config) { c.TP, c.NTasks = 2, 2 }, "tp 2 with 9 query and 3 key/value heads: tp must divide the query heads and either divide the key/value heads or be a multiple of them (each key/value head then replicated over tp/kv ranks): tp 1, 3, 9 work; with ffn 1536 (tp must divide it too): tp 1, 3"},
		{func(c *Config) { c.KVHeads = 2 }, "heads 9 is not a multiple of kv_heads 2"},
		{func(c *Config) { c.RopeFactor = 8 }, "Llama 3's scaling wants"},
		{func(c *Config) { c.RopeLowFreq, c.RopeOriginalSeq = 1, 8192 }, "only with rope_factor"},
		{func(c *Config) { c.Model, c.KVHeads, c.FFN = "gpt", 3, 0 }, "are model llama's"},
		// --rope-theta inf and --norm-eps nan were taken, and a rank then
		// failed with "json: unsupported value: +Inf", naming no key.
		{func(c *Config) { c.RopeTheta = math.Inf(1) }, "rope_theta = +Inf: must be a finite number"},
		{func(c *Config) { c.NormEps = math.NaN() }, "norm_eps = NaN: must be a finite number"},
		{func(c *Config) { c.RopeFactor = math.NaN() }, "rope_factor = NaN: must be a finite number"},
		{func(c *Config) {
			c.RopeFactor, c.RopeLowFreq, c.RopeHighFreq, c.RopeOriginalSeq = 8, 1, math.Inf(1), 8192
		}, "rope_high_freq = +Inf"},
		{func(c *Config) { c.NormEps = 2 }, "norm_eps = 2: must be 1e-12 to 1 (0: 1e-05)"},
		{func(c *Config) { c.NormEps = 1e-300 }, "norm_eps = 1e-300: must be 1e-12 to 1"},
		{func(c *Config) { c.RopeTheta = 0.5 }, "rope_theta = 0.5: must be more than 1 (0: 10000)"},
	} {
		c := DefaultConfig()
		if err := c.ApplyPreset("smollm-135m"); err != nil {
			t.Fatal(err)
		}
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
	// tp a multiple of the kv heads: each replicated over tp/kv ranks.
	c := DefaultConfig()
	if err := c.ApplyPreset("smollm-135m"); err != nil {
		t.Fatal(err)
	}
	c.Heads, c.KVHeads, c.TP, c.NTasks = 8, 2, 8, 8
	if err := c.Validate(); err != nil {
		t.Errorf("heads 8, kv heads 2, tp 8: %v", err)
	}
}
