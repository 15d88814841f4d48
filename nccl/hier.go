package nccl

import (
	"net"
)

// The hierarchical all-reduce of a large buffer, pipelined by chunk. The
// three phases (reduce on each host to its first rank, all-reduce between
// the hosts' first ranks, broadcast on each host) depend on each other
// for one element, not for the buffer: the buffer goes in chunks, and while
// the first ranks all-reduce chunk j (on a goroutine of each first rank)
// the host reduces chunk j+1 and broadcasts chunk j-1 in shared memory,
// in one phase (shmGroup.reduceBroadcast).
//
// Chunks do not change the sums' bits. On each host a chunk is reduced in
// rank order as the whole buffer is (reduceSlots). Between the hosts'
// first ranks each chunk takes the path the whole buffer takes, in the
// same order for every element: between two hosts the order does not
// matter (a+b is b+a, bit for bit), and the first ranks exchange each
// chunk whole, in one step (pairSpans); between three below starNetBytes
// the chunk goes through the first host (starSpans), folded in rank
// order; otherwise the ring sums each element in an order fixed by the
// segment it lies in (segment i from host i on), so a chunk is not a
// contiguous range of the buffer but the j-th part of every one of the
// hosts' ring segments (hierChunks): each element stays in the segment
// it has when the whole buffer goes around the ring, and the chunk goes
// around the ring with those parts as its segments. Only groups over two
// hosts pipeline (usePipeline says why), from hierPipeBytes on; a group
// with peers takes hierSplit from hierSplitBytes.

// hierChunkElems is the most elements of one chunk of the pipelined
// hierarchical all-reduce (one shared-memory slot holds a chunk). Measured
// on 2 hosts of 2 ranks (2 cores, best of 5, alternated) from 2 MiB to
// 32 MiB: chunks of 32 Ki elements took 1.2-1.3x the time of chunks of
// 64 Ki, chunks of about 128 Ki 0.98-1.2x.
const hierChunkElems = 64 << 10

// span is the range [lo, hi) of a buffer.
type span struct{ lo, hi int }

func spansLen(sp []span) int {
	n := 0
	for _, s := range sp {
		n += s.hi - s.lo
	}
	return n
}

// pack copies buf's spans one after the other into dst.
func pack(dst, buf []float32, sp []span) {
	off := 0
	for _, s := range sp {
		off += copy(dst[off:], buf[s.lo:s.hi])
	}
}

// unpack copies src, packed as pack leaves it, back into buf's spans.
func unpack(buf, src []float32, sp []span) {
	off := 0
	for _, s := range sp {
		off += copy(buf[s.lo:s.hi], src[off:])
	}
}

// hierChunks splits a buffer of n elements that hosts hosts reduce into
// chunks of at most about chunk elements: chunk j holds the j-th of k
// equal parts of each host's ring segment, in segment order.
func hierChunks(n, hosts, chunk int) [][]span {
	k := max(1, (n+chunk-1)/chunk)
	ch := make([][]span, k)
	for i := range hosts {
		lo, hi := segment(n, hosts, i)
		for j := range k {
			a, b := segment(hi-lo, k, j)
			ch[j] = append(ch[j], span{lo + a, lo + b})
		}
	}
	return ch
}

// hierPipeBytes is the smallest buffer that a group over two hosts
// all-reduces by hierPipelined (on hosts with peers, up to hierSplitBytes).
// Measured on 2 hosts of 2 ranks (2 cores, best of 6, alternated with the
// unpipelined path): 0.55-0.7x its speed at 512 KiB and 768 KiB (2 and 3
// chunks: the pipeline's two extra phases, and the first rank reducing
// alone, cost more than the overlap saves), the same at 1 MiB, 1.35x at
// 2 MiB, 1.2-1.25x at 3-32 MiB. Against the paths that took 1 MiB before
// it (2 cores, 6 runs each, alternated, bus bandwidth GB/s): between 2
// hosts of 2 ranks a median of 1.50 against hierSplit's 0.92 and hierAdd's
// 0.87, and in `hpcrun bench comm --repeat 3` (6 passes each) a ratio to
// Open MPI of 1.08-1.56 against hierSplit's 0.73-1.35; between hosts of 3
// ranks and 1, 1.35-1.61 against 0.83-0.84 (hierAdd on the host of 3).
// In the pipeline only the hosts' first ranks exchange, in hierSplit
// every rank does.
const hierPipeBytes = 1 << 20

// usePipeline says whether a group spread over hosts all-reduces count
// elements by hierPipelined: between two hosts, from hierPipeBytes on.
// Every rank of the group decides alike, on the buffer and constants, not
// on its own host (the range of hierSmall, which depends on the host's
// ranks, ends below it).
//
// Between three hosts the chunks were slower than the whole buffer (3
// hosts of 2 ranks, 2 cores, best of 3-4, alternated): with the ring
// between the first ranks, 0.9-1.1x at 1-4 MiB and 0.6-1.1x at 16 MiB
// (each chunk takes the ring's 2(n-1) dependent steps, where the whole
// buffer takes them once, streamed); with the star, 0.9x at 1 MiB and
// 16 MiB, the same at 4 MiB.
func (c *tcpComm) usePipeline(count int) bool {
	return c.local != nil && c.hosts == 2 && 4*count >= hierPipeBytes
}

// A pipelined buffer has two chunks or more, and lies beyond hierSmall's
// range with two ranks a host, the widest.
var (
	_ [hierPipeBytes - 2*4*hierChunkElems]struct{}
	_ [hierPipeBytes - hierRootBytes/2]struct{}
)

// hierPipelined is hierAllReduce in chunks of at most chunk elements (the
// file's comment). A host without shared memory (one rank, or no
// /dev/shm) reduces and broadcasts the whole buffer around the chunks.
func (c *tcpComm) hierPipelined(buf []float32, op Op, chunk int) error {
	inner := op.summing()
	chunks := hierChunks(len(buf), c.hosts, chunk)
	g := c.local.shm
	if g == nil {
		if err := c.local.AllReduce(buf, inner); err != nil {
			return err
		}
	}
	// The first rank all-reduces the chunks between the hosts on a
	// goroutine, in order, as the host reduces them; done gets one result
	// per chunk.
	var reduced chan int
	var done chan error
	if c.leaders != nil {
		reduced, done = make(chan int, len(chunks)), make(chan error, len(chunks))
		go func() {
			defer close(done)
			for j := range reduced {
				err := c.leadersReduce(buf, chunks[j], len(chunks), inner)
				done <- err
				if err != nil {
					return
				}
			}
		}()
	}
	// Phase j reduces chunk j on the host and broadcasts chunk j-2, whose
	// all-reduce between the hosts ran during phase j-1.
	err := func() error {
		for j := 0; j < len(chunks)+2; j++ {
			var red, bc []span
			if j < len(chunks) {
				red = chunks[j]
			}
			if j >= 2 {
				bc = chunks[j-2]
				if done != nil {
					if err := <-done; err != nil {
						return err
					}
				}
			}
			if g != nil {
				if err := g.reduceBroadcast(buf, red, bc, inner); err != nil {
					return err
				}
			}
			if red != nil && reduced != nil {
				reduced <- j
			}
		}
		return nil
	}()
	if reduced != nil {
		close(reduced)
		for range done { // the goroutine is done with buf
		}
	}
	if err != nil {
		return err
	}
	if g == nil {
		if err := c.local.Broadcast(buf, 0); err != nil {
			return err
		}
	}
	finish(buf, op, c.n)
	return nil
}

// leadersReduce all-reduces one chunk of k between the hosts' first ranks:
// between two, by pairSpans; between three, by starSpans below
// starNetBytes (the star's bits, which scatter's are too); otherwise the
// ring over the chunk's spans, host i's span as segment i. A buffer in
// one chunk goes as the whole buffer would (leaders.AllReduce).
func (c *tcpComm) leadersReduce(buf []float32, sp []span, k int, op Op) error {
	l := c.leaders
	if k == 1 {
		return l.AllReduce(buf, op)
	}
	if l.n == 2 {
		return l.pairSpans(buf, sp, op, header('R', op, spansLen(sp)))
	}
	if l.useStar(len(buf)) {
		return l.starSpans(buf, sp, op, header('R', op, spansLen(sp)))
	}
	seg := func(i int) (int, int) { return sp[i].lo, sp[i].hi }
	return l.ring(buf, seg, 0, true, true, op, header('R', op, spansLen(sp)))
}

// hierAdd is the all-reduce between two hosts of a buffer that fits one
// set of the host's shared-memory slots, without the broadcast: the host
// all-reduces in shared memory, the first ranks exchange their host sums
// (as pairSpans does) and land the other host's sum in shared memory,
// piece by piece, and every rank adds it to its own host sum as it lands.
// Every rank adds its host's sum and the other's, a+b on one host and b+a
// on the other: the same bits as the first ranks' exchange.
func (c *tcpComm) hierAdd(buf []float32, op Op) error {
	inner := op.summing()
	g := c.local.shm
	if err := g.allReduce(buf, inner); err != nil {
		return err
	}
	other, base := g.landing(len(buf))
	var err error
	if c.leaders != nil {
		err = c.leaders.pairLand(buf, other, header('R', inner, len(buf)), func(k int) { g.land(base + uint64(k)) })
		if err == nil {
			reduceInto(buf, other, inner)
		}
	} else {
		for k := 0; k < len(buf) && err == nil; {
			var got uint64
			if got, err = g.awaitLanded(base + uint64(k)); err == nil {
				e := int(got - base)
				reduceInto(buf[k:e], other[k:e], inner)
				k = e
			}
		}
	}
	if err != nil {
		return err
	}
	finish(buf, op, c.n)
	return nil
}

// landElems is the piece of the other host's sum that hierAdd's first
// rank lands at a time. Between 2 hosts of 2 ranks at 1 MiB (2 cores,
// best of 3-5, alternated): 1.2-1.5 GB/s in pieces of 16 Ki elements,
// 1.4-1.6 of 32 Ki, 1.4-1.55 of 64 Ki, 1.0-1.3 in one piece.
const landElems = 32 << 10

// pairLand is pairSpans for a group of 2 that reads the peer's buffer
// into dst, calling landed with the elements read after each piece,
// instead of adding it to buf: buf is on its way to the peer meanwhile.
func (c *tcpComm) pairLand(buf, dst []float32, hdr []byte, landed func(k int)) error {
	peer := 1 - c.rank
	write := func() error { return c.writeBufs(c.next, peer, net.Buffers{hdr, asBytes(buf)}) }
	var sent chan error
	var err error
	if 16+4*len(buf) <= c.inlineBytes() {
		err = write()
	} else {
		sent = writeAside(write)
	}
	got := make([]byte, 16)
	if err == nil {
		err = c.readSpin(c.prev, peer, got)
	}
	if err == nil {
		err = c.compareHeader(peer, got, hdr)
	}
	for k := 0; k < len(dst) && err == nil; k += landElems {
		e := min(k+landElems, len(dst))
		if err = c.readSpin(c.prev, peer, asBytes(dst[k:e])); err == nil {
			landed(e)
		}
	}
	if sent != nil {
		if serr := <-sent; err == nil {
			err = serr
		}
	}
	return err
}

// hierAddBytes is the smallest buffer that a group over two hosts
// all-reduces by hierAdd (below hierPipeBytes, within one set of the
// host's slots). Measured between 2 hosts of 2 ranks (2 cores, best of 3,
// alternated with hierSmall and hierAllReduce): 0.7-1.0x their bus
// bandwidth at 16 and 64 KiB, 1.15-1.3x at 256 KiB, 1.1-1.25x at 1 MiB
// (which now pipelines, hierPipeBytes).
// Below it the broadcast's phase costs less than the first ranks landing
// the other host's sum while the others wait.
const hierAddBytes = 256 << 10

// useHierAdd says whether a group spread over hosts all-reduces count
// elements by hierAdd: between two hosts whose ranks share memory, from
// hierAddBytes until the buffer outgrows a set of slots or pipelines
// (hierSplit starts above the pipeline, hierSplitBytes). The
// first ranks exchange as the other paths' first ranks do below
// hierPipeBytes (pairSpans: a header, then the buffer), so a host that
// decides otherwise (no shared memory, another number of ranks) still
// meets its peer.
// The exchange of a host that takes hierAdd meets pair on the other host
// only while every buffer hierAdd takes is below pairNetBytes.
var _ [pairNetBytes - hierPipeBytes]struct{}

func (c *tcpComm) useHierAdd(count int) bool {
	return c.hosts == 2 && c.local.shm != nil && 4*count >= hierAddBytes &&
		c.local.shm.holds(count) && !c.usePipeline(count)
}

// hierSplit is the all-reduce between hosts that hold equally many ranks,
// by parts, as Open MPI's default does it at these sizes (Rabenseifner's
// reduce-scatter and all-gather): the host all-reduces in shared memory
// (shmGroup.allReduce), and each rank, once it has reduced its segment of
// a chunk, all-reduces that segment with the ranks at its place on the
// other hosts (peers) before its host copies it out. Every rank of a host
// sends a part of the buffer and adds only that part, where hierAdd's
// and the pipeline's first rank sends all of it. The bits are theirs:
// each segment's host sum in rank order, then the host sums combined as
// the first ranks combine them (a+b between two hosts; between three in
// host order: through host i for the hosts' i-th ranks, starSpans, or
// from scatterBytes by thirds, scatter). At 2 ranks a host each whole
// chunk hands the peers 256 KiB, scatterBytes (shm_linux.go).
func (c *tcpComm) hierSplit(buf []float32, op Op) error {
	inner := op.summing()
	err := c.local.shm.allReduceOwn(buf, inner, func(seg []float32) error { return c.peers.AllReduce(seg, inner) })
	if err != nil {
		return err
	}
	finish(buf, op, c.n)
	return nil
}

// maxSplitHosts is the most hosts hierSplit serves (useHierSplit): a
// group over more makes no peers.
const maxSplitHosts = 3

// hierSplitBytes is the smallest buffer that a group over two hosts with
// peers all-reduces by hierSplit, in place of the pipeline. Measured with
// `hpcrun bench comm` between 2 hosts of 2 ranks (2 cores, 6 runs each,
// alternated, bus bandwidth GB/s, median and range): 1.52 (0.99-1.85)
// against the pipeline's 1.54 (1.17-1.79) at 2 MiB, 1.28 (0.94-1.74)
// against 1.13 (0.89-1.18) at 4 MiB; earlier (median and best of 10-43
// runs) 1.43 and 2.00 against 1.02 and 1.91 at 4 MiB, 1.28 and 2.01
// against 1.01 and 1.81 at 16 MiB (64 MiB, 3 runs: 1.41 against 1.01).
// At 1 MiB the pipeline is the faster (hierPipeBytes).
const hierSplitBytes = 2 << 20

// useHierSplit says whether a group spread over hosts all-reduces count
// elements by hierSplit: where it has peers, between two hosts from
// hierSplitBytes on, and between three from the end of hierSmall's range,
// to starNetBytes where the peers' parts take the star, on where they take
// scatter. Between 3 hosts of 2 ranks (2-19 runs) it had a median of
// 0.41 GB/s (best 0.87) against the first ranks' 0.40 (0.49) at 1 MiB, and a median
// ratio to Open MPI in the same run of 1.26 against 1.05. With its peers
// through a star it was slower than the first ranks' ring at 4, 16 and
// 64 MiB (0.43, 0.47 and 0.49 against 0.46, 0.53 and 0.63); with the
// peers' parts by scatter (256 KiB a whole chunk's) it took 0.62-0.72,
// 0.56-0.69 and 0.68-0.72 against the ring's 0.37, 0.41-0.52 and
// 0.46-0.55 (2 runs each, alternated).
//
// The ranges were measured at 2 ranks a host; at more, they are the same
// byte counts (and hierSmall's end) unmeasured.
var _ [hierSplitBytes - hierPipeBytes]struct{}

func (c *tcpComm) useHierSplit(count int) bool {
	switch {
	case c.peers == nil:
		return false
	case c.hosts == 2:
		return 4*count >= hierSplitBytes
	case c.hosts == 3:
		return !c.useHierSmall(count) && (4*count < starNetBytes || splitPartBytes(c.local.n) >= scatterBytes)
	}
	return false
}
