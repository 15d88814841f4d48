package config

import (
	"strings"
	"testing"
)

// ZeroShards reads zero_group: all of dp, a number, or a node's
// data-parallel ranks; a node of one data-parallel rank has nothing to
// shard within it.
func TestZeroShards(t *testing.T) {
	for _, c := range []struct {
		group            string
		ntasks, tp, node int
		want             int
		err              string
	}{
		{"", 8, 1, 8, 8, ""},
		{"2", 8, 1, 8, 2, ""},
		{"node", 16, 2, 8, 4, ""}, // 8 dp ranks, 4 a node
		{"node", 8, 1, 16, 8, ""}, // one node holds them all
		{"node", 16, 8, 8, 0, "one data-parallel rank"},
		{"node", 12, 1, 8, 0, "do not divide"},
		{"3", 8, 1, 8, 0, "divides the data-parallel degree 8"},
	} {
		cfg := DefaultConfig()
		cfg.NTasks, cfg.TP, cfg.Zero, cfg.ZeroGroup = c.ntasks, c.tp, 1, c.group
		got, err := cfg.ZeroShards(c.node)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("zero_group %q, %d tasks tp %d, %d a node: err %v, want %q", c.group, c.ntasks, c.tp, c.node, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("zero_group %q, %d tasks tp %d, %d a node: %d (%v), want %d", c.group, c.ntasks, c.tp, c.node, got, err, c.want)
		}
	}
}
