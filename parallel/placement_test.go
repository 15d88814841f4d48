package parallel

import (
	"strings"
	"testing"
)

func TestPlacement(t *testing.T) {
	for _, c := range []struct {
		nodes, perNode, ntasks, tp, pp int
		want, errHas                   string
	}{
		{nodes: 1, perNode: 4, ntasks: 4, tp: 2, pp: 1, want: "placement: 1 node x 4 tasks; tp groups of 2 and dp groups of 2 inside the node"},
		{nodes: 1, perNode: 1, ntasks: 1, tp: 1, pp: 0, want: "placement: 1 node x 1 task; tp groups of 1 and dp groups of 1 inside the node"},
		{nodes: 2, perNode: 4, ntasks: 8, tp: 4, pp: 1, want: "placement: 2 nodes x 4 tasks; tp groups of 4 inside a node, dp groups of 2 across nodes (1 per node)"},
		{nodes: 2, perNode: 4, ntasks: 8, tp: 2, pp: 2, want: "placement: 2 nodes x 4 tasks; tp groups of 2 inside a node, dp groups of 2 inside a node; 2 pipeline stages of 4 consecutive ranks, pp groups of 2 across nodes"},
		{nodes: 1, perNode: 8, ntasks: 8, tp: 2, pp: 2, want: "; 2 pipeline stages of 4 consecutive ranks, pp groups of 2 inside a node"},
		{nodes: 2, perNode: 3, ntasks: 6, tp: 2, pp: 1, errHas: "tp 2 does not divide the 3 tasks of a node"},
	} {
		got, err := Placement(c.nodes, c.perNode, c.ntasks, c.tp, c.pp)
		if c.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%+v: %q, %v; want an error with %q", c, got, err, c.errHas)
			}
			continue
		}
		if err != nil || !strings.HasSuffix(got, c.want) {
			t.Errorf("%+v: %q, %v; want %q", c, got, err, c.want)
		}
	}
}
