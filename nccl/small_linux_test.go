package nccl

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
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
	for _, hosts := range shortCases([][]string{{"a", "a", "b", "b", "b"}, {"a", "a", "b", "b", "c", "c", "c"}}) {
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

// Three pretend hosts of equal ranks (2 and 3 a host): small buffers take
// the helped star, whose bits are the star's (hierSmall without help), and
// the root's host-mate sends the third host its result on a link; larger
// ones, hierSplit, whose stars (one for each rank of a host, on parts
// below scatterBytes) go through a different host each.
func TestHierSmallHelped(t *testing.T) {
	for _, hosts := range shortCases([][]string{{"a", "a", "b", "b", "c", "c"}, {"a", "a", "a", "b", "b", "b", "c", "c", "c"}}) {
		t.Run(strings.Join(hosts, ""), func(t *testing.T) {
			testHostID = func(rank int) string { return hosts[rank] }
			t.Cleanup(func() { testHostID = nil })
			n, per := len(hosts), len(hosts)/3
			helper, third := 1, 2*per
			var bits sameBits
			err := tcpWorld(BackendAuto)(t, n, func(c Comm) error {
				tc := c.(*tcpComm)
				if !tc.helped {
					return fmt.Errorf("no helped star between 3 hosts of %d ranks", per)
				}
				want := -1
				switch c.Rank() {
				case helper:
					want = third
				case third:
					want = helper
				}
				if tc.helpPeer != want {
					return fmt.Errorf("helpPeer %d, want %d", tc.helpPeer, want)
				}
				// hierSplit's stars go through a different host each.
				if i := c.Rank() % per; tc.peers == nil || tc.peers.starRoot != i%3 {
					return fmt.Errorf("the peers' star root is not host %d", i%3)
				}
				for i, size := range edgeSizes(n, hierRootBytes/per) {
					for _, op := range []Op{Sum, Avg, Max} {
						what := fmt.Sprintf("AllReduce %v of %d", op, size)
						seed := uint64(12000 + 10*i + int(op))
						buf := rankData(seed, c.Rank(), size)
						if err := c.AllReduce(buf, op); err != nil {
							return fmt.Errorf("%s: %w", what, err)
						}
						if err := closeTo(buf, serialReduce(seed, n, size, op), n, op == Max); err != nil {
							return fmt.Errorf("%s: %w", what, err)
						}
						if err := bits.check(fmt.Sprint("helped", seed), buf); err != nil {
							return err
						}
						star := rankData(seed, c.Rank(), size)
						tc.helped = false
						err := c.AllReduce(star, op)
						tc.helped = true
						if err != nil {
							return fmt.Errorf("%s without help: %w", what, err)
						}
						if err := closeTo(buf, star, n, true); err != nil {
							return fmt.Errorf("%s against the star: %w", what, err)
						}
					}
				}
				if want >= 0 {
					tc.linkMu.Lock()
					_, ok := tc.links[linkKey{want, c.Rank() == helper, kindExchange}]
					tc.linkMu.Unlock()
					if !ok {
						return fmt.Errorf("no link with group rank %d", want)
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

// A host whose ranks call a larger all-reduce than the others runs
// hierSplit while they run the helped star: its first rank's scatter
// sends the root and the third host's first rank a header where the
// helped star expects the buffer or nothing, and
// every rank fails with the mismatch after the grace (a quarter of the
// timeout), not the timeout.
func TestHierSmallHelpedMismatch(t *testing.T) {
	hosts := []string{"a", "a", "b", "b", "c", "c"}
	testHostID = func(rank int) string { return hosts[rank] }
	t.Cleanup(func() { testHostID = nil })
	start := time.Now()
	err := tcpWorld(BackendAuto)(t, len(hosts), func(c Comm) error {
		err := c.Barrier() // a rank still in it may see the mismatch there
		size := 10
		if hosts[c.Rank()] == "b" {
			size = starNetBytes/4 + 10
		}
		if err == nil {
			err = c.AllReduce(make([]float32, size), Sum)
		}
		if err == nil || !strings.Contains(err.Error(), "called") {
			return fmt.Errorf("AllReduce of %d against the others': %v, want a mismatch error", size, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second/4+3*time.Second { // tcpWorld's timeout is 10 s
		t.Fatalf("mismatch noticed after %v", d)
	}
}

// What comes on the stray connection while the awaited message is on its
// way (a peer that finished the collective and began the next) is left
// for the next collective; the message is read.
func TestReadSpinWatchLeavesTheNextCollective(t *testing.T) {
	next := header('R', Sum, 99)
	err := tcpWorld(BackendTCP)(t, 2, func(c Comm) error {
		tc := c.(*tcpComm)
		hdr := header('R', Sum, 4)
		if c.Rank() == 0 {
			if err := tc.write(tc.next, 1, next); err != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond)
			w, err := tc.link(1, true, kindExchange)
			if err != nil {
				return err
			}
			return tc.writeSpans(w, 1, []float32{1, 2, 3, 4}, []span{{0, 4}}, hdr)
		}
		r, err := tc.link(0, false, kindExchange)
		if err != nil {
			return err
		}
		msg := make([]float32, 8)
		if err := tc.readSpinWatch(r, 0, asBytes(msg), hdr, &stray{c: tc, conn: tc.prev, peer: 0, want: hdr}); err != nil {
			return err
		}
		if fmt.Sprint(msg[4:]) != "[1 2 3 4]" {
			return fmt.Errorf("read %v, want [1 2 3 4]", msg[4:])
		}
		return tc.checkHeaderSpin(tc.prev, 0, next)
	})
	if err != nil {
		t.Fatal(err)
	}
}
