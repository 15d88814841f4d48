package nccl

import (
	"fmt"
	"strings"
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

// Between hosts (here the TCP backend on one host): below smallNetBytes
// (pairNetBytes for 2 ranks) the ranks exchange their buffers directly
// (3 ranks: through rank 0 below scatterBytes, by thirds from it to
// starNetBytes) and fold them in rank order, from it the ring runs.
func TestTCPExchangeAllReduce(t *testing.T) {
	for _, n := range shortCases([]int{2, 3, 5}) {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			limit := smallNetBytes
			switch n {
			case 2:
				limit = pairNetBytes
			case 3:
				limit = starNetBytes
			}
			check := func(c *tcpComm, count int) error {
				if n == 2 {
					return nil // the exchange runs on the ring's connections
				}
				c.linkMu.Lock()
				links := len(c.links)
				c.linkMu.Unlock()
				want := 2 * (n - 2) // all but the ring's two
				switch {
				case n == 3 && 4*count >= scatterBytes:
					// Scatter (links of the star's before it): every
					// rank to its ring predecessor and from its successor.
					want = 2
				case n == 3:
					// The star: rank 0 to rank 2 and from rank 1,
					// the others to rank 0 or from it.
					want = map[bool]int{true: 2, false: 1}[c.rank == 0]
				}
				if small := 4*count < limit; small && links != want {
					return fmt.Errorf("%d exchange links after a direct exchange, want %d", links, want)
				}
				return nil
			}
			exact := func(count int) bool { return 4*count < limit }
			sizes := edgeSizes(n, limit)
			if n == 3 { // the star's range, then scatter's
				sizes = edgeSizes(n, scatterBytes, limit)
			}
			testSmallPaths(t, tcpWorld(BackendTCP), n, sizes, exact, check)
		})
	}
}

// Messages larger than the sockets' buffers hold are written on a
// goroutine while the caller reads (here every message: the buffer is
// said to be tiny); results are the same.
func TestExchangeWritesOnAGoroutine(t *testing.T) {
	const n = 3
	err := tcpWorld(BackendTCP)(t, n, func(c Comm) error {
		c.(*tcpComm).sndbuf = 4
		for i, size := range []int{1, 1000, smallNetBytes/4 - 1} {
			seed := uint64(9000 + i)
			buf := rankData(seed, c.Rank(), size)
			if err := c.AllReduce(buf, Avg); err != nil {
				return err
			}
			if err := closeTo(buf, serialReduce(seed, n, size, Avg), n, true); err != nil {
				return fmt.Errorf("AllReduce of %d: %w", size, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A rank below the exchange threshold and one above it run different
// paths; the ring's header tells them apart at once, not after a timeout.
func TestExchangeAgainstRingIsAnError(t *testing.T) {
	start := time.Now()
	err := tcpWorld(BackendTCP)(t, 3, func(c Comm) error {
		err := c.Barrier() // a rank still in it may see the mismatch there
		size := 10
		if c.Rank() == 1 {
			size = smallNetBytes/4 + 10
		}
		if err == nil {
			err = c.AllReduce(make([]float32, size), Sum)
		}
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
