package nccl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Backend names accepted by Options.Backend.
const (
	// BackendAuto is the TCP ring plus the shared-memory path for groups
	// whose ranks all run on one host (the default).
	BackendAuto = "auto"
	// BackendTCP is the TCP ring only, even on one host.
	BackendTCP = "tcp"
	// BackendNCCL adds NCCL device collectives (DeviceComm) on top of the
	// host ones; Init fails with the reason when NCCL cannot be loaded.
	BackendNCCL = "nccl"
)

// Options configure Init. Rank, Size, MasterAddr, MasterPort and Token are
// required (Size 1 needs no master).
type Options struct {
	Rank, Size int
	MasterAddr string // host of rank 0, where the Store listens
	MasterPort int
	Token      string        // per-job secret shared by all ranks
	Timeout    time.Duration // bound on every wait for a peer; default DefaultTimeout
	Backend    string        // BackendAuto (default), BackendTCP or BackendNCCL
	// ListenHost is the address peers dial to reach this rank; by default
	// the local address of the route to the master.
	ListenHost string
	// Device is the CUDA device the NCCL backend binds to (usually the
	// local rank, or 0 when Slurm gives each task one visible GPU).
	Device int
	// Listener, when set, is rank 0's Store listener, already bound to
	// MasterPort (handed over by the launcher): rank 0 serves on it
	// instead of binding the port itself, and closes it.
	Listener net.Listener
	// Log, when set, gets one line a group from the group's first rank
	// saying how its collectives travel (shared memory, TCP, or both).
	Log io.Writer
}

func (o *Options) check() error {
	if o.Size < 1 {
		return fmt.Errorf("nccl: world size %d: need at least 1", o.Size)
	}
	if o.Rank < 0 || o.Rank >= o.Size {
		return fmt.Errorf("nccl: rank %d out of range for world size %d", o.Rank, o.Size)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < 0 {
		return fmt.Errorf("nccl: negative timeout %v", o.Timeout)
	}
	switch o.Backend {
	case "":
		o.Backend = BackendAuto
	case BackendAuto, BackendTCP, BackendNCCL:
	default:
		return fmt.Errorf("nccl: unknown backend %q: use auto, tcp or nccl", o.Backend)
	}
	if o.Size == 1 {
		return nil
	}
	if o.MasterAddr == "" {
		return errors.New("nccl: no master address: set MasterAddr (the host of rank 0)")
	}
	if o.MasterPort < 1 || o.MasterPort > 65535 {
		return fmt.Errorf("nccl: master port %d out of range 1..65535", o.MasterPort)
	}
	if o.Token == "" {
		return errors.New("nccl: empty job token: every rank needs the same secret Token")
	}
	return nil
}

// Init joins the world of o.Size ranks: rank 0 serves the rendezvous Store
// at MasterAddr:MasterPort, every rank publishes where it listens, and the
// world communicator is connected. It returns when every rank has joined,
// or an error after o.Timeout or when ctx ends (ctx also bounds the
// connection setup of later Group calls, not the collectives).
func Init(ctx context.Context, o Options) (Comm, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	nd, err := newNode(ctx, o)
	if err != nil {
		return nil, err
	}
	ranks := make([]int, o.Size)
	for i := range ranks {
		ranks[i] = i
	}
	c, err := nd.newComm("w", ranks, o.Rank)
	if err == nil {
		c.logPath("world")
	}
	if err != nil {
		nd.close()
		return nil, err
	}
	c.world = true
	if o.Backend == BackendNCCL {
		dc, err := newNCCLComm(c)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
		}
		return dc, nil
	}
	return c, nil
}

type peerInfo struct {
	host   string // hostname, for messages
	hostID string // hostname and boot id: equal means same machine
	addr   string // host:port of its listener
}

// node is the per-process side of a world: the Store connections, the
// listener every group's connections arrive on, and the abort state.
type node struct {
	o      Options
	self   peerInfo
	peers  []peerInfo
	server *StoreServer
	store  *Store // requests
	watch  *Store // registered watch connection: pings
	waiter *Store // blocks on AbortKey
	ln     net.Listener

	mu      sync.Mutex
	pending map[connKey]chan net.Conn
	conns   map[net.Conn]bool
	shms    map[*shmGroup]bool
	onAbort []func()  // NCCL communicators to abort
	streams streamLog // NCCL operations posted per stream, for a stalled device wait
	err     error
	errCh   chan struct{}
	closing bool
	settle  sync.Once
	stop    chan struct{}
	ctx     context.Context // Init's: ends connection setups
	wg      sync.WaitGroup
}

type connKey struct {
	group string
	from  int
	kind  byte
}

// testHostID, when set by a test, pretends that ranks run on the hosts it
// names, to exercise the multi-host paths on one machine.
var testHostID func(rank int) string

func hostIdentity() (host, id string) {
	host, _ = os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return host, host + "/" + strings.TrimSpace(string(boot))
}

func newNode(ctx context.Context, o Options) (*node, error) {
	nd := &node{o: o, pending: map[connKey]chan net.Conn{}, conns: map[net.Conn]bool{},
		shms: map[*shmGroup]bool{}, errCh: make(chan struct{}), stop: make(chan struct{}), ctx: ctx}
	nd.self.host, nd.self.hostID = hostIdentity()
	if testHostID != nil {
		nd.self.hostID = testHostID(o.Rank)
	}
	if o.Listener != nil && (o.Rank != 0 || o.Size == 1) {
		o.Listener.Close() // only rank 0 of a world serves the Store
	}
	if o.Size == 1 {
		nd.peers = []peerInfo{nd.self}
		return nd, nil
	}
	ok := false
	defer func() {
		if !ok {
			nd.close()
		}
	}()
	master := net.JoinHostPort(o.MasterAddr, strconv.Itoa(o.MasterPort))
	var err error
	if o.Rank == 0 {
		if o.Listener != nil {
			nd.server, err = ServeStoreOn(o.Listener, o.Token, o.Timeout/2)
		} else {
			nd.server, err = ServeStore(master, o.Token, o.Timeout/2)
		}
		if err != nil {
			return nil, fmt.Errorf("nccl: rank 0: %w", err)
		}
	}
	dial := func() (*Store, error) { return DialStore(ctx, master, o.Token, o.Timeout) }
	if nd.store, err = dial(); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
	}
	// The watch connection answers pings within half the timeout, so that
	// a stalled rank 0 is named before the collectives time out.
	if nd.watch, err = DialStore(ctx, master, o.Token, o.Timeout/2); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
	}
	if nd.waiter, err = dial(); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
	}
	if err := nd.watch.Register(o.Rank, nd.self.host); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
	}

	listenHost := o.ListenHost
	if listenHost == "" {
		listenHost = routeTo(master)
	}
	if nd.ln, err = net.Listen("tcp", net.JoinHostPort(listenHost, "0")); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: listen: %w", o.Rank, err)
	}
	nd.self.addr = nd.ln.Addr().String()
	if ip := nd.ln.Addr().(*net.TCPAddr).IP; ip.IsUnspecified() {
		// Listening everywhere (no route to the master?): peers dial our name.
		nd.self.addr = net.JoinHostPort(nd.self.host, strconv.Itoa(nd.ln.Addr().(*net.TCPAddr).Port))
	}
	nd.wg.Add(3)
	go nd.accept()
	go nd.heartbeat()
	go nd.waitAbort()

	rec := nd.self.host + "\x00" + nd.self.hostID + "\x00" + nd.self.addr
	if err := nd.store.Set("peer/"+strconv.Itoa(o.Rank), []byte(rec)); err != nil {
		return nil, fmt.Errorf("nccl: rank %d: %w", o.Rank, err)
	}
	nd.peers = make([]peerInfo, o.Size)
	deadline := time.Now().Add(o.Timeout)
	for r := range o.Size {
		var v []byte
		for {
			// Short waits, so that a cancelled ctx is noticed.
			v, err = nd.store.Get("peer/"+strconv.Itoa(r), max(min(time.Until(deadline), time.Second), time.Millisecond))
			if err == nil || !errors.Is(err, ErrTimeout) || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
		}
		if err != nil {
			if e := nd.abortErr(); e != nil {
				return nil, fmt.Errorf("nccl: rank %d: rendezvous: %w", o.Rank, e)
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("nccl: rank %d: rendezvous: %w", o.Rank, ctx.Err())
			}
			return nil, fmt.Errorf("nccl: rank %d: rank %d did not join within %v: %w", o.Rank, r, o.Timeout, err)
		}
		p := splitN(string(v), 3)
		nd.peers[r] = peerInfo{host: p[0], hostID: p[1], addr: p[2]}
	}
	ok = true
	return nd, nil
}

// routeTo returns the local address used to reach addr (no packet is sent).
func routeTo(addr string) string {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return ""
	}
	defer c.Close()
	h, _, _ := net.SplitHostPort(c.LocalAddr().String())
	return h
}

// heartbeat pings the Store so that the server can tell a stalled rank.
func (nd *node) heartbeat() {
	defer nd.wg.Done()
	every := min(nd.o.Timeout/8, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-nd.stop:
			return
		case <-t.C:
		}
		if err := nd.watch.Ping(); err != nil {
			// A closed Store is waitAbort's to report: it reads any abort
			// record sent before the close. A Store that stopped
			// answering is a stalled rank 0.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				nd.storeLost(err)
			}
			return
		}
	}
}

// waitAbort blocks on the Store's abort record.
func (nd *node) waitAbort() {
	defer nd.wg.Done()
	for {
		v, err := nd.waiter.Get(AbortKey, time.Minute)
		select {
		case <-nd.stop:
			return
		default:
		}
		if err == nil {
			nd.abortLocal(decodeAbort(v))
			return
		}
		if !errors.Is(err, ErrTimeout) {
			nd.storeLost(err)
			return
		}
	}
}

func (nd *node) storeLost(err error) {
	nd.mu.Lock()
	closing := nd.closing
	nd.mu.Unlock()
	if closing {
		return
	}
	nd.abortLocal(&PeerError{Rank: 0, Host: nd.peer(0).host, Err: fmt.Errorf("rendezvous store unreachable (rank 0 exited or stalled?): %v", err)})
}

func (nd *node) peer(r int) peerInfo {
	if r >= 0 && r < len(nd.peers) {
		return nd.peers[r]
	}
	return peerInfo{}
}

// abortErr is the job's failure, once known. On rank 0 it first lets the
// Store deliver the failure to every rank: the caller may exit next, and
// the Store with it.
func (nd *node) abortErr() error {
	nd.mu.Lock()
	err := nd.err
	nd.mu.Unlock()
	if err != nil && nd.server != nil {
		nd.settle.Do(func() { nd.server.waitAbortDelivered(time.Second) })
	}
	return err
}

// abortLocal records err as the job's failure and unblocks every pending
// read, write and shared-memory wait of this process.
func (nd *node) abortLocal(err error) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.err != nil {
		return
	}
	nd.err = err
	close(nd.errCh)
	past := time.Unix(1, 0)
	for c := range nd.conns {
		c.SetDeadline(past)
	}
	for g := range nd.shms {
		g.wakeAll()
	}
	for _, f := range nd.onAbort {
		go f()
	}
}

// Abort makes err, a failure of this rank's own (not a peer's), the job's:
// it is published as the job's abort naming this rank and its host, so that
// every other rank's pending and later operations fail within moments with
// a *PeerError quoting it, instead of waiting on this rank until they time
// out and blaming whoever they waited on. The first failure of the job
// wins: Abort returns the job's failure. Call it on the world communicator
// (or any group of it) before Close when a rank gives up; an in-process
// world learns of a rank's error when its goroutine returns, and Abort
// only returns err there.
func Abort(c Comm, err error) error {
	var nd *node
	switch c := c.(type) {
	case *tcpComm:
		nd = c.nd
	case *ncclComm:
		nd = c.nd
	}
	if nd == nil || err == nil {
		return err
	}
	var pe *PeerError
	if errors.As(err, &pe) {
		return err // a peer's failure is already the job's
	}
	if nd.store == nil { // a world of one
		return err
	}
	return nd.fail(&PeerError{Rank: nd.o.Rank, Host: nd.self.host, Err: err})
}

// fail reports a failure this rank observed; the first failure recorded
// in the Store wins, so that every rank names the same culprit.
func (nd *node) fail(pe *PeerError) error {
	if err := nd.abortErr(); err != nil {
		return err
	}
	var err error = pe
	if nd.store != nil {
		mine := encodeAbort(pe)
		v, e := nd.store.SetIfAbsent(AbortKey, mine)
		if e == nil && string(v) != string(mine) {
			err = decodeAbort(v)
		} else if e != nil {
			// The Store is gone, maybe with an abort record that
			// waitAbort is reading now: let it speak first.
			select {
			case <-nd.errCh:
			case <-time.After(time.Second):
			}
		}
	}
	nd.abortLocal(err)
	return nd.abortErr()
}

func (nd *node) track(c net.Conn) {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	nd.conns[c] = true
	if nd.err != nil {
		c.SetDeadline(time.Unix(1, 0))
	}
}

func (nd *node) untrack(c net.Conn) {
	nd.mu.Lock()
	delete(nd.conns, c)
	nd.mu.Unlock()
	c.Close()
}

func (nd *node) close() error {
	nd.mu.Lock()
	if nd.closing {
		nd.mu.Unlock()
		return nil
	}
	nd.closing = true
	failed := nd.err != nil
	nd.mu.Unlock()
	// After a failure nobody waits for anybody: the others are failing too.
	if nd.watch != nil && !failed {
		nd.watch.Goodbye()
	}
	if nd.server != nil {
		wait := nd.o.Timeout
		if failed {
			nd.server.waitAbortDelivered(time.Second)
			wait = 0
		}
		nd.server.WaitGoodbyes(wait)
	}
	close(nd.stop)
	for _, s := range []*Store{nd.store, nd.watch, nd.waiter} {
		if s != nil {
			s.Close()
		}
	}
	if nd.ln != nil {
		nd.ln.Close()
	}
	nd.wg.Wait()
	nd.mu.Lock()
	for c := range nd.conns {
		c.Close()
	}
	for _, ch := range nd.pending {
		select {
		case c := <-ch:
			c.Close()
		default:
		}
	}
	nd.mu.Unlock()
	if nd.server != nil {
		nd.server.Close()
	}
	return nil
}
