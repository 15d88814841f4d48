package nccl

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// float64Reduce is the all-reduce of rankData in float64, rounded once.
func float64Reduce(seed uint64, ranks, n int, op Op) []float32 {
	acc := make([]float64, n)
	for r := range ranks {
		for i, v := range rankData(seed, r, n) {
			switch {
			case op == Max && (r == 0 || float64(v) > acc[i]):
				acc[i] = float64(v)
			case op != Max:
				acc[i] += float64(v)
			}
		}
	}
	out := make([]float32, n)
	for i, v := range acc {
		if op == Avg {
			v /= float64(ranks)
		}
		out[i] = float32(v)
	}
	return out
}

// The chunks of the pipelined hierarchical all-reduce cover the buffer
// once, each element inside the ring segment it has in the whole buffer.
func TestHierChunks(t *testing.T) {
	for _, c := range []struct{ n, hosts, chunk int }{{1, 2, 4}, {3, 3, 2}, {10, 3, 4}, {1001, 3, 97}, {65537, 2, 4096}} {
		seen := make([]int, c.n)
		for _, sp := range hierChunks(c.n, c.hosts, c.chunk) {
			if len(sp) != c.hosts {
				t.Fatalf("%+v: %d spans in a chunk, want one per host", c, len(sp))
			}
			if l := spansLen(sp); l > c.chunk+c.hosts {
				t.Fatalf("%+v: chunk of %d elements", c, l)
			}
			for i, s := range sp {
				lo, hi := segment(c.n, c.hosts, i)
				if s.lo < lo || s.hi > hi {
					t.Fatalf("%+v: span %v outside ring segment %d [%d,%d)", c, s, i, lo, hi)
				}
				for e := s.lo; e < s.hi; e++ {
					seen[e]++
				}
			}
		}
		for e, k := range seen {
			if k != 1 {
				t.Fatalf("%+v: element %d in %d chunks", c, e, k)
			}
		}
	}
}

// Two and three pretend hosts (and uneven ones, one of a single rank): the
// pipelined all-reduce gives the bits of the sequential one (reduce on the
// host, the first ranks' all-reduce of the whole buffer, broadcast) at
// odd sizes around the chunk, wherever the dispatch pipelines (two hosts,
// or from smallNetBytes between more), and is within float32 error of a
// float64 reduction everywhere.
func TestHierPipelinedMatchesSequential(t *testing.T) {
	const chunk = 1000
	sizes := []int{1, 3, chunk - 1, chunk, chunk + 1, 2*chunk + 1, 7919, smallNetBytes/4 + 1, smallNetBytes/4 + chunk + 7, starNetBytes/4 + 3}
	for _, hosts := range shortCases([][]string{{"a", "a", "b", "b"}, {"a", "a", "a", "b"}, {"a", "a", "b", "b", "c", "c"}, {"a", "a", "a", "b", "b", "c"}}) {
		t.Run(strings.Join(hosts, ""), func(t *testing.T) {
			testHostID = func(rank int) string { return hosts[rank] }
			t.Cleanup(func() { testHostID = nil })
			n := len(hosts)
			var bits sameBits
			err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
				tc := c.(*tcpComm)
				for i, size := range sizes {
					for _, op := range []Op{Sum, Avg, Max} {
						seed := uint64(11000 + 10*i + int(op))
						seq := rankData(seed, c.Rank(), size)
						if err := tc.hierAllReduce(seq, op); err != nil {
							return err
						}
						pip := rankData(seed, c.Rank(), size)
						ch := chunk
						if size > 100*chunk {
							ch = size / 15 // 16 chunks
						}
						if err := tc.hierPipelined(pip, op, ch); err != nil {
							return err
						}
						what := fmt.Sprintf("%v of %d", op, size)
						if err := closeTo(pip, seq, n, true); err != nil {
							return fmt.Errorf("pipelined %s against sequential: %w", what, err)
						}
						if err := closeTo(pip, float64Reduce(seed, n, size, op), n, op == Max); err != nil {
							return fmt.Errorf("pipelined %s against float64: %w", what, err)
						}
						if err := bits.check(what, pip); err != nil {
							return err
						}
					}
				}
				if tc.hosts != 2 || tc.peers != nil {
					return c.Barrier()
				}
				// The dispatch pipelines from hierPipeBytes between two
				// hosts of unequal ranks, on the same bits.
				size := hierPipeBytes/4 + 5
				seq := rankData(11999, c.Rank(), size)
				if err := tc.hierAllReduce(seq, Sum); err != nil {
					return err
				}
				pip := rankData(11999, c.Rank(), size)
				var count phaseCount
				if g := tc.local.shm; g != nil { // none on a host of one rank
					count.since(g)
				}
				if err := c.AllReduce(pip, Sum); err != nil {
					return err
				}
				if g := tc.local.shm; g != nil {
					if got, want := count.since(g), len(hierChunks(size, 2, hierChunkElems))+2; int(got) != want {
						return fmt.Errorf("AllReduce of %d: %d shared-memory phases, want %d (pipelined)", size, got, want)
					}
				}
				if err := closeTo(pip, seq, n, true); err != nil {
					return fmt.Errorf("AllReduce of %d against sequential: %w", size, err)
				}
				return c.Barrier()
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// hostOrderReduce is the all-reduce of rankData in float32, in the
// hierarchical order: each host's ranks in rank order, then the host sums
// in the order ranks first name the hosts.
func hostOrderReduce(seed uint64, hosts []string, n int, op Op) []float32 {
	var order []string
	sums := map[string][]float32{}
	for r, h := range hosts {
		v := rankData(seed, r, n)
		if s, ok := sums[h]; ok {
			reduceInto(s, v, op)
			continue
		}
		order = append(order, h)
		sums[h] = v
	}
	out := sums[order[0]]
	for _, h := range order[1:] {
		reduceInto(out, sums[h], op)
	}
	finish(out, op, len(hosts))
	return out
}

// checkHostOrder checks got, this rank's all-reduce by op of rankData
// under seed over the pretend hosts: it holds the bits of the host-order
// float32 reduction and of the sequential hierarchical path, the same on
// every rank (bits).
func checkHostOrder(tc *tcpComm, got []float32, seed uint64, hosts []string, op Op, what string, bits *sameBits) error {
	n, size := len(hosts), len(got)
	if err := closeTo(got, hostOrderReduce(seed, hosts, size, op), n, true); err != nil {
		return fmt.Errorf("%s against host order: %w", what, err)
	}
	seq := rankData(seed, tc.Rank(), size)
	if err := tc.hierAllReduce(seq, op); err != nil {
		return err
	}
	if err := closeTo(got, seq, n, true); err != nil {
		return fmt.Errorf("%s against sequential: %w", what, err)
	}
	return bits.check(what, got)
}

// Two pretend hosts of two and three ranks: AllReduce takes hierAdd for a
// buffer beyond hierSmall's range and below hierSplit's, and gives
// every rank the bits of the host-order float32 sum and of the sequential
// path, at odd sizes.
func TestHierAdd(t *testing.T) {
	for _, hosts := range shortCases([][]string{{"a", "a", "b", "b"}, {"a", "a", "a", "b", "b", "b"}}) {
		t.Run(strings.Join(hosts, ""), func(t *testing.T) {
			testHostID = func(rank int) string { return hosts[rank] }
			t.Cleanup(func() { testHostID = nil })
			n := len(hosts)
			sizes := []int{hierAddBytes/4 + 1, hierAddBytes/4 + 2*landElems + 7, hierPipeBytes/4 - 1}
			var bits sameBits
			err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
				tc := c.(*tcpComm)
				for i, size := range sizes {
					for _, op := range []Op{Sum, Avg, Max} {
						seed := uint64(13000 + 10*i + int(op))
						got := rankData(seed, c.Rank(), size)
						before := tc.local.shm.landed
						if err := c.AllReduce(got, op); err != nil {
							return err
						}
						what := fmt.Sprintf("%v of %d", op, size)
						if tc.local.shm.landed-before != uint64(size) {
							return fmt.Errorf("%s: not by hierAdd", what)
						}
						if err := closeTo(got, float64Reduce(seed, n, size, op), n, op == Max); err != nil {
							return fmt.Errorf("%s against float64: %w", what, err)
						}
						if err := checkHostOrder(tc, got, seed, hosts, op, what, &bits); err != nil {
							return err
						}
					}
				}
				return c.Barrier()
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Two pretend hosts of two and three ranks, whose sets of slots hold 2
// and 3 x slotElems: hierAdd would end at a different size on each, but
// both pipeline from hierPipeBytes, the end of the smaller set. On either
// side of it their first ranks meet, every rank with the bits of the
// host-order sum.
func TestHierAddUnequalHosts(t *testing.T) {
	hosts := []string{"a", "a", "b", "b", "b"}
	testHostID = func(rank int) string { return hosts[rank] }
	t.Cleanup(func() { testHostID = nil })
	n := len(hosts)
	sizes := []int{hierPipeBytes/4 - 1, hierPipeBytes / 4, 3*slotElems - 1, 3 * slotElems}
	var bits sameBits
	err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
		for i, size := range sizes {
			for _, op := range []Op{Sum, Avg, Max} {
				seed := uint64(14000 + 10*i + int(op))
				got := rankData(seed, c.Rank(), size)
				if err := c.AllReduce(got, op); err != nil {
					return err
				}
				what := fmt.Sprintf("%v of %d", op, size)
				if err := closeTo(got, hostOrderReduce(seed, hosts, size, op), n, true); err != nil {
					return fmt.Errorf("%s against host order: %w", what, err)
				}
				if err := bits.check(what, got); err != nil {
					return err
				}
			}
		}
		return c.Barrier()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Pretend hosts of equally many ranks (two and three hosts): hierSplit
// gives every rank the bits of the host-order float32 sum and of the
// sequential path, at odd sizes and over several chunks.
func TestHierSplit(t *testing.T) {
	for _, hosts := range shortCases([][]string{{"a", "a", "b", "b"}, {"a", "a", "a", "b", "b", "b"}, {"a", "a", "b", "b", "c", "c"}}) {
		t.Run(strings.Join(hosts, ""), func(t *testing.T) {
			testHostID = func(rank int) string { return hosts[rank] }
			t.Cleanup(func() { testHostID = nil })
			n := len(hosts)
			sizes := []int{1, 7, slotElems - 1, slotElems + 3, 2*slotElems + 5, 5*slotElems + 1}
			var bits sameBits
			err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
				tc := c.(*tcpComm)
				if tc.peers == nil {
					return errors.New("no peers communicator")
				}
				for i, size := range sizes {
					for _, op := range []Op{Sum, Avg, Max} {
						seed := uint64(15000 + 10*i + int(op))
						got := rankData(seed, c.Rank(), size)
						if err := tc.hierSplit(got, op); err != nil {
							return err
						}
						if err := checkHostOrder(tc, got, seed, hosts, op, fmt.Sprintf("%v of %d", op, size), &bits); err != nil {
							return err
						}
					}
				}
				// The dispatch takes hierSplit at this size: one phase a
				// slot's chunk and one more, and nothing landed (hierAdd).
				split := hierRootBytes/4 + 5
				if tc.hosts == 2 {
					split = hierSplitBytes/4 + 5
				}
				seq := rankData(15999, c.Rank(), split)
				if err := tc.hierSplit(seq, Sum); err != nil {
					return err
				}
				got := rankData(15999, c.Rank(), split)
				g := tc.local.shm
				var count phaseCount
				count.since(g)
				landed := g.landed
				if err := c.AllReduce(got, Sum); err != nil {
					return err
				}
				phases, want := count.since(g), (split+slotElems-1)/slotElems+1
				if int(phases) != want || g.landed != landed {
					return fmt.Errorf("AllReduce of %d: %d shared-memory phases, want %d, and %d landed (not hierSplit)", split, phases, want, g.landed-landed)
				}
				if err := closeTo(got, seq, n, true); err != nil {
					return fmt.Errorf("AllReduce of %d against hierSplit: %w", split, err)
				}
				return c.Barrier()
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Two pretend hosts of two ranks, one without shared memory: no rank has
// peers (the hosts would not meet in hierSplit), and every rank gets the
// same bits where the other host takes hierSplit's range.
func TestHierSplitNeedsEveryHostsMemory(t *testing.T) {
	hosts := []string{"a", "a", "b", "b"}
	testHostID = func(rank int) string { return hosts[rank] }
	testNoShm = func(rank int) bool { return hosts[rank] == "b" }
	t.Cleanup(func() { testHostID, testNoShm = nil, nil })
	n := len(hosts)
	var bits sameBits
	err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
		if c.(*tcpComm).peers != nil {
			return errors.New("peers made with a host without shared memory")
		}
		for i, size := range []int{hierSplitBytes/4 + 3, hierPipeBytes/4 + 5} {
			seed := uint64(16000 + i)
			got := rankData(seed, c.Rank(), size)
			if err := c.AllReduce(got, Sum); err != nil {
				return err
			}
			what := fmt.Sprintf("sum of %d", size)
			if err := closeTo(got, float64Reduce(seed, n, size, Sum), n, false); err != nil {
				return fmt.Errorf("%s against float64: %w", what, err)
			}
			if err := bits.check(what, got); err != nil {
				return err
			}
		}
		return c.Barrier()
	})
	if err != nil {
		t.Fatal(err)
	}
}
