package nccl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// The TCP backend: every group keeps a ring of directed connections (each
// rank dials its successor) plus lazily dialed point-to-point ones.
// Collectives stream over the ring in pieces of pieceElems floats: a
// goroutine writes while the caller reads and reduces, so that sending,
// receiving and reducing overlap. Each collective starts with a 16-byte
// header that the receiver checks, so ranks calling different collectives
// or lengths get an error instead of garbage.
//
// Buffers travel as raw little-endian float32 (every supported target is
// little-endian).

const pieceElems = 128 << 10

const (
	kindRing byte = iota // ring neighbours
	kindP2P              // Send/Recv
)

const hdrMagic = 0x52435048 // "HPCR"

func asBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// accept receives the connections of every group of this process.
func (nd *node) accept() {
	defer nd.wg.Done()
	var handlers sync.WaitGroup // not nd.wg: a handler may wait on a group's pending channel past Close
	acceptLoop(nd.ln, &handlers, func(conn net.Conn, authenticated func()) {
		if err := authAccept(conn, nd.o.Token, "hpcrun-peer"); err != nil {
			conn.Close()
			return
		}
		authenticated()
		conn.SetReadDeadline(time.Now().Add(authWait))
		var h [9]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			conn.Close()
			return
		}
		idLen := binary.LittleEndian.Uint32(h[:])
		if idLen > maxKey {
			conn.Close()
			return
		}
		id := make([]byte, idLen)
		if _, err := io.ReadFull(conn, id); err != nil {
			conn.Close()
			return
		}
		conn.SetReadDeadline(time.Time{})
		k := connKey{group: string(id), from: int(binary.LittleEndian.Uint32(h[4:])), kind: h[8]}
		nd.pendingChan(k) <- conn
	})
}

func (nd *node) pendingChan(k connKey) chan net.Conn {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	ch, ok := nd.pending[k]
	if !ok {
		ch = make(chan net.Conn, 1)
		nd.pending[k] = ch
	}
	return ch
}

// awaitConn waits for the connection of kind from world rank from to group.
func (nd *node) awaitConn(group string, from int, kind byte) (net.Conn, error) {
	k := connKey{group, from, kind}
	ch := nd.pendingChan(k)
	t := time.NewTimer(nd.o.Timeout)
	defer t.Stop()
	select {
	case c := <-ch:
		nd.mu.Lock()
		delete(nd.pending, k)
		nd.mu.Unlock()
		tune(c)
		nd.track(c)
		return c, nil
	case <-nd.errCh:
		return nil, nd.abortErr()
	case <-nd.ctx.Done():
		return nil, fmt.Errorf("nccl: waiting for rank %d to connect: %w", from, nd.ctx.Err())
	case <-t.C:
		return nil, nd.fail(&PeerError{Rank: from, Host: nd.peer(from).host,
			Err: fmt.Errorf("%w after %v: never connected (group %s)", ErrTimeout, nd.o.Timeout, group)})
	}
}

// dialPeer connects to world rank to for group.
func (nd *node) dialPeer(group string, to int, kind byte) (net.Conn, error) {
	p := nd.peer(to)
	deadline := time.Now().Add(nd.o.Timeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", p.addr)
	if err == nil {
		err = authDial(conn, nd.o.Token, "hpcrun-peer", deadline)
		if err == nil {
			h := binary.LittleEndian.AppendUint32(nil, uint32(len(group)))
			h = binary.LittleEndian.AppendUint32(h, uint32(nd.o.Rank))
			h = append(h, kind)
			h = append(h, group...)
			_, err = conn.Write(h)
		}
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		if e := nd.abortErr(); e != nil {
			return nil, e
		}
		return nil, nd.fail(&PeerError{Rank: to, Host: p.host, Err: fmt.Errorf("connect %s: %v", p.addr, err)})
	}
	tune(conn)
	nd.track(conn)
	return conn, nil
}

func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetReadBuffer(4 << 20)
		tc.SetWriteBuffer(4 << 20)
	}
}

// tcpComm is a group communicator of the TCP backend.
type tcpComm struct {
	nd    *node
	id    string
	ranks []int // world rank of each group rank
	rank  int
	n     int
	world bool

	next, prev net.Conn // ring: we write to next, read from prev
	shm        *shmGroup
	// A group spread over hosts, some with several of its ranks, also
	// has a communicator of its ranks on this host (shared memory) and,
	// on the first of them, one of the first rank of every host.
	local, leaders *tcpComm
	hosts          int // hosts of the group, when local is set
	// peers, where every host holds equally many of the group's ranks
	// and all of them share memory, is the communicator of the ranks at
	// this rank's place on every host (leaders, on a host's first rank).
	peers *tcpComm
	// starRoot is the group rank its star all-reduce goes through: 0,
	// or in the peers of the hosts' i-th ranks, i modulo the hosts, so
	// that hierSplit's stars (a chunk's parts below scatterBytes) do not
	// all read and write on the first host. Between 3 hosts of 2 ranks
	// (2 cores, 5 runs each, alternated): a median of 1.55x the bus
	// bandwidth at 1 MiB, 1.2x at 4 MiB.
	starRoot int
	// helped says that a group over three hosts with peers takes
	// hierSmallHelped; on the first host's second rank and the third
	// host's first, helpPeer is the other's group rank (-1 elsewhere).
	helped   bool
	helpPeer int

	linkMu sync.Mutex
	links  map[linkKey]net.Conn // lazily made point-to-point connections

	seq     map[string]int
	scratch []float32 // one received piece
	sndbuf  int       // the ring connection's socket send buffer, once read (small.go)
	work    []float32 // ReduceScatter's copy of send
	cnt     counters
	closed  bool
}

func (nd *node) newComm(id string, ranks []int, me int) (*tcpComm, error) {
	c := &tcpComm{nd: nd, id: id, ranks: ranks, rank: me, n: len(ranks),
		links: map[linkKey]net.Conn{}, seq: map[string]int{}, helpPeer: -1}
	if c.n == 1 {
		return c, nil
	}
	nextW, prevW := ranks[(me+1)%c.n], ranks[(me+c.n-1)%c.n]
	dialed := make(chan error, 1)
	go func() {
		var err error
		c.next, err = nd.dialPeer(id, nextW, kindRing)
		dialed <- err
	}()
	var err error
	c.prev, err = nd.awaitConn(id, prevW, kindRing)
	if derr := <-dialed; err == nil {
		err = derr
	}
	if err != nil {
		c.closeConns()
		return nil, err
	}
	if nd.o.Backend == BackendTCP {
		return c, nil
	}
	if c.sameHost() {
		if testNoShm != nil && testNoShm(nd.o.Rank) {
			return c, nil
		}
		if c.shm, err = newShmGroup(c); err != nil {
			if nd.abortErr() != nil {
				c.closeConns()
				return nil, err
			}
			// No shared memory (no /dev/shm?): the ring still works.
			fmt.Fprintf(os.Stderr, "nccl: group %s: shared memory off: %v\n", id, err)
			c.shm = nil
		}
	} else if err := c.splitHosts(); err != nil {
		c.closeConns()
		return nil, err
	}
	return c, nil
}

// testNoShm, when set by a test, pretends that the ranks it names have
// no shared memory.
var testNoShm func(rank int) bool

// splitHosts makes the local and leaders communicators of a group that
// spans hosts, when some host holds more than one of its ranks.
func (c *tcpComm) splitHosts() error {
	var hosts []string
	byHost := map[string][]int{} // world ranks per host, in group order
	for _, w := range c.ranks {
		h := c.nd.peer(w).hostID
		if _, ok := byHost[h]; !ok {
			hosts = append(hosts, h)
		}
		byHost[h] = append(byHost[h], w)
	}
	if len(hosts) == len(c.ranks) {
		return nil // one rank per host: the ring is all there is
	}
	c.hosts = len(hosts)
	me := c.ranks[c.rank]
	local := byHost[c.nd.self.hostID]
	var err error
	// Distinct ids per host keep the hosts' shared files apart even when
	// the "hosts" share a machine (tests).
	if c.local, err = c.nd.newComm(fmt.Sprintf("%s/host%d", c.id, local[0]), local, indexOf(local, me)); err != nil {
		return err
	}
	if local[0] == me {
		leaders := make([]int, len(hosts))
		for i, h := range hosts {
			leaders[i] = byHost[h][0]
		}
		if c.leaders, err = c.nd.newComm(c.id+"/hosts", leaders, indexOf(leaders, me)); err != nil {
			c.local.Close()
			return err
		}
	}
	if len(hosts) > maxSplitHosts {
		return nil
	}
	for _, h := range hosts {
		if len(byHost[h]) != len(local) {
			return nil
		}
	}
	if err := c.makePeers(hosts, byHost); err != nil {
		c.local.Close()
		if c.leaders != nil {
			c.leaders.Close()
		}
		return err
	}
	if c.peers != nil && len(hosts) == 3 {
		c.helped = true
		helper, third := byHost[hosts[0]][1], byHost[hosts[2]][0]
		switch me {
		case helper:
			c.helpPeer = indexOf(c.ranks, third)
		case third:
			c.helpPeer = indexOf(c.ranks, helper)
		}
	}
	return nil
}

// makePeers makes peers (hierSplit) in a group whose hosts hold equally
// many of its ranks, listed by byHost, unless a host's ranks do not share
// memory: the hosts' first ranks tell each other, and each tells its
// host, so that every rank decides alike.
func (c *tcpComm) makePeers(hosts []string, byHost map[string][]int) error {
	noShm := []float32{0}
	if c.local.shm == nil {
		noShm[0] = 1
	}
	if c.leaders != nil {
		if err := c.leaders.AllReduce(noShm, Max); err != nil {
			return err
		}
	}
	if err := c.local.Broadcast(noShm, 0); err != nil {
		return err
	}
	if noShm[0] != 0 {
		return nil
	}
	me := c.ranks[c.rank]
	i := indexOf(byHost[c.nd.self.hostID], me)
	if i == 0 {
		c.peers = c.leaders
		return nil
	}
	peers := make([]int, len(hosts))
	for k, h := range hosts {
		peers[k] = byHost[h][i]
	}
	var err error
	c.peers, err = c.nd.newComm(fmt.Sprintf("%s/peers%d", c.id, i), peers, indexOf(peers, me))
	if err == nil {
		c.peers.starRoot = i % len(hosts)
	}
	return err
}

func indexOf(s []int, v int) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// hierAllReduce reduces on each host, then between hosts, then hands the
// result back on each host: the network carries each buffer once per host
// instead of once per rank.
func (c *tcpComm) hierAllReduce(buf []float32, op Op) error {
	inner := op.summing()
	if err := c.local.AllReduce(buf, inner); err != nil {
		return err
	}
	if c.leaders != nil {
		if err := c.leaders.AllReduce(buf, inner); err != nil {
			return err
		}
	}
	if err := c.local.Broadcast(buf, 0); err != nil {
		return err
	}
	finish(buf, op, c.n)
	return nil
}

func (c *tcpComm) sameHost() bool {
	for _, r := range c.ranks {
		if c.nd.peer(r).hostID != c.nd.self.hostID {
			return false
		}
	}
	return true
}

func (c *tcpComm) Rank() int    { return c.rank }
func (c *tcpComm) Size() int    { return c.n }
func (c *tcpComm) Stats() Stats { return c.cnt.snapshot() }

func (c *tcpComm) closeConns() {
	for _, conn := range []net.Conn{c.next, c.prev} {
		if conn != nil {
			c.nd.untrack(conn)
		}
	}
	c.linkMu.Lock()
	for _, conn := range c.links {
		c.nd.untrack(conn)
	}
	c.linkMu.Unlock()
	if c.shm != nil {
		c.shm.close()
	}
	if c.peers != nil && c.peers != c.leaders {
		c.peers.Close()
	}
	for _, sub := range []*tcpComm{c.local, c.leaders} {
		if sub != nil {
			sub.Close()
		}
	}
}

func (c *tcpComm) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.closeConns()
	if c.world {
		return c.nd.close()
	}
	return nil
}

// start checks that the communicator can run an operation.
func (c *tcpComm) start() error {
	c.nd.mu.Lock()
	closing := c.nd.closing
	c.nd.mu.Unlock()
	if c.closed || closing {
		return ErrClosed
	}
	return c.nd.abortErr()
}

// ioErr turns an I/O error with group rank peer into the job's failure.
func (c *tcpComm) ioErr(peer int, what string, err error) error {
	if e := c.nd.abortErr(); e != nil {
		return e
	}
	w := c.ranks[peer]
	var why error
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		why = fmt.Errorf("%w after %v %s it (stalled?)", ErrTimeout, c.nd.o.Timeout, what)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		why = fmt.Errorf("connection lost %s it (process exited?): %v", what, err)
	default:
		why = fmt.Errorf("%s it: %v", what, err)
	}
	return c.nd.fail(&PeerError{Rank: w, Host: c.nd.peer(w).host, Err: why})
}

func (c *tcpComm) read(conn net.Conn, peer int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := c.arm(conn.SetReadDeadline, time.Now().Add(c.nd.o.Timeout)); err != nil {
		return err
	}
	if _, err := io.ReadFull(conn, b); err != nil {
		return c.ioErr(peer, "receiving from", err)
	}
	return nil
}

func (c *tcpComm) write(conn net.Conn, peer int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := c.arm(conn.SetWriteDeadline, time.Now().Add(c.nd.o.Timeout)); err != nil {
		return err
	}
	if _, err := conn.Write(b); err != nil {
		return c.ioErr(peer, "sending to", err)
	}
	return nil
}

// writeBufs writes bufs to conn, the connection to group rank peer, in
// one system call where the socket takes them all.
func (c *tcpComm) writeBufs(conn net.Conn, peer int, bufs net.Buffers) error {
	if err := c.arm(conn.SetWriteDeadline, time.Now().Add(c.nd.o.Timeout)); err != nil {
		return err
	}
	if _, err := bufs.WriteTo(conn); err != nil {
		return c.ioErr(peer, "sending to", err)
	}
	return nil
}

// arm sets a connection's read or write deadline (set: its
// SetReadDeadline or SetWriteDeadline) to t, then returns the job's
// failure if there is one. abortLocal records the failure before it moves
// every connection's deadlines into the past, so the abort overrides a
// deadline set before it, and the check here catches one set after it:
// without the check, a rank that the abort reached between two messages
// of a collective would wait out the whole timeout on the next. The
// check is a poll of errCh, which abortLocal closes with the failure
// recorded: no lock on a collective's every message.
func (c *tcpComm) arm(set func(time.Time) error, t time.Time) error {
	set(t)
	select {
	case <-c.nd.errCh:
		return c.nd.abortErr()
	default:
		return nil
	}
}

// header is magic u32, kind u8, pad, op (or Broadcast root) u16, count u64.
func header(kind byte, op Op, count int) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, hdrMagic)
	h[4] = kind
	binary.LittleEndian.PutUint16(h[6:], uint16(op))
	binary.LittleEndian.PutUint64(h[8:], uint64(count))
	return h
}

// describeHeader names the collective of a 16-byte header.
func describeHeader(h []byte) string {
	return describe(h[4], binary.LittleEndian.Uint16(h[6:]), binary.LittleEndian.Uint64(h[8:]))
}

// describe renders a collective header for error messages.
func describe(kind byte, op uint16, count uint64) string {
	switch kind {
	case 'B':
		return fmt.Sprintf("Broadcast(root %d, %d elements)", op, count)
	case 'R', 'S':
		return fmt.Sprintf("%s(%v, %d elements)", collName[kind], Op(op), count)
	case 'Z':
		return "Barrier()"
	}
	return fmt.Sprintf("%s(%d elements)", collName[kind], count)
}

var collName = map[byte]string{'R': "AllReduce", 'G': "AllGather", 'S': "ReduceScatter", 'B': "Broadcast", 'P': "Send", 'Z': "Barrier"}

// checkHeader reads the peer's header and compares it with ours. A
// mismatch leaves the stream unusable, so it aborts the job.
func (c *tcpComm) checkHeader(conn net.Conn, peer int, want []byte) error {
	got := make([]byte, 16)
	if err := c.read(conn, peer, got); err != nil {
		return err
	}
	return c.compareHeader(peer, got, want)
}

// compareHeader compares the header got from peer with ours.
func (c *tcpComm) compareHeader(peer int, got, want []byte) error {
	if string(got) == string(want) {
		return nil
	}
	err := fmt.Errorf("nccl: group rank %d called %s but rank %d called %s", c.rank, describeHeader(want), peer, describeHeader(got))
	if binary.LittleEndian.Uint32(got) != hdrMagic {
		err = fmt.Errorf("nccl: group rank %d: corrupt stream from rank %d", c.rank, peer)
	}
	// The streams are out of step for good: fail the job on every rank.
	w := c.ranks[peer]
	return c.nd.fail(&PeerError{Rank: w, Host: c.nd.peer(w).host, Err: err})
}

// sender writes queued byte slices to a connection on its own goroutine.
// A direct sender writes on the caller's goroutine instead: for small
// collectives, where the kernel's socket buffers hold everything in flight
// and a goroutine handoff per piece would cost more than the data.
type sender struct {
	q       chan []byte
	queued  int
	written chan struct{} // one token per slice written (or skipped after an error)
	seen    int
	done    chan error

	direct func(b []byte) error
	err    error // first error of a direct sender
}

// directBytes bounds the largest ring segment sent directly.
const directBytes = 32 << 10

func (c *tcpComm) startSender(conn net.Conn, peer int, capacity int, direct bool) *sender {
	if direct {
		return &sender{direct: func(b []byte) error { return c.write(conn, peer, b) }}
	}
	s := &sender{q: make(chan []byte, capacity), written: make(chan struct{}, capacity), done: make(chan error, 1)}
	go func() {
		var err error
		for b := range s.q {
			if err == nil {
				err = c.write(conn, peer, b)
			}
			s.written <- struct{}{}
		}
		s.done <- err
	}()
	return s
}

func (s *sender) send(b []byte) {
	s.queued++
	if s.direct != nil {
		if s.err == nil {
			s.err = s.direct(b)
		}
		return
	}
	s.q <- b
}

// drain waits until the first k queued slices have left the buffer, so
// that their memory may be written again.
func (s *sender) drain(k int) {
	if s.direct != nil {
		return
	}
	for ; s.seen < k; s.seen++ {
		<-s.written
	}
}

// wait closes the queue and returns the first write error.
func (s *sender) wait() error {
	if s.direct != nil {
		return s.err
	}
	close(s.q)
	return <-s.done
}

func pieces(lo, hi int) int { return (hi - lo + pieceElems - 1) / pieceElems }

func (c *tcpComm) buffer(n int) []float32 {
	if cap(c.scratch) < n {
		c.scratch = make([]float32, n)
	}
	return c.scratch[:n]
}

// ring runs a reduce-scatter phase (rs), an all-gather phase (ag) or both
// over the segments of buf given by seg. With shift s, the reduce-scatter
// leaves segment rank+1+s fully reduced on this rank, and the all-gather
// starts from that segment.
func (c *tcpComm) ring(buf []float32, seg func(i int) (int, int), shift int, rs, ag bool, op Op, hdr []byte) error {
	n, me := c.n, c.rank
	mod := func(i int) int { return ((i % n) + n) % n }
	prev, next := mod(me-1), mod(me+1)
	total, largest := 0, 0
	for i := range n {
		lo, hi := seg(i)
		total += pieces(lo, hi)
		largest = max(largest, 4*(hi-lo))
	}
	s := c.startSender(c.next, next, 2*total+1, largest <= directBytes)
	s.send(hdr)
	queue := func(i int) {
		lo, hi := seg(i)
		for p := lo; p < hi; p += pieceElems {
			s.send(asBytes(buf[p:min(p+pieceElems, hi)]))
		}
	}
	err := c.checkHeader(c.prev, prev, hdr)
	if rs {
		queue(mod(me + shift))
		tmp := c.buffer(min(pieceElems, len(buf)))
		for step := 0; step < n-1 && err == nil; step++ {
			lo, hi := seg(mod(me - step - 1 + shift))
			for p := lo; p < hi && err == nil; p += pieceElems {
				e := min(p+pieceElems, hi)
				t := tmp[:e-p]
				if err = c.read(c.prev, prev, asBytes(t)); err != nil {
					break
				}
				reduceInto(buf[p:e], t, op)
				if step == n-2 {
					finish(buf[p:e], op, n)
					if !ag {
						continue
					}
				}
				s.send(asBytes(buf[p:e]))
			}
		}
	} else if ag {
		queue(mod(me + 1 + shift))
	}
	if ag {
		// The peers have consumed what we sent before they send back the
		// reduced segments, but make that order explicit.
		s.drain(s.queued - pieces(seg(mod(me+1+shift))))
		for step := 0; step < n-1 && err == nil; step++ {
			lo, hi := seg(mod(me + shift - step))
			for p := lo; p < hi && err == nil; p += pieceElems {
				e := min(p+pieceElems, hi)
				if err = c.read(c.prev, prev, asBytes(buf[p:e])); err != nil {
					break
				}
				if step < n-2 {
					s.send(asBytes(buf[p:e]))
				}
			}
		}
	}
	if serr := s.wait(); err == nil {
		err = serr
	}
	return err
}

func (c *tcpComm) AllReduce(buf []float32, op Op) error {
	defer c.cnt.add(kAllReduce, 4*len(buf), time.Now())
	if err := op.valid(); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	if c.n == 1 {
		finish(buf, op, 1)
		return nil
	}
	switch {
	case c.shm != nil && 4*len(buf) < smallShmBytes:
		return c.shm.reduceOnePhase(buf, op, true)
	case c.shm != nil:
		return c.shm.allReduce(buf, op)
	case c.useHierSplit(len(buf)):
		return c.hierSplit(buf, op)
	case c.useHierAdd(len(buf)):
		return c.hierAdd(buf, op)
	case c.useHierSmall(len(buf)):
		return c.hierSmall(buf, op)
	case c.usePipeline(len(buf)):
		return c.hierPipelined(buf, op, hierChunkElems)
	case c.local != nil:
		return c.hierAllReduce(buf, op)
	case c.useScatter(len(buf)):
		return c.scatter(buf, op, header('R', op, len(buf)))
	case c.useStar(len(buf)):
		return c.star(buf, op, header('R', op, len(buf)))
	case c.n == 2 && c.useExchange(len(buf)):
		return c.pair(buf, op)
	case c.useExchange(len(buf)):
		return c.exchange(buf, op, header('R', op, len(buf)))
	}
	n := len(buf)
	seg := func(i int) (int, int) { return segment(n, c.n, i) }
	return c.ring(buf, seg, 0, true, true, op, header('R', op, n))
}

func (c *tcpComm) AllGather(send, recv []float32) error {
	defer c.cnt.add(kAllGather, 4*len(recv), time.Now())
	if err := checkAllGather(send, recv, c.n); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	b := len(send)
	copy(recv[c.rank*b:], send)
	if c.n == 1 {
		return nil
	}
	if c.shm != nil {
		return c.shm.allGather(send, recv)
	}
	seg := func(i int) (int, int) { return i * b, (i + 1) * b }
	return c.ring(recv, seg, -1, false, true, Sum, header('G', Sum, b))
}

func (c *tcpComm) ReduceScatter(send, recv []float32, op Op) error {
	defer c.cnt.add(kReduceScatter, 4*len(recv), time.Now())
	if err := op.valid(); err != nil {
		return err
	}
	if err := checkReduceScatter(send, recv, c.n); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	b := len(recv)
	if c.n == 1 {
		copy(recv, send)
		finish(recv, op, 1)
		return nil
	}
	if c.shm != nil {
		return c.shm.reduceScatter(send, recv, op)
	}
	if cap(c.work) < len(send) {
		c.work = make([]float32, len(send))
	}
	work := c.work[:len(send)]
	copy(work, send)
	seg := func(i int) (int, int) { return i * b, (i + 1) * b }
	if err := c.ring(work, seg, -1, true, false, op, header('S', op, len(send))); err != nil {
		return err
	}
	copy(recv, work[c.rank*b:])
	return nil
}

// Broadcast streams root's buffer along the ring as a pipelined chain.
func (c *tcpComm) Broadcast(buf []float32, root int) error {
	defer c.cnt.add(kBroadcast, 4*len(buf), time.Now())
	if err := checkRank("Broadcast root", root, c.n); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	if c.n == 1 {
		return nil
	}
	if c.shm != nil {
		return c.shm.broadcast(buf, root)
	}
	n, me := c.n, c.rank
	prev, next := (me+n-1)%n, (me+1)%n
	hdr := header('B', Op(root), len(buf))
	last := next == root
	var s *sender
	if !last {
		s = c.startSender(c.next, next, pieces(0, len(buf))+1, 4*len(buf) <= directBytes)
		s.send(hdr)
	}
	var err error
	if me != root {
		err = c.checkHeader(c.prev, prev, hdr)
	}
	for p := 0; p < len(buf) && err == nil; p += pieceElems {
		e := min(p+pieceElems, len(buf))
		if me != root {
			if err = c.read(c.prev, prev, asBytes(buf[p:e])); err != nil {
				break
			}
		}
		if !last {
			s.send(asBytes(buf[p:e]))
		}
	}
	if s != nil {
		if serr := s.wait(); err == nil {
			err = serr
		}
	}
	return err
}

// Barrier is a one-element all-reduce (by direct exchange, or around the
// ring twice in a large group): a rank leaves once it has heard from every
// other, so no rank leaves before every rank entered.
func (c *tcpComm) Barrier() error {
	defer c.cnt.add(kBarrier, 0, time.Now())
	if err := c.start(); err != nil {
		return err
	}
	if c.n == 1 {
		return nil
	}
	if c.shm != nil {
		return c.shm.barrier()
	}
	if c.useExchange(1) {
		return c.exchange([]float32{0}, Sum, header('Z', Sum, 1))
	}
	buf := []float32{0}
	seg := func(i int) (int, int) { return segment(1, c.n, i) }
	return c.ring(buf, seg, 0, true, true, Sum, header('Z', Sum, 1))
}

type linkKey struct {
	peer int
	out  bool // we write (we dialed) or we read (they dialed)
	kind byte
}

// link returns the one-way connection to (out) or from group rank peer.
func (c *tcpComm) link(peer int, out bool, kind byte) (net.Conn, error) {
	k := linkKey{peer, out, kind}
	c.linkMu.Lock()
	conn, ok := c.links[k]
	c.linkMu.Unlock()
	if ok {
		return conn, nil
	}
	var err error
	if out {
		conn, err = c.nd.dialPeer(c.id, c.ranks[peer], kind)
	} else {
		conn, err = c.nd.awaitConn(c.id, c.ranks[peer], kind)
	}
	if err != nil {
		return nil, err
	}
	c.linkMu.Lock()
	c.links[k] = conn
	c.linkMu.Unlock()
	return conn, nil
}

func (c *tcpComm) Send(buf []float32, to int) error {
	defer c.cnt.add(kSend, 4*len(buf), time.Now())
	if err := checkRank("Send to", to, c.n); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	if to == c.rank {
		return errors.New("nccl: Send to self: use a copy")
	}
	conn, err := c.link(to, true, kindP2P)
	if err != nil {
		return err
	}
	if err := c.write(conn, to, header('P', Sum, len(buf))); err != nil {
		return err
	}
	return c.write(conn, to, asBytes(buf))
}

func (c *tcpComm) Recv(buf []float32, from int) error {
	defer c.cnt.add(kRecv, 4*len(buf), time.Now())
	if err := checkRank("Recv from", from, c.n); err != nil {
		return err
	}
	if err := c.start(); err != nil {
		return err
	}
	if from == c.rank {
		return errors.New("nccl: Recv from self: use a copy")
	}
	conn, err := c.link(from, false, kindP2P)
	if err != nil {
		return err
	}
	if err := c.checkHeader(conn, from, header('P', Sum, len(buf))); err != nil {
		return err
	}
	return c.read(conn, from, asBytes(buf))
}

func (c *tcpComm) Group(ranks []int) (Comm, error) {
	if err := c.start(); err != nil {
		return nil, err
	}
	pos, err := checkGroup(ranks, c.n, c.rank)
	if err != nil {
		return nil, err
	}
	world := make([]int, len(ranks))
	names := make([]string, len(ranks))
	for i, r := range ranks {
		world[i] = c.ranks[r]
		names[i] = fmt.Sprint(world[i])
	}
	key := strings.Join(names, ",")
	seq := c.seq[key]
	c.seq[key] = seq + 1
	sub, err := c.nd.newComm(fmt.Sprintf("%s/%s#%d", c.id, key, seq), world, pos)
	if err != nil {
		return nil, err
	}
	sub.logPath("group " + fmt.Sprint(world))
	return sub, nil
}

// logPath says once, from the group's first rank, how the group's
// collectives travel: shared memory within a host, the TCP ring between
// hosts, or both (hierarchical).
func (c *tcpComm) logPath(name string) {
	if c.nd.o.Log == nil || c.rank != 0 || c.n == 1 {
		return
	}
	hosts := map[string]bool{}
	for _, r := range c.ranks {
		hosts[c.nd.peer(r).host] = true
	}
	var how string
	switch {
	case c.shm != nil:
		how = "shared memory on one host"
	case len(hosts) == 1:
		how = "TCP ring on one host"
	case c.local != nil:
		within := "shared memory"
		if c.local.shm == nil {
			within = "TCP"
		}
		how = fmt.Sprintf("hierarchical: %s within each host, TCP ring between %d hosts", within, len(hosts))
	default:
		how = fmt.Sprintf("TCP ring across %d hosts", len(hosts))
	}
	fmt.Fprintf(c.nd.o.Log, "nccl: %s of %d ranks: %s\n", name, c.n, how)
}

// writeAside runs write (a message larger than the sockets hold) on a
// goroutine while the caller reads, so that no two ranks block on writes
// to each other, and lets it run first: with one thread a rank (the
// launcher's GOMAXPROCS where ranks outnumber cores) the writer would
// otherwise start only once the caller, spinning on a read (readSpins)
// for a message that its peers' writers have not begun either, parks in
// the poller. Median bus bandwidth with it and without (2 cores,
// alternated): between 3 hosts of 2 ranks at 1 MiB (scatter, 5 runs
// each) 0.81 GB/s against 0.17; between 2 hosts of 2 ranks (4 runs each;
// hierAdd at 256 KiB, the pipeline at 1 MiB, hierSplit's pairs at 4 and
// 16 MiB) 1.40, 1.40, 1.35 and 1.43 against 1.20, 1.38, 1.16 and 1.30;
// between 2 hosts of 1 rank, where each rank has a core, even (8 runs:
// 1.54 and 1.39 against 1.59 and 1.37 at 256 KiB and 1 MiB).
func writeAside(write func() error) chan error {
	sent := make(chan error, 1)
	go func() { sent <- write() }()
	runtime.Gosched()
	return sent
}
