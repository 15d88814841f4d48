package plan

import (
	"math"
	"strings"
	"testing"
)

// TestClusterCollectives checks the collectives' arithmetic on the
// SuperPOD: a ring inside a node at NVLink's achieved rate, a
// data-parallel all-reduce across nodes bound by a GPU's share of the
// adapters, the tree cheaper than the ring for a small tensor on many
// nodes, and the scatter/gather send of 1/tp across nodes.
func TestClusterCollectives(t *testing.T) {
	c, err := LookupCluster("dgx-a100-superpod")
	if err != nil {
		t.Fatal(err)
	}
	const mb = 1e6
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got/want-1) > 1e-9 {
			t.Errorf("%s: %.6g s, want %.6g", what, got, want)
		}
	}
	nv, nic := 300e9*linkEfficiency, 8*25e9*linkEfficiency/8
	near("all-reduce of 100 MB over tp 8", c.AllReduce(100*mb, Path{Ranks: 8, PerNode: 8}), 2*7.0/8*100*mb/nv+14*5e-6)
	// dp 4 across 4 nodes, one rank a node: the network's ring.
	ring := 2*3.0/4*100*mb/nic + 6*10e-6
	tree := 2*3.0/4*100*mb/nic + 2*2*10e-6
	near("all-reduce of 100 MB over dp 4 across nodes", c.AllReduce(100*mb, Path{Ranks: 4, PerNode: 1}), min(ring, tree))
	// dp 64 over 8 nodes, 8 ranks a node: NVLink and the adapters
	// pipelined, the slower sets the time.
	got := c.AllReduce(800*mb, Path{Ranks: 64, PerNode: 8})
	bw := math.Max(2*7.0/8*800*mb/nv, 2*7.0/8*800*mb/8/nic)
	near("all-reduce over 8 nodes of 8", got, bw+2*3*10e-6+2*7*5e-6)
	small := c.AllReduce(4, Path{Ranks: 512, PerNode: 1})
	if ringSmall := 2 * 511 * 10e-6; small >= ringSmall {
		t.Errorf("a 4-byte all-reduce over 512 nodes: %.3g s, the ring's latency alone %.3g: the tree should win", small, ringSmall)
	}
	near("send across nodes, tp 8", c.Send(80*mb, true, 8), 10*mb/nic+10e-6+c.AllGather(80*mb, 8))
	near("send inside a node", c.Send(80*mb, false, 8), 80*mb/nv+5e-6)
	if _, err := LookupCluster("selene-2"); err == nil || !strings.Contains(err.Error(), "dgx-a100-superpod") {
		t.Errorf("an unknown cluster: %v", err)
	}
}
