package nccl

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// edgeSizes are the element counts that hit the small paths' edges for
// thresholds of limits bytes: one element, counts that do not divide among
// n ranks, the last count below each threshold and the first at it.
func edgeSizes(n int, limits ...int) []int {
	s := []int{1, 2, n + 1, 2*n - 1, 1001}
	for _, l := range limits {
		last := (l+3)/4 - 1 // the last count c with 4c < l
		s = append(s, last-1, last, last+1, last+n+2)
	}
	return s
}

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

// pathCheck says, after an all-reduce of count elements, whether it took the
// path it should have; err describes the path taken otherwise.
type pathCheck func(c *tcpComm, count int) error

// testSmallPaths all-reduces the edge sizes with every op on a world of n
// ranks and compares each result with the serial fold in rank order
// (exactly where the path reduces in rank order), checks that every rank
// got the same bits, and asks check whether the expected path ran.
func testSmallPaths(t *testing.T, run world, n int, sizes []int, exact func(count int) bool, check pathCheck) {
	var bits sameBits
	err := run(t, n, func(c Comm) error {
		tc := c.(*tcpComm)
		for i, size := range sizes {
			for _, op := range []Op{Sum, Avg, Max} {
				seed := uint64(7000 + 10*i + int(op))
				buf := rankData(seed, c.Rank(), size)
				if err := c.AllReduce(buf, op); err != nil {
					return fmt.Errorf("AllReduce %v of %d: %w", op, size, err)
				}
				if err := closeTo(buf, serialReduce(seed, n, size, op), n, exact(size) || op == Max); err != nil {
					return fmt.Errorf("AllReduce %v of %d: %w", op, size, err)
				}
				if err := bits.check(fmt.Sprint("small", seed), buf); err != nil {
					return err
				}
				if err := check(tc, size); err != nil {
					return fmt.Errorf("AllReduce %v of %d: %w", op, size, err)
				}
			}
		}
		return c.Barrier()
	})
	if err != nil {
		t.Fatal(err)
	}
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

// Between hosts (here the TCP backend on one host): below smallNetBytes
// the ranks exchange their buffers directly and fold them in rank order,
// from it the ring runs.
func TestTCPExchangeAllReduce(t *testing.T) {
	for _, n := range []int{2, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			check := func(c *tcpComm, count int) error {
				if n == 2 {
					return nil // the exchange runs on the ring's connections
				}
				c.linkMu.Lock()
				links := len(c.links)
				c.linkMu.Unlock()
				if small := 4*count < smallNetBytes; small && links != 2*(n-2) {
					return fmt.Errorf("%d exchange links after a direct exchange, want %d", links, 2*(n-2))
				}
				return nil
			}
			exact := func(count int) bool { return 4*count < smallNetBytes }
			testSmallPaths(t, tcpWorld(BackendTCP), n, edgeSizes(n, smallNetBytes), exact, check)
		})
	}
}

// Two and three pretend hosts with several ranks each (odd counts): small
// buffers reduce to each host's first rank in one phase, the first ranks
// exchange, and each host broadcasts. The one-phase bound differs between
// hosts of 2 and of 3 ranks.
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
				want := uint32(3) // all-reduce, then broadcast
				if 4*elems*c.local.n < hierRootBytes {
					want = 2 // reduce to the first rank, broadcast
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

// A rank below the exchange threshold and one above it run different
// paths; the ring's header tells them apart at once, not after a timeout.
func TestExchangeAgainstRingIsAnError(t *testing.T) {
	start := time.Now()
	err := tcpWorld(BackendTCP)(t, 3, func(c Comm) error {
		if err := c.Barrier(); err != nil {
			return err
		}
		size := 10
		if c.Rank() == 1 {
			size = smallNetBytes/4 + 10
		}
		err := c.AllReduce(make([]float32, size), Sum)
		if err == nil || !strings.Contains(err.Error(), "elements") {
			return fmt.Errorf("AllReduce of %d against a peer's of 10: %v, want a length error", size, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("mismatch noticed after %v", d)
	}
}
