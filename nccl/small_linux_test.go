package nccl

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// phaseCount gives the phases each rank's shared-memory group ran since
// the last call (ranks run on goroutines of one process).
type phaseCount struct {
	mu   sync.Mutex
	last map[*shmGroup]uint32
}

func (p *phaseCount) since(g *shmGroup) uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = map[*shmGroup]uint32{}
	}
	d := g.phase - p.last[g]
	p.last[g] = g.phase
	return d
}

// One host: below smallShmBytes the all-reduce takes one shared-memory
// phase, from it two phases per slot (plus one); both fold in rank order.
func TestShmSmallAllReduce(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var count phaseCount
			check := func(c *tcpComm, elems int) error {
				phases := count.since(c.shm)
				want := uint32(2)
				if 4*elems < smallShmBytes {
					want = 1
				}
				if phases != want {
					return fmt.Errorf("%d shared-memory phases, want %d", phases, want)
				}
				return nil
			}
			exact := func(int) bool { return true }
			testSmallPaths(t, tcpWorld(BackendAuto), n, edgeSizes(n, smallShmBytes), exact, check)
		})
	}
}

// Two and three pretend hosts with several ranks each (odd counts): small
// buffers reduce to each host's first rank in one phase, the first ranks
// exchange, and each host broadcasts (between two hosts, from
// hierAddBytes, the other host's sum lands on each host instead). The
// one-phase bound differs between hosts of 2 and of 3 ranks.
func TestHierarchicalSmallAllReduce(t *testing.T) {
	for _, hosts := range [][]string{{"a", "a", "b", "b", "b"}, {"a", "a", "b", "b", "c", "c", "c"}} {
		t.Run(strings.Join(hosts, ""), func(t *testing.T) {
			testHostID = func(rank int) string { return hosts[rank] }
			t.Cleanup(func() { testHostID = nil })
			var count phaseCount
			check := func(c *tcpComm, elems int) error {
				if c.local == nil || c.local.shm == nil {
					return fmt.Errorf("no shared memory on the host")
				}
				phases := count.since(c.local.shm)
				slots := uint32((elems + slotElems - 1) / slotElems)
				want := 2*slots + 1 // all-reduce, then broadcast, by slot
				switch {
				case c.useHierAdd(elems):
					want = slots + 1 // all-reduce; the other host's sum lands without a phase
				case 4*elems*c.local.n < hierRootBytes:
					want = 2 // reduce to the first rank, broadcast
				case c.usePipeline(elems):
					want = uint32(len(hierChunks(elems, c.hosts, hierChunkElems)) + 2)
				}
				if phases != want {
					return fmt.Errorf("%d shared-memory phases on the host, want %d", phases, want)
				}
				return nil
			}
			exact := func(int) bool { return false } // host sums first
			sizes := edgeSizes(len(hosts), hierRootBytes/2, hierRootBytes/3, smallNetBytes)
			testSmallPaths(t, tcpWorld(BackendAuto), len(hosts), sizes, exact, check)
		})
	}
}
