package nccl

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// DefaultTimeout bounds every wait on a peer unless Options.Timeout says
// otherwise.
const DefaultTimeout = 30 * time.Second

// NewInProcess returns the n ranks of an in-process world: communicators
// meant to be driven by n goroutines of one process (tests, equivalence
// checks). Reductions add in rank order 0..n-1, so results equal a serial
// loop over ranks bit for bit.
func NewInProcess(n int) []Comm {
	return newInProcess(n, DefaultTimeout)
}

// RunInProcess runs fn on n goroutines, one per rank of an in-process world,
// and returns their errors joined (nil when all succeed). A rank whose fn
// returns (or panics) while others still wait for it makes them fail with a
// *PeerError naming it, instead of blocking.
func RunInProcess(n int, fn func(c Comm) error) error {
	comms := newInProcess(n, DefaultTimeout)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := comms[r].(*ipComm).g.world
			defer func() {
				if p := recover(); p != nil {
					errs[r] = fmt.Errorf("rank %d: panic: %v\n%s", r, p, debug.Stack())
				}
				w.exit(r, errs[r])
			}()
			if err := fn(comms[r]); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func newInProcess(n int, timeout time.Duration) []Comm {
	if n < 1 {
		n = 1
	}
	w := &ipWorld{n: n, timeout: timeout, exited: make([]error, n), gone: make([]bool, n),
		exitCh: make(chan struct{}), groups: map[string]*ipGroup{}}
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	g := w.newGroup(ranks)
	comms := make([]Comm, n)
	for i := range comms {
		comms[i] = &ipComm{g: g, rank: i, seq: map[string]int{}}
	}
	return comms
}

// ipWorld is shared by every group of an in-process world.
type ipWorld struct {
	n       int
	timeout time.Duration

	mu     sync.Mutex
	gone   []bool        // rank's goroutine has returned
	exited []error       // and with what
	exitCh chan struct{} // closed and replaced on every exit
	groups map[string]*ipGroup
}

func (w *ipWorld) exit(r int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gone[r] = true
	w.exited[r] = err
	close(w.exitCh)
	w.exitCh = make(chan struct{})
}

// ipGroup is the shared state of one communicator.
type ipGroup struct {
	world *ipWorld
	ranks []int // world rank of each group rank
	n     int

	mu      sync.Mutex
	arrived int
	gen     []int64 // barriers entered, per rank
	done    chan struct{}
	bufs    [][]float32 // deposited by each rank for the current collective
	aux     []int
	p2p     [][]chan []float32 // [from][to]
	joined  int                // members that called Group; guarded by world.mu
}

func (w *ipWorld) newGroup(ranks []int) *ipGroup {
	n := len(ranks)
	g := &ipGroup{world: w, ranks: ranks, n: n, gen: make([]int64, n), done: make(chan struct{}),
		bufs: make([][]float32, n), aux: make([]int, n), p2p: make([][]chan []float32, n)}
	for i := range g.p2p {
		g.p2p[i] = make([]chan []float32, n)
		for j := range g.p2p[i] {
			g.p2p[i][j] = make(chan []float32, 64)
		}
	}
	return g
}

// wait is a barrier over the group with the world's timeout.
func (g *ipGroup) wait(rank int) error {
	g.mu.Lock()
	done := g.done
	g.gen[rank]++
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		close(g.done)
		g.done = make(chan struct{})
	}
	g.mu.Unlock()
	timer := time.NewTimer(g.world.timeout)
	defer timer.Stop()
	for {
		g.world.mu.Lock()
		exitCh := g.world.exitCh
		g.world.mu.Unlock()
		if err := g.goneLaggard(rank); err != nil {
			select {
			case <-done: // it arrived before leaving
				return nil
			default:
			}
			return err
		}
		select {
		case <-done:
			return nil
		case <-exitCh:
		case <-timer.C:
			return g.laggardError(rank, fmt.Errorf("%w after %v waiting in a collective", ErrTimeout, g.world.timeout))
		}
	}
}

// goneLaggard returns a *PeerError for a rank that has not reached the
// caller's barrier and whose goroutine has returned.
func (g *ipGroup) goneLaggard(rank int) error {
	g.mu.Lock()
	mine := g.gen[rank]
	var lag []int
	for i, c := range g.gen {
		if c < mine {
			lag = append(lag, i)
		}
	}
	g.mu.Unlock()
	g.world.mu.Lock()
	defer g.world.mu.Unlock()
	for _, i := range lag {
		wr := g.ranks[i]
		if g.world.gone[wr] {
			why := errors.New("returned before joining the collective")
			if e := g.world.exited[wr]; e != nil {
				why = fmt.Errorf("failed: %w", e)
			}
			return &PeerError{Rank: wr, Host: "in-process", Err: why}
		}
	}
	return nil
}

func (g *ipGroup) laggardError(rank int, err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	mine := g.gen[rank]
	for i, c := range g.gen {
		if c < mine {
			return &PeerError{Rank: g.ranks[i], Host: "in-process", Err: err}
		}
	}
	return err
}

// ipComm is one rank's handle on an ipGroup.
type ipComm struct {
	g      *ipGroup
	rank   int
	seq    map[string]int
	cnt    counters
	closed bool
}

func (c *ipComm) Rank() int    { return c.rank }
func (c *ipComm) Size() int    { return c.g.n }
func (c *ipComm) Stats() Stats { return c.cnt.snapshot() }

func (c *ipComm) Close() error {
	c.closed = true
	return nil
}

// exchange deposits buf (and an int) and waits for every rank to do so.
func (c *ipComm) exchange(buf []float32, aux int) error {
	if c.closed {
		return ErrClosed
	}
	c.g.mu.Lock()
	c.g.bufs[c.rank] = buf
	c.g.aux[c.rank] = aux
	c.g.mu.Unlock()
	return c.g.wait(c.rank)
}

// peers returns the deposited buffers; valid between the two barriers of
// a collective, when no rank writes the slice headers.
func (c *ipComm) peers() ([][]float32, []int) {
	c.g.mu.Lock()
	defer c.g.mu.Unlock()
	return append([][]float32(nil), c.g.bufs...), append([]int(nil), c.g.aux...)
}

func (c *ipComm) checkLens(bufs [][]float32, what string, want int) error {
	for i, b := range bufs {
		if len(b) != want {
			return fmt.Errorf("nccl: %s length mismatch: rank %d has %d elements, rank %d has %d", what, c.rank, want, i, len(b))
		}
	}
	return nil
}

func (c *ipComm) AllReduce(buf []float32, op Op) (err error) {
	defer c.cnt.add(kAllReduce, 4*len(buf), time.Now())
	if err := op.valid(); err != nil {
		return err
	}
	if err := c.exchange(buf, int(op)); err != nil {
		return err
	}
	bufs, ops := c.peers()
	err = c.checkLens(bufs, "AllReduce", len(buf))
	for i, o := range ops {
		if err == nil && o != int(op) {
			err = fmt.Errorf("nccl: AllReduce op mismatch: rank %d uses %v, rank %d uses %v", c.rank, op, i, Op(o))
		}
	}
	if err == nil {
		// Rank r reduces segment r and writes it to every rank's buffer.
		lo, hi := segment(len(buf), c.g.n, c.rank)
		acc := make([]float32, hi-lo)
		copy(acc, bufs[0][lo:hi])
		for _, b := range bufs[1:] {
			reduceInto(acc, b[lo:hi], op)
		}
		finish(acc, op, c.g.n)
		// No other rank reads or writes segment lo:hi of any buffer.
		for _, b := range bufs {
			copy(b[lo:hi], acc)
		}
	}
	if werr := c.g.wait(c.rank); werr != nil {
		return werr
	}
	return err
}

func (c *ipComm) AllGather(send, recv []float32) (err error) {
	defer c.cnt.add(kAllGather, 4*len(recv), time.Now())
	if err := checkAllGather(send, recv, c.g.n); err != nil {
		return err
	}
	if err := c.exchange(send, 0); err != nil {
		return err
	}
	bufs, _ := c.peers()
	err = c.checkLens(bufs, "AllGather send", len(send))
	if err == nil {
		for i, b := range bufs {
			copy(recv[i*len(send):], b)
		}
	}
	if werr := c.g.wait(c.rank); werr != nil {
		return werr
	}
	return err
}

func (c *ipComm) ReduceScatter(send, recv []float32, op Op) (err error) {
	defer c.cnt.add(kReduceScatter, 4*len(recv), time.Now())
	if err := op.valid(); err != nil {
		return err
	}
	if err := checkReduceScatter(send, recv, c.g.n); err != nil {
		return err
	}
	if err := c.exchange(send, int(op)); err != nil {
		return err
	}
	bufs, _ := c.peers()
	err = c.checkLens(bufs, "ReduceScatter send", len(send))
	if err == nil {
		lo, hi := c.rank*len(recv), (c.rank+1)*len(recv)
		copy(recv, bufs[0][lo:hi])
		for _, b := range bufs[1:] {
			reduceInto(recv, b[lo:hi], op)
		}
		finish(recv, op, c.g.n)
	}
	if werr := c.g.wait(c.rank); werr != nil {
		return werr
	}
	return err
}

func (c *ipComm) Broadcast(buf []float32, root int) (err error) {
	defer c.cnt.add(kBroadcast, 4*len(buf), time.Now())
	if err := checkRank("Broadcast root", root, c.g.n); err != nil {
		return err
	}
	if err := c.exchange(buf, root); err != nil {
		return err
	}
	bufs, roots := c.peers()
	err = c.checkLens(bufs, "Broadcast", len(buf))
	for i, r := range roots {
		if err == nil && r != root {
			err = fmt.Errorf("nccl: Broadcast root mismatch: rank %d uses %d, rank %d uses %d", c.rank, root, i, r)
		}
	}
	if err == nil && c.rank != root {
		copy(buf, bufs[root])
	}
	if werr := c.g.wait(c.rank); werr != nil {
		return werr
	}
	return err
}

func (c *ipComm) Barrier() error {
	defer c.cnt.add(kBarrier, 0, time.Now())
	if c.closed {
		return ErrClosed
	}
	return c.g.wait(c.rank)
}

func (c *ipComm) Send(buf []float32, to int) error {
	defer c.cnt.add(kSend, 4*len(buf), time.Now())
	if err := checkRank("Send to", to, c.g.n); err != nil {
		return err
	}
	if c.closed {
		return ErrClosed
	}
	msg := append([]float32(nil), buf...)
	timer := time.NewTimer(c.g.world.timeout)
	defer timer.Stop()
	select {
	case c.g.p2p[c.rank][to] <- msg:
		return nil
	case <-timer.C:
		return &PeerError{Rank: c.g.ranks[to], Host: "in-process", Err: fmt.Errorf("%w after %v: Send not received", ErrTimeout, c.g.world.timeout)}
	}
}

func (c *ipComm) Recv(buf []float32, from int) error {
	defer c.cnt.add(kRecv, 4*len(buf), time.Now())
	if err := checkRank("Recv from", from, c.g.n); err != nil {
		return err
	}
	if c.closed {
		return ErrClosed
	}
	timer := time.NewTimer(c.g.world.timeout)
	defer timer.Stop()
	for {
		c.g.world.mu.Lock()
		exitCh := c.g.world.exitCh
		gone := c.g.world.gone[c.g.ranks[from]]
		c.g.world.mu.Unlock()
		select {
		case msg := <-c.g.p2p[from][c.rank]:
			if len(msg) != len(buf) {
				return fmt.Errorf("nccl: Recv of %d elements from rank %d got a message of %d", len(buf), from, len(msg))
			}
			copy(buf, msg)
			return nil
		default:
		}
		if gone {
			return &PeerError{Rank: c.g.ranks[from], Host: "in-process", Err: errors.New("returned without sending")}
		}
		select {
		case msg := <-c.g.p2p[from][c.rank]:
			if len(msg) != len(buf) {
				return fmt.Errorf("nccl: Recv of %d elements from rank %d got a message of %d", len(buf), from, len(msg))
			}
			copy(buf, msg)
			return nil
		case <-exitCh:
		case <-timer.C:
			return &PeerError{Rank: c.g.ranks[from], Host: "in-process", Err: fmt.Errorf("%w after %v waiting in Recv", ErrTimeout, c.g.world.timeout)}
		}
	}
}

func (c *ipComm) Group(ranks []int) (Comm, error) {
	if c.closed {
		return nil, ErrClosed
	}
	pos, err := checkGroup(ranks, c.g.n, c.rank)
	if err != nil {
		return nil, err
	}
	world := make([]int, len(ranks))
	for i, r := range ranks {
		world[i] = c.g.ranks[r]
	}
	key := fmt.Sprint(world)
	seq := c.seq[key]
	c.seq[key] = seq + 1
	// The parent group is part of the key, as the TCP backend's id: a
	// group of the same ranks made from a sub-group is another group.
	key = fmt.Sprintf("%p/%s#%d", c.g, key, seq)
	w := c.g.world
	w.mu.Lock()
	g, ok := w.groups[key]
	if !ok {
		g = w.newGroup(world)
		w.groups[key] = g
	}
	if g.joined++; g.joined == g.n {
		delete(w.groups, key)
	}
	w.mu.Unlock()
	return &ipComm{g: g, rank: pos, seq: map[string]int{}}, nil
}

// segment returns the bounds of part i when n elements are cut into k
// near-equal parts (the first n%k parts one longer).
func segment(n, k, i int) (lo, hi int) {
	q, r := n/k, n%k
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}
