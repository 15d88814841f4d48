package nccl

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// world runs fn on every rank of an n-rank world of one backend.
type world func(t *testing.T, n int, fn func(c Comm) error) error

// rankData is rank r's input for case seed: reproducible by every rank and
// by the serial reference.
func rankData(seed uint64, r, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(r)))
	out := make([]float32, n)
	for i := range out {
		out[i] = rng.Float32()*2 - 1
	}
	return out
}

// opData is rankData for op: for the packed bfloat16 ops each word holds
// two bfloat16 values in [-1,1) (the rounded halves of two draws).
func opData(seed uint64, r, n int, op Op) []float32 {
	out := rankData(seed, r, n)
	if !op.packed() {
		return out
	}
	hi := rankData(seed^0x5bf16, r, n)
	for i := range out {
		out[i] = packBF16(out[i], hi[i])
	}
	return out
}

var refCache sync.Map

// serialReduce reduces the inputs of ranks 0..n-1 in rank order.
func serialReduce(seed uint64, ranks, n int, op Op) []float32 {
	key := fmt.Sprint(seed, ranks, n, op)
	if v, ok := refCache.Load(key); ok {
		return v.([]float32)
	}
	acc := opData(seed, 0, n, op)
	for r := 1; r < ranks; r++ {
		reduceInto(acc, opData(seed, r, n, op), op)
	}
	finish(acc, op, ranks)
	refCache.Store(key, acc)
	return acc
}

// close reports whether got matches want within float32 reassociation

// shortCases is the cases an exhaustive multi-rank test walks: all of them,
// or under -short (make test's race-detector pass, whose full run walked
// them all without it) the last, the widest, and the first too when there
// are more than two: the paths still run under the detector, in less time.
func shortCases[T any](all []T) []T {
	switch {
	case !testing.Short() || len(all) <= 1:
		return all
	case len(all) == 2:
		return all[1:]
	}
	return []T{all[0], all[len(all)-1]}
}

// error for a sum over ranks terms of magnitude <= 1.
func closeTo(got, want []float32, ranks int, exact bool) error {
	return closeToOp(got, want, ranks, exact, Sum)
}

// closeToOp is closeTo for op's elements: for the packed bfloat16 ops
// each half of a word, within a bfloat16 rounding a term (2^-8 of a
// partial sum of at most ranks) for a backend that reassociates.
func closeToOp(got, want []float32, ranks int, exact bool, op Op) error {
	if len(got) != len(want) {
		return fmt.Errorf("length %d, want %d", len(got), len(want))
	}
	if op.packed() {
		tol := float32(ranks*ranks) / 256
		for i := range got {
			g0, g1 := bf16Pair(got[i])
			w0, w1 := bf16Pair(want[i])
			for _, d := range []float32{g0 - w0, g1 - w1} {
				if exact && got[i] != want[i] || !exact && (d > tol || d < -tol || d != d) {
					return fmt.Errorf("element %d = bf16 (%v, %v), want (%v, %v)", i, g0, g1, w0, w1)
				}
			}
		}
		return nil
	}
	tol := float32(ranks) * 4e-7 * float32(ranks)
	for i := range got {
		d := got[i] - want[i]
		if exact && got[i] != want[i] || !exact && (d > tol || d < -tol || math.IsNaN(float64(got[i]))) {
			return fmt.Errorf("element %d = %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

// sameBits checks that every rank produced the same bits.
type sameBits struct {
	mu   sync.Mutex
	seen map[string][]float32
}

func (s *sameBits) check(key string, v []float32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string][]float32{}
	}
	prev, ok := s.seen[key]
	if !ok {
		s.seen[key] = append([]float32(nil), v...)
		return nil
	}
	for i := range prev {
		if math.Float32bits(prev[i]) != math.Float32bits(v[i]) {
			return fmt.Errorf("%s: element %d differs between ranks: %v vs %v", key, i, prev[i], v[i])
		}
	}
	return nil
}

var testSizes = []int{0, 1, 2, 3, 7, 1000, 4097, 30001}

// testOps are the reductions testCollectives checks: under -short (make
// test's race-detector pass) without the packed bfloat16 sum, whose
// transports' paths are Sum's (only the fold's arithmetic differs) and
// which the full pass checks on every backend.
func testOps() []Op {
	if testing.Short() {
		return []Op{Sum, Avg, Max}
	}
	return []Op{Sum, Avg, Max, SumBF16}
}

// testCollectives checks every collective against the serial reference.
// exact says the backend reduces in rank order (bit-equal to the serial
// reference).
func testCollectives(t *testing.T, run world, n int, exact bool) {
	var bits sameBits
	err := run(t, n, func(c Comm) error {
		r := c.Rank()
		if c.Size() != n {
			return fmt.Errorf("Size() = %d, want %d", c.Size(), n)
		}
		for si, size := range testSizes {
			for _, op := range testOps() {
				seed := uint64(si*10 + int(op))
				buf := opData(seed, r, size, op)
				if err := c.AllReduce(buf, op); err != nil {
					return fmt.Errorf("AllReduce %v size %d: %w", op, size, err)
				}
				if err := closeToOp(buf, serialReduce(seed, n, size, op), n, exact || op == Max, op); err != nil {
					return fmt.Errorf("AllReduce %v size %d: %w", op, size, err)
				}
				if err := bits.check(fmt.Sprint("ar", seed), buf); err != nil {
					return err
				}

				block := size / 3
				send := opData(seed+1000, r, block*n, op)
				recv := make([]float32, block)
				if err := c.ReduceScatter(send, recv, op); err != nil {
					return fmt.Errorf("ReduceScatter %v block %d: %w", op, block, err)
				}
				want := serialReduce(seed+1000, n, block*n, op)[r*block : (r+1)*block]
				if err := closeToOp(recv, want, n, exact || op == Max, op); err != nil {
					return fmt.Errorf("ReduceScatter %v block %d: %w", op, block, err)
				}
			}
			seed := uint64(si*10 + 7)
			send := rankData(seed, r, size)
			recv := make([]float32, size*n)
			if err := c.AllGather(send, recv); err != nil {
				return fmt.Errorf("AllGather size %d: %w", size, err)
			}
			for q := range n {
				if err := closeTo(recv[q*size:(q+1)*size], rankData(seed, q, size), n, true); err != nil {
					return fmt.Errorf("AllGather size %d block %d: %w", size, q, err)
				}
			}
			root := si % n
			buf := rankData(seed+5, r, size)
			if err := c.Broadcast(buf, root); err != nil {
				return fmt.Errorf("Broadcast size %d root %d: %w", size, root, err)
			}
			if err := closeTo(buf, rankData(seed+5, root, size), n, true); err != nil {
				return fmt.Errorf("Broadcast size %d root %d: %w", size, root, err)
			}
			if err := c.Barrier(); err != nil {
				return fmt.Errorf("Barrier: %w", err)
			}
		}
		// Send/Recv around the ring, then back.
		for _, size := range []int{0, 5, 70001} {
			next, prev := (r+1)%n, (r+n-1)%n
			if n == 1 {
				break
			}
			send := rankData(99, r, size)
			recv := make([]float32, size)
			errc := make(chan error, 1)
			go func() { errc <- c.Send(send, next) }()
			if err := c.Recv(recv, prev); err != nil {
				return fmt.Errorf("Recv size %d from %d: %w", size, prev, err)
			}
			if err := <-errc; err != nil {
				return fmt.Errorf("Send size %d to %d: %w", size, next, err)
			}
			if err := closeTo(recv, rankData(99, prev, size), n, true); err != nil {
				return fmt.Errorf("Recv size %d from %d: %w", size, prev, err)
			}
		}
		st := c.Stats()
		if want := int64(len(testOps()) * len(testSizes)); st.AllReduce.Calls != want {
			return fmt.Errorf("Stats().AllReduce.Calls = %d, want %d", st.AllReduce.Calls, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testGroups runs TP-like groups (consecutive ranks) and DP-like groups
// (strided) at the same time, each checked against its own reference.
func testGroups(t *testing.T, run world, n, tp int, exact bool) {
	err := run(t, n, func(c Comm) error {
		r := c.Rank()
		dp := n / tp
		tpRanks := make([]int, tp)
		for i := range tpRanks {
			tpRanks[i] = r/tp*tp + i
		}
		dpRanks := make([]int, dp)
		for i := range dpRanks {
			dpRanks[i] = r%tp + i*tp
		}
		tpc, err := c.Group(tpRanks)
		if err != nil {
			return err
		}
		defer tpc.Close()
		dpc, err := c.Group(dpRanks)
		if err != nil {
			return err
		}
		defer dpc.Close()
		if tpc.Rank() != r%tp || dpc.Rank() != r/tp {
			return fmt.Errorf("group ranks tp %d dp %d, want %d %d", tpc.Rank(), dpc.Rank(), r%tp, r/tp)
		}
		for step := range 3 {
			size := 5000 + 17*step
			// Seeds differ per group so a cross-talk bug shows.
			tseed := uint64(1000*step + r/tp)
			buf := rankData(tseed, tpc.Rank(), size)
			if err := tpc.AllReduce(buf, Sum); err != nil {
				return fmt.Errorf("tp AllReduce: %w", err)
			}
			if err := closeTo(buf, serialReduce(tseed, tp, size, Sum), tp, exact); err != nil {
				return fmt.Errorf("tp group %v step %d: %w", tpRanks, step, err)
			}
			dseed := uint64(500000 + 1000*step + r%tp)
			buf = rankData(dseed, dpc.Rank(), size)
			if err := dpc.AllReduce(buf, Avg); err != nil {
				return fmt.Errorf("dp AllReduce: %w", err)
			}
			if err := closeTo(buf, serialReduce(dseed, dp, size, Avg), dp, exact); err != nil {
				return fmt.Errorf("dp group %v step %d: %w", dpRanks, step, err)
			}
		}
		// A group of a group: the first rank of each TP group.
		if tp > 1 && n/tp > 1 && r%tp == 0 && dpc.Rank() < 2 {
			lead, err := dpc.Group([]int{0, 1})
			if err != nil {
				return err
			}
			defer lead.Close()
			buf := []float32{float32(r)}
			if err := lead.AllReduce(buf, Max); err != nil {
				return fmt.Errorf("group of group: %w", err)
			}
			if buf[0] != float32(tp) {
				return fmt.Errorf("group of group max = %v, want %d", buf[0], tp)
			}
		}
		return c.Barrier()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func inProcessWorld(t *testing.T, n int, fn func(c Comm) error) error {
	return RunInProcess(n, fn)
}

func TestInProcessCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testCollectives(t, inProcessWorld, n, true) })
	}
}

func TestInProcessGroups(t *testing.T) {
	for _, c := range []struct{ n, tp int }{{4, 2}, {8, 2}, {8, 4}, {6, 3}} {
		t.Run(fmt.Sprint(c.n, "x", c.tp), func(t *testing.T) { testGroups(t, inProcessWorld, c.n, c.tp, true) })
	}
}

func TestInProcessPeerExit(t *testing.T) {
	boom := errors.New("boom")
	err := RunInProcess(3, func(c Comm) error {
		if c.Rank() == 1 {
			return boom
		}
		return c.AllReduce(make([]float32, 10), Sum)
	})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("err = %v, want a *PeerError naming rank 1", err)
	}
}

func TestInProcessBadArgs(t *testing.T) {
	err := RunInProcess(2, func(c Comm) error {
		if err := c.AllGather(make([]float32, 3), make([]float32, 5)); err == nil {
			return errors.New("AllGather with a short recv succeeded")
		}
		if _, err := c.Group([]int{0, 0}); err == nil {
			return errors.New("Group with a repeated rank succeeded")
		}
		if err := c.AllReduce(make([]float32, 3), Op(9)); err == nil {
			return errors.New("AllReduce with an unknown op succeeded")
		}
		// Mismatched lengths: every rank gets an error, none hangs.
		if err := c.AllReduce(make([]float32, 3+c.Rank()), Sum); err == nil {
			return errors.New("AllReduce with mismatched lengths succeeded")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSegment(t *testing.T) {
	for n := range 30 {
		for k := 1; k < 9; k++ {
			prev := 0
			for i := range k {
				lo, hi := segment(n, k, i)
				if lo != prev || hi < lo {
					t.Fatalf("segment(%d,%d,%d) = %d,%d after %d", n, k, i, lo, hi, prev)
				}
				prev = hi
			}
			if prev != n {
				t.Fatalf("segments of %d in %d end at %d", n, k, prev)
			}
		}
	}
}

func TestReduceSlotsMatchesSerialFold(t *testing.T) {
	for k := 1; k <= 9; k++ {
		for _, op := range []Op{Sum, Max} {
			srcs := make([][]float32, k)
			for r := range srcs {
				srcs[r] = rankData(uint64(k), r, 37)
			}
			want := append([]float32(nil), srcs[0]...)
			for _, s := range srcs[1:] {
				reduceInto(want, s, op)
			}
			got := make([]float32, 37)
			reduceSlots(got, srcs, op)
			if err := closeTo(got, want, k, true); err != nil {
				t.Fatalf("%d sources, %v: %v", k, op, err)
			}
		}
	}
}

// bf16Nearest rounds f to bfloat16 by arithmetic on its value (the nearer
// of the two neighbours, ties to the even one), not by the bit trick.
func bf16Nearest(f float32) float32 {
	u := math.Float32bits(f)
	lo := math.Float32frombits(u & 0xffff0000)
	if lo == f || math.IsInf(float64(f), 0) || f != f {
		return lo
	}
	ulp := math.Ldexp(1, max(int(u>>23&0xff), 1)-127-7)
	away := math.Copysign(math.Abs(float64(lo))+ulp, float64(f))
	dl, da := math.Abs(float64(f)-float64(lo)), math.Abs(away-float64(f))
	if dl < da || dl == da && (u>>16)&1 == 0 {
		return lo
	}
	return float32(away)
}

// TestPackedBF16Reduction: the packed bfloat16 sum adds each half of a
// word in float32 and rounds it to nearest even: against bf16Nearest, on
// random pairs and on ties.
func TestPackedBF16Reduction(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		a0, a1, b0, b1 := bf16Nearest(r.Float32()*8-4), bf16Nearest(r.Float32()*2-1), bf16Nearest(r.Float32()*8-4), bf16Nearest(r.Float32()*1e-3)
		if i%5 == 0 { // a tie: 1 + half an ulp of 1
			a0, b0 = 1, 1.0/256
		}
		dst := []float32{packBF16(a0, a1)}
		reduceInto(dst, []float32{packBF16(b0, b1)}, SumBF16)
		g0, g1 := bf16Pair(dst[0])
		if w0, w1 := bf16Nearest(a0+b0), bf16Nearest(a1+b1); g0 != w0 || g1 != w1 {
			t.Fatalf("(%v,%v) + (%v,%v) = (%v,%v), want (%v,%v)", a0, a1, b0, b1, g0, g1, w0, w1)
		}
	}
}
