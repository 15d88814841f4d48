package nccl

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// Small buffers take latency paths: below a size the number of times a
// rank waits for its peers costs more than the bytes it moves.
//
//   - One host (shared memory): one phase instead of two. Every rank copies
//     its whole buffer into its slot and reduces all slots itself
//     (shmGroup.reduceOnePhase), instead of reducing one segment, waiting,
//     and copying the others' segments out.
//   - Between hosts (TCP, no shared memory): a direct exchange instead of
//     the ring (below 256 KiB; 2 MiB for a group of 2). Every rank sends its buffer to every other and reduces the
//     n buffers in rank order: one message time instead of the ring's
//     2(n-1) dependent steps, for n-1 times the buffer sent instead of
//     2(n-1)/n times. A group of 3 goes through one rank instead (star,
//     below 4 MiB): two message times, but 4 messages instead of 6; from
//     256 KiB each of the 3 folds a third (scatter, scatter.go). A
//     group of 2 adds what it reads to its buffer in place (pairSpans).
//   - A group spread over hosts with several ranks on a host
//     (hierarchical): the host's ranks reduce to their first rank in one
//     phase, the first ranks exchange, and the result is broadcast on each
//     host (two phases and one message time, instead of three phases and
//     the leaders' ring). Between two hosts, from hierAddBytes, the
//     broadcast goes too (hierAdd, hier.go). Between three hosts of equal
//     ranks, the star's root and its host's second rank send the result
//     out together (hierSmallHelped).
//
// The thresholds were measured with `hpcrun bench comm` on the development
// machine (2 cores; 4 ranks on one host; 2 and 3 hosts as network
// namespaces of the local Slurm), each the size where the two paths cross.
const (
	// smallShmBytes: below it a one-host group all-reduces in one phase.
	// At 4 ranks the two paths cross between 8 and 16 KiB: every rank
	// reads 4 slots, 4 ranks on 2 cores.
	smallShmBytes = 16 << 10
	// smallNetBytes: below it a group without shared memory exchanges
	// directly. On 2 and 3 hosts the exchange had 1.5-2x the ring's
	// bandwidth at 4..128 KiB, the same at 256 KiB, 0.6-0.7x at 512 KiB
	// and above.
	smallNetBytes = 256 << 10
	// pairNetBytes replaces smallNetBytes for a group of 2: the exchange
	// then sends what the ring sends, in one step instead of two. With
	// the exchange written before it reads and polled (below), between 2
	// hosts it had 1.4-1.8x the ring's bandwidth at 256 KiB and 1 MiB,
	// 0.8x at 4 MiB. Between 3 hosts it had no such gain at 1 MiB.
	pairNetBytes = 2 << 20
	// starNetBytes replaces smallNetBytes for a group of 3, which goes
	// through one rank instead of exchanging (star; from scatterBytes
	// by thirds, scatter). Between 3 hosts
	// (3 hosts of 2 ranks) the star had 1.6-1.9x the ring's bandwidth at
	// 256 KiB, 1.05-1.2x at 512 KiB to 2 MiB, the same at 4 MiB.
	starNetBytes = 4 << 20
	// hierRootBytes bounds what the host's first rank reads in the
	// hierarchical path's one-phase reduce (its host's ranks times the
	// buffer): with 2 ranks a host, buffers below 512 KiB (the most a
	// slot holds). The one-phase path was as fast or faster at every size
	// measured below 256 KiB; at 512 KiB it took 0.7x the time of the
	// two-phase one between 2 hosts of 2 ranks and 0.93x between 3, the
	// same at 256 KiB (2 cores, best of 6-8, alternated).
	hierRootBytes = 1 << 20
)

// maxExchange bounds the groups that exchange directly: each rank holds a
// link to every other, and sends n-1 messages a call.
const maxExchange = 8

// kindExchange is the connection kind of the direct exchange's links.
const kindExchange byte = 2

// useExchange says whether a group without shared memory all-reduces
// count elements by direct exchange.
func (c *tcpComm) useExchange(count int) bool {
	if c.n == 2 {
		return 4*count < pairNetBytes
	}
	return c.n <= maxExchange && 4*count < smallNetBytes
}

// exchange all-reduces buf by direct exchange. Each rank sends the
// collective's header and its buffer to every other rank: to its ring
// successor on the ring connection (so that a rank that called another
// collective reads a header it can compare, as on the ring) and to the
// others on links of their own, made on first use. It then reduces the n
// buffers in rank order, so every rank gets the same bits.
func (c *tcpComm) exchange(buf []float32, op Op, hdr []byte) error {
	n, me := c.n, c.rank
	next, prev := (me+1)%n, (me+n-1)%n
	out, in := make([]net.Conn, n), make([]net.Conn, n)
	for i := 1; i < n; i++ { // dial every link before waiting for any
		p := (me + i) % n
		if p == next {
			out[p] = c.next
			continue
		}
		var err error
		if out[p], err = c.link(p, true, kindExchange); err != nil {
			return err
		}
	}
	for i := 1; i < n; i++ {
		p := (me + n - i) % n
		if p == prev {
			in[p] = c.prev
			continue
		}
		var err error
		if in[p], err = c.link(p, false, kindExchange); err != nil {
			return err
		}
	}
	m := len(buf)
	all := c.buffer(n * m)
	copy(all[me*m:], buf)
	sendAll := func() error {
		for i := 1; i < n; i++ {
			p := (me + i) % n
			if err := c.writeBufs(out[p], p, net.Buffers{hdr, asBytes(all[me*m : (me+1)*m])}); err != nil {
				return err
			}
		}
		return nil
	}
	// Messages that fit the sockets' buffers are written first; larger
	// ones on a goroutine while this one reads, so that no two ranks
	// block on writes to each other.
	var sent chan error
	var err error
	if 16+4*m <= c.inlineBytes() {
		err = sendAll()
	} else {
		sent = writeAside(sendAll)
	}
	got := make([]byte, 16)
	for i := 1; i < n && err == nil; i++ {
		p := (me + n - i) % n
		if err = c.readSpin(in[p], p, got); err == nil {
			if err = c.compareHeader(p, got, hdr); err == nil {
				err = c.readSpin(in[p], p, asBytes(all[p*m:(p+1)*m]))
			}
		}
	}
	if sent != nil {
		if serr := <-sent; err == nil {
			err = serr
		}
	}
	if err != nil {
		return err
	}
	srcs := make([][]float32, n)
	for r := range srcs {
		srcs[r] = all[r*m : (r+1)*m]
	}
	reduceSlots(buf, srcs, op)
	finish(buf, op, n)
	return nil
}

// useHierSmall says whether a group spread over hosts takes hierSmall for
// count elements: its host's ranks share memory and its first rank reads
// less than hierRootBytes.
func (c *tcpComm) useHierSmall(count int) bool {
	return c.local != nil && c.local.shm != nil && 4*count*c.local.n < hierRootBytes
}

// pair is the all-reduce of a group of 2 below pairNetBytes (pairSpans).
func (c *tcpComm) pair(buf []float32, op Op) error {
	if err := c.pairSpans(buf, []span{{0, len(buf)}}, op, header('R', op, len(buf))); err != nil {
		return err
	}
	finish(buf, op, 2)
	return nil
}

// useStar says whether a group without shared memory all-reduces count
// elements through one rank (c.starRoot), where scatter does not
// (AllReduce asks useScatter first; leadersReduce's chunks take it).
func (c *tcpComm) useStar(count int) bool {
	return c.n == 3 && 4*count < starNetBytes
}

// inlineBytes is the largest exchange message written before reading: a
// link holds at most two (a rank can be one call ahead of a peer that has
// not read its last one yet), and two fit in half the socket's send
// buffer as the kernel reports it (it counts its own overhead in the
// other half). Writing on the caller's goroutine instead of handing the
// writes to another saved a quarter of the time at 64 KiB between 2 hosts.
func (c *tcpComm) inlineBytes() int {
	if c.sndbuf == 0 {
		c.sndbuf = directBytes * 4 // 2 of 32 KiB, as the ring's direct sender assumes
		if sc, ok := c.next.(syscall.Conn); ok {
			if raw, err := sc.SyscallConn(); err == nil {
				raw.Control(func(fd uintptr) {
					if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF); err == nil && v > 0 {
						c.sndbuf = v
					}
				})
			}
		}
	}
	return c.sndbuf / 4
}

// hierSmall is hierAllReduce for a small buffer on hosts whose ranks share
// memory: reduce to the host's first rank in one phase, all-reduce between
// the first ranks (exchanged directly when small), and broadcast on each
// host; between three hosts of equal ranks, hierSmallHelped.
func (c *tcpComm) hierSmall(buf []float32, op Op) error {
	if c.helped {
		return c.hierSmallHelped(buf, op)
	}
	inner := op.summing()
	if err := c.local.shm.reduceOnePhase(buf, inner, false); err != nil {
		return err
	}
	if c.leaders != nil {
		if err := c.leaders.AllReduce(buf, inner); err != nil {
			return err
		}
	}
	if err := c.local.shm.broadcast(buf, 0); err != nil {
		return err
	}
	finish(buf, op, c.n)
	return nil
}

// hierSmallHelped is hierSmall between three hosts that hold equally many
// of the group's ranks, two or more, all sharing memory (c.helped). The
// first ranks take the star, but the root's result goes out twice at
// once: the root sends it to the second host while its host's second
// rank (the helper), handed it by the host's broadcast, sends it to the
// third, so no rank writes twice. The third host's first rank reads from
// the helper and watches the first ranks' ring connection from the
// second (readSpinWatch) in place of the star's header there, a TCP
// message of its own.
//
// Between 3 hosts of 2 ranks (2 cores, 6 runs each, alternated with the
// star): a median of 1.19x the star's bus bandwidth at 4 KiB, 1.38x at
// 16 KiB, 1.47x at 64 KiB and 1.13x at 256 KiB. With the star's header
// kept it was 1.06x, 1.22x and 1.04x the star at 4, 16 and 64 KiB, where
// without it 1.18x, 1.39x and 1.24x (blocks alternated in one run).
func (c *tcpComm) hierSmallHelped(buf []float32, op Op) error {
	inner := op.summing()
	g := c.local.shm
	if err := g.reduceOnePhase(buf, inner, false); err != nil {
		return err
	}
	hdr := header('R', inner, len(buf))
	whole := []span{{0, len(buf)}}
	l := c.leaders
	var err error
	switch {
	case l != nil && l.rank == 0: // the root: the broadcast hands the helper its result
		if err = l.starFold(buf, whole, inner, hdr); err == nil {
			if err = g.broadcast(buf, 0); err == nil {
				err = l.starWrite(1, buf, whole, hdr)
			}
		}
	case l != nil:
		err = l.starWrite(0, buf, whole, hdr)
		var r net.Conn
		switch {
		case err != nil:
		case l.rank == 1:
			if r, err = l.starConn(0, false); err == nil {
				err = l.starResult(r, 0, buf, whole, hdr, nil)
			}
		default:
			if r, err = c.link(c.helpPeer, false, kindExchange); err == nil {
				// The second host's first rank finishes only after the
				// root has handed the helper this result.
				err = c.starResult(r, c.helpPeer, buf, whole, hdr, &stray{c: l, conn: l.prev, peer: 1, want: hdr})
			}
		}
		if err == nil {
			err = g.broadcast(buf, 0)
		}
	case c.helpPeer >= 0: // the helper
		if err = g.broadcast(buf, 0); err == nil {
			var w net.Conn
			if w, err = c.link(c.helpPeer, true, kindExchange); err == nil {
				err = c.writeSpans(w, c.helpPeer, buf, whole, hdr)
			}
		}
	default:
		err = g.broadcast(buf, 0)
	}
	if err != nil {
		return err
	}
	finish(buf, op, c.n)
	return nil
}

// readSpins is how many times readSpin polls an empty socket, yielding
// between tries, before it waits in the runtime's poller.
const readSpins = 200

// readSpin fills b from conn as c.read does, but polls the socket first:
// a small message from a peer that is already sending arrives within
// microseconds, and waking a goroutine parked in the poller costs about as
// much (4 KiB over 2 hosts: 0.094 -> 0.117 GB/s, best of 3). Past
// readSpins empty polls it waits in the poller, where the deadline and an
// abort end the wait.
func (c *tcpComm) readSpin(conn net.Conn, peer int, b []byte) error {
	return c.readSpinHdr(conn, peer, b, nil)
}

// readSpinHdr is readSpin for a message that starts with the collective's
// header, read with it into b: it compares the first 16 bytes with hdr as
// soon as they are in (so that a peer in another collective is named at
// once, as checkHeader does) and saves the header's own read system call.
// In pairSpans and the star's first rank (2 cores, best of 3-4,
// alternated): 2 hosts of 2 ranks 0.21 against 0.15 GB/s at 4 KiB, 0.81
// against 0.60 at 16 KiB; 3 hosts of 2 ranks 0.057 against 0.048 and
// 0.22 against 0.17.
func (c *tcpComm) readSpinHdr(conn net.Conn, peer int, b, hdr []byte) error {
	return c.readSpinWatch(conn, peer, b, hdr, nil)
}

// stray is a connection on which nothing comes in the collective a rank
// waits in (readSpinWatch). What arrives there is from a rank in another
// collective: this one's peer in a mismatched call, or (if the peer is
// done with this call) its next collective, whose bytes are left for it.
type stray struct {
	c    *tcpComm // the group of conn
	conn net.Conn
	peer int             // the group rank that writes on conn
	want []byte          // the waiting collective's header
	raw  syscall.RawConn // conn's, once arrived has asked
}

// strayPoll is how often readSpinWatch, waiting in the poller, wakes to
// look at its stray connection.
const strayPoll = 20 * time.Millisecond

// strayGrace bounds how long readSpinWatch still waits for its message
// once something came on the stray connection, before it names the
// mismatch: it waits a quarter of the timeout, at most strayGrace. A peer
// can only finish the collective once the waiting rank's message is on its
// way or ready to go (the caller says why), so that message is due within
// a scheduling delay; a mismatched peer's never comes.
const strayGrace = 5 * time.Second

// arrived says whether anything (or the end of the stream) came on the
// stray connection, without reading it.
func (s *stray) arrived() bool {
	if s.raw == nil {
		sc, ok := s.conn.(syscall.Conn)
		if !ok {
			return false
		}
		var err error
		if s.raw, err = sc.SyscallConn(); err != nil {
			return false
		}
	}
	var came bool
	s.raw.Control(func(fd uintptr) {
		var one [1]byte
		k, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Bytes, the end of the stream, or an error such as a reset.
		came = k > 0 || err == nil || (err != syscall.EAGAIN && err != syscall.EINTR)
	})
	return came
}

// fail names what came on the stray connection: another collective's
// header, or one like the waiting collective's from a rank that took
// another path.
func (s *stray) fail() error {
	got := make([]byte, 16)
	if err := s.c.read(s.conn, s.peer, got); err != nil {
		return err
	}
	if err := s.c.compareHeader(s.peer, got, s.want); err != nil {
		return err
	}
	w := s.c.ranks[s.peer]
	return s.c.nd.fail(&PeerError{Rank: w, Host: s.c.nd.peer(w).host,
		Err: fmt.Errorf("nccl: group rank %d called %s, and rank %d sent it where that sends nothing (another path?)",
			s.c.rank, describeHeader(s.want), s.peer)})
}

// readSpinWatch is readSpinHdr that also watches a stray connection (if
// watch is not nil) until the message begins, polled with conn and, while
// it waits in the poller, every strayPoll: a peer in another collective is
// named within strayGrace, not after the timeout. The caller's message
// must be one that is sent before the stray connection's peer can finish
// the collective, or ready to be sent by a rank that only has to be
// scheduled.
func (c *tcpComm) readSpinWatch(conn net.Conn, peer int, b, hdr []byte, watch *stray) error {
	var raw syscall.RawConn
	sc, ok := conn.(syscall.Conn)
	if ok && len(b) > 0 {
		var err error
		if raw, err = sc.SyscallConn(); err != nil {
			raw = nil
		}
	}
	if raw == nil {
		if hdr != nil {
			if err := c.checkHeader(conn, peer, hdr); err != nil {
				return err
			}
			b = b[16:]
		}
		return c.read(conn, peer, b)
	}
	deadline := time.Now().Add(c.nd.o.Timeout)
	got, tries := 0, 0
	var err, rerr error
	grace := min(c.nd.o.Timeout/4, strayGrace)
	var strayAt time.Time // when something came on watch
	// strayed says, while none of the message has come, whether what came
	// on watch has waited out the grace.
	strayed := func() bool {
		if got > 0 {
			return false
		}
		if strayAt.IsZero() && watch.arrived() {
			strayAt = time.Now()
		}
		return !strayAt.IsZero() && time.Since(strayAt) >= grace
	}
	failed := false
	for {
		wake := deadline
		if watch != nil && got == 0 {
			w := time.Now().Add(strayPoll)
			if end := strayAt.Add(grace); !strayAt.IsZero() && end.Before(w) {
				// The grace's end, or now: one more read comes first.
				if w = end; w.Before(time.Now()) {
					w = time.Now().Add(time.Millisecond)
				}
			}
			if w.Before(wake) {
				wake = w
			}
		}
		if err := c.arm(conn.SetReadDeadline, wake); err != nil {
			return err
		}
		err = raw.Read(func(fd uintptr) bool {
			for got < len(b) {
				if hdr != nil && got >= 16 {
					if string(b[:16]) != string(hdr) {
						return true
					}
					hdr = nil
				}
				k, e := syscall.Read(int(fd), b[got:])
				switch {
				case k > 0:
					got += k
				case e == syscall.EINTR:
				case e == syscall.EAGAIN:
					if watch != nil && strayed() {
						failed = true
						return true
					}
					if tries++; tries > readSpins {
						tries = 0
						return false // wait in the poller
					}
					yield()
				case e != nil:
					rerr = e
					return true
				default:
					rerr = io.ErrUnexpectedEOF
					return true
				}
			}
			return true
		})
		if watch == nil || failed || !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(deadline) {
			break
		}
		// An abort that set conn's deadline after this check and before
		// the one above is seen at the next wake: within strayPoll while
		// none of the message has come, else at the timeout.
		if aerr := c.nd.abortErr(); aerr != nil {
			return aerr
		}
		tries = readSpins // woken to look at watch: one read, then the poller again
	}
	if failed {
		return watch.fail()
	}
	if err == nil {
		err = rerr
	}
	if err != nil {
		return c.ioErr(peer, "receiving from", err)
	}
	if hdr != nil { // bad, or the whole message came in one read
		return c.compareHeader(peer, b[:16], hdr)
	}
	return nil
}

// star all-reduces buf through group rank c.starRoot, in a group of 3 below
// scatterBytes, in place of the exchange and the ring: the other two send
// it their buffers, it folds the three in rank order (the exchange's
// bits) and sends the result back. Between 3 hosts (3 ranks, and 3 hosts of 2
// ranks, whose first ranks take it; 2 cores) it took 0.6-0.75x the
// exchange's time at 4 and 16 KiB and 0.75-0.9x at 64 KiB (best of 4-8,
// alternated). The root reads and writes twice the buffer, as every rank of
// the exchange does, but the group moves 4 buffers instead of 6, and the
// other two wait on one socket instead of two. The root reads before it
// writes and the others write before they read, so no two ranks block on
// writes to each other.
func (c *tcpComm) star(buf []float32, op Op, hdr []byte) error {
	return c.starSpans(buf, []span{{0, len(buf)}}, op, hdr)
}

// starSpans is star on buf's spans (a chunk of the pipelined hierarchical
// all-reduce), sent and folded packed.
func (c *tcpComm) starSpans(buf []float32, sp []span, op Op, hdr []byte) error {
	n, root := c.n, c.starRoot
	after := (c.rank - root + n) % n // 0 on the root
	// The star leaves the ring's connection between the root's two others
	// idle: a header goes there too, so that a rank that runs another
	// collective on the ring is told at once, as in the exchange.
	if after == 1 {
		if err := c.write(c.next, (c.rank+1)%n, hdr); err != nil {
			return err
		}
	}
	if after != 0 {
		if err := c.starWrite(root, buf, sp, hdr); err != nil {
			return err
		}
		if after == 2 {
			if err := c.checkHeaderSpin(c.prev, (c.rank+n-1)%n, hdr); err != nil {
				return err
			}
		}
		r, err := c.starConn(root, false)
		if err != nil {
			return err
		}
		return c.starResult(r, root, buf, sp, hdr, nil)
	}
	if err := c.starFold(buf, sp, op, hdr); err != nil {
		return err
	}
	for i := 1; i < n; i++ {
		if err := c.starWrite((root+i)%n, buf, sp, hdr); err != nil {
			return err
		}
	}
	return nil
}

// starConn is the star's connection to or from group rank p: the ring's
// where it joins the two, a link of their own otherwise.
func (c *tcpComm) starConn(p int, out bool) (net.Conn, error) {
	switch {
	case out && p == (c.rank+1)%c.n:
		return c.next, nil
	case !out && p == (c.rank+c.n-1)%c.n:
		return c.prev, nil
	}
	return c.link(p, out, kindExchange)
}

// starWrite writes the header and buf's spans to group rank p.
func (c *tcpComm) starWrite(p int, buf []float32, sp []span, hdr []byte) error {
	w, err := c.starConn(p, true)
	if err != nil {
		return err
	}
	return c.writeSpans(w, p, buf, sp, hdr)
}

// writeSpans writes the header and buf's spans to w, the connection to
// group rank p, in one system call.
func (c *tcpComm) writeSpans(w net.Conn, p int, buf []float32, sp []span, hdr []byte) error {
	bs := net.Buffers{hdr}
	for _, s := range sp {
		bs = append(bs, asBytes(buf[s.lo:s.hi]))
	}
	return c.writeBufs(w, p, bs)
}

// starResult reads the star's result from r, the connection from group
// rank p, into buf's spans; watch is readSpinWatch's, or nil.
func (c *tcpComm) starResult(r net.Conn, p int, buf []float32, sp []span, hdr []byte, watch *stray) error {
	if m := spansLen(sp); 4*m <= starCopyBytes {
		msg := c.buffer(4 + m)
		err := c.readSpinWatch(r, p, asBytes(msg), hdr, watch)
		if err == nil {
			unpack(buf, msg[4:], sp)
		}
		return err
	}
	got := make([]byte, 16)
	if err := c.readSpinWatch(r, p, got, nil, watch); err != nil {
		return err
	}
	if err := c.compareHeader(p, got, hdr); err != nil {
		return err
	}
	for _, s := range sp {
		if err := c.readSpin(r, p, asBytes(buf[s.lo:s.hi])); err != nil {
			return err
		}
	}
	return nil
}

// starFold is the star's root reading the others' spans and folding them
// into buf's in rank order.
func (c *tcpComm) starFold(buf []float32, sp []span, op Op, hdr []byte) error {
	n, me := c.n, c.rank
	w := 4 + spansLen(sp) // a message: the header, then the spans
	all := c.buffer(n * w)
	for i := 1; i < n; i++ {
		p := (me + i) % n
		r, err := c.starConn(p, false)
		if err == nil {
			err = c.readSpinHdr(r, p, asBytes(all[p*w:(p+1)*w]), hdr)
		}
		if err != nil {
			return err
		}
	}
	off := 4
	for _, s := range sp {
		foldInRankOrder(buf[s.lo:s.hi], all, w, off, me, op)
		off += s.hi - s.lo
	}
	return nil
}

// foldInRankOrder folds into out, this rank's (me) part, the same part of
// every rank, rank p's at all[p*w+off:] (messages w apart, this rank's
// slot free), in rank order (reduceSlots), and finishes op over them.
func foldInRankOrder(out, all []float32, w, off, me int, op Op) {
	n := len(all) / w
	srcs := make([][]float32, n)
	for p := range n {
		srcs[p] = all[p*w+off : p*w+off+len(out)]
	}
	if me == 0 {
		srcs[0] = out
	} else {
		copy(srcs[me], out) // reduceSlots writes out, which may only be its first source
	}
	reduceSlots(out, srcs, op)
	finish(out, op, n)
}

// starCopyBytes bounds the result that the star's other ranks read with
// its header (readSpinHdr), into a scratch buffer they copy it out of.
// Between 3 hosts of 2 ranks (2 cores, best of 3, alternated): 1.1x the
// bus bandwidth at 4 KiB, 1.2x at 16 KiB, 0.9x at 64 KiB (the copy).
const starCopyBytes = 16 << 10

// pairHdrBytes bounds the spans that pairSpans reads with their header
// (readSpinHdr). Between 2 hosts of 2 ranks (2 cores, best of 4,
// alternated) reading the header with them took 0.75-0.9x the bus
// bandwidth of reading it first at 4 and 16 MiB (chunks of 256 KiB in
// hierPipelined), for a gain at 4-16 KiB.
const pairHdrBytes = 64 << 10

// checkHeaderSpin is checkHeader with readSpin.
func (c *tcpComm) checkHeaderSpin(conn net.Conn, peer int, want []byte) error {
	got := make([]byte, 16)
	if err := c.readSpin(conn, peer, got); err != nil {
		return err
	}
	return c.compareHeader(peer, got, want)
}

// pairSpans all-reduces buf's spans between the two ranks of a group of 2
// in one step: each writes its spans (after the header) to the other and
// adds what it reads (a+b is b+a: both get the same bits, the exchange's).
// It is the exchange of a group of 2, without the exchange's copy of the
// buffer: between 2 hosts of 2 ranks (2 cores, best of 8, alternated) it
// took 0.7-0.8x the exchange's time at 256 KiB and 1 MiB, the same or less
// at 4-64 KiB. Messages larger than inlineBytes are written on a
// goroutine while this one reads, as in the exchange.
func (c *tcpComm) pairSpans(buf []float32, sp []span, op Op, hdr []byte) error {
	peer := 1 - c.rank
	bufs := net.Buffers{hdr}
	for _, s := range sp {
		bufs = append(bufs, asBytes(buf[s.lo:s.hi]))
	}
	m := spansLen(sp)
	write := func() error { return c.writeBufs(c.next, peer, bufs) }
	var sent chan error
	var err error
	if 16+4*m <= c.inlineBytes() {
		err = write()
	} else {
		sent = writeAside(write)
	}
	msg := c.buffer(4 + m) // the header, then the peer's spans
	tmp := msg[4:]
	switch {
	case err != nil:
	case 4*m <= pairHdrBytes:
		err = c.readSpinHdr(c.prev, peer, asBytes(msg), hdr)
	default:
		if err = c.checkHeaderSpin(c.prev, peer, hdr); err == nil {
			err = c.readSpin(c.prev, peer, asBytes(tmp))
		}
	}
	if sent != nil {
		if serr := <-sent; err == nil {
			err = serr
		}
	}
	if err != nil {
		return err
	}
	off := 0
	for _, s := range sp {
		reduceInto(buf[s.lo:s.hi], tmp[off:], op)
		off += s.hi - s.lo
	}
	return nil
}
