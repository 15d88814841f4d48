package config

import (
	"slices"
	"strings"
	"testing"
)

func TestFields(t *testing.T) {
	keys := Keys()
	for _, k := range []string{"ntasks", "tp", "grad_accum", "lr", "sp", "seed", "preset"} {
		if !slices.Contains(keys, k) {
			t.Errorf("Keys lacks %q: %v", k, keys)
		}
	}
	c := DefaultConfig()
	for _, set := range []struct {
		key string
		v   any
	}{{"grad_accum", 4}, {"lr", 0.5}, {"sp", true}, {"model", "gpt"}, {"seed", int64(9)}} {
		if err := c.Set(set.key, set.v); err != nil {
			t.Fatalf("Set(%s, %v): %v", set.key, set.v, err)
		}
	}
	if c.GradAccum != 4 || c.LR != 0.5 || !c.SP || c.Model != "gpt" || c.Seed != 9 {
		t.Errorf("after Set: %+v", c)
	}
	if err := c.Set("tp", "2"); err != nil || c.TP != 2 {
		t.Errorf("tp as text: %v, tp %d", err, c.TP)
	}
	if err := c.Set("tp", "x"); err == nil || !strings.Contains(err.Error(), `tp "x"`) {
		t.Errorf("tp x: %v", err)
	}
	if err := c.Set("tp", 2.5); err == nil || !strings.Contains(err.Error(), "tp is an option of type int, not float64") {
		t.Errorf("a float for tp: %v", err)
	}
	if err := c.Set("nosuch", 1); err == nil {
		t.Error("an unknown key set")
	}
	s := c.Strings()
	if s["grad_accum"] != "4" || s["lr"] != "0.5" || s["model"] != "gpt" {
		t.Errorf("Strings: %v", s)
	}
}
