package config

import (
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/parallel"
)

// TestRecomputeMode: the engine's mode for each accepted value, and the
// one-line refusal of any other and of arch hf.
func TestRecomputeMode(t *testing.T) {
	for v, want := range map[string]parallel.Recompute{"": parallel.RecomputeNone, "none": parallel.RecomputeNone, "selective": parallel.RecomputeSelective, "full": parallel.RecomputeFull} {
		c := DefaultConfig()
		c.Recompute = v
		if err := c.Validate(); err != nil {
			t.Errorf("recompute %q: %v", v, err)
		}
		if got := c.RecomputeMode(); got != want {
			t.Errorf("recompute %q: mode %d, want %d", v, got, want)
		}
	}
	c := DefaultConfig()
	c.Recompute = "some"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "use none, selective or full") {
		t.Errorf("recompute some: %v", err)
	}
	c.Model, c.Arch, c.Recompute = "bert", "hf", "full"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "arch hf") {
		t.Errorf("recompute full, arch hf: %v", err)
	}
}
