package config

import (
	"math"
	"strings"
	"testing"
)

// TestScheduleShapes: after warm-up, constant stays at lr, linear and cosine
// end at min_lr (lr/10 when unset), linear is halfway at the middle.
func TestScheduleShapes(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LR, cfg.Warmup = 1, 2
	total := 12
	for _, c := range []struct {
		schedule string
		minLR    float64
		mid, end float64
	}{
		{"constant", 0, 1, 1},
		{"linear", 0, 0.55, 0.1},
		{"linear", 0.2, 0.6, 0.2},
		{"cosine", 0, 0.55, 0.1},
		{"", 0.3, 0.65, 0.3},
	} {
		cfg.Schedule, cfg.MinLR = c.schedule, c.minLR
		if got := ScheduleLR(cfg, 0, total); got != 0.5 {
			t.Errorf("%s: warm-up step 0 lr %g, want 0.5", c.schedule, got)
		}
		// steps 2..11 decay: progress (step-2)/9; the middle is 6.5.
		mid := (ScheduleLR(cfg, 6, total) + ScheduleLR(cfg, 7, total)) / 2
		if c.schedule == "linear" || c.schedule == "constant" {
			if math.Abs(mid-c.mid) > 1e-12 {
				t.Errorf("%s min %g: middle lr %g, want %g", c.schedule, c.minLR, mid, c.mid)
			}
		}
		if got := ScheduleLR(cfg, total-1, total); math.Abs(got-c.end) > 1e-12 {
			t.Errorf("%s min %g: last lr %g, want %g", c.schedule, c.minLR, got, c.end)
		}
	}
}

// TestConfigRejectsOptimizerValues: one error per bad optimizer, schedule
// or positions value.
func TestConfigRejectsOptimizerValues(t *testing.T) {
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.AdamBeta2 = 1 }, "adam_beta2 = 1"},
		{func(c *Config) { c.AdamBeta1 = -0.1 }, "adam_beta1 = -0.1"},
		{func(c *Config) { c.AdamEps = -1 }, "adam_eps = -1"},
		{func(c *Config) { c.MinLR = -1 }, "min_lr = -1"},
		{func(c *Config) { c.Schedule = "step" }, `schedule "step"`},
		{func(c *Config) { c.Positions = 16 }, "seq 32 is longer than the 16 positions"},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error with %q", err, c.want)
		}
	}
	cfg := DefaultConfig()
	if _, b2, _ := cfg.Adam(); b2 != 0.999 {
		t.Errorf("bert's default beta2 %g, want 0.999", b2)
	}
	cfg.Model = "gpt"
	if _, b2, _ := cfg.Adam(); b2 != 0.95 {
		t.Errorf("gpt's default beta2 %g, want 0.95", b2)
	}
}

func TestLRAt(t *testing.T) {
	const lr = 1e-3
	tests := []struct {
		step, total, warmup int
		want                float64
	}{
		{0, 100, 10, 1e-4},
		{9, 100, 10, lr},
		{10, 100, 10, lr},
		{99, 100, 10, 0.1 * lr},
		{5, 10, 0, 0.1*lr + 0.9*lr*0.5*(1+math.Cos(math.Pi*5/9))},
	}
	for _, tt := range tests {
		if got := LRAt(tt.step, tt.total, tt.warmup, lr, 0.1); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("LRAt(%d,%d,%d) = %g, want %g", tt.step, tt.total, tt.warmup, got, tt.want)
		}
	}
}
