package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/internal/cudalib"
)

// The NCCL backend: libnccl.so.2 (and the CUDA driver, libcuda.so.1, to
// make the rank's device current) are opened at run time with purego, found
// by package cudalib's rule (HPCRUN_CUDA_LIB_PATH, LD_LIBRARY_PATH, the
// python3 wheels, CUDA_HOME, the linker), so nothing of CUDA is needed to
// build.
// An NCCL communicator is made per group with ncclCommInitRank, its unique
// id passed through the rendezvous Store. Host-buffer collectives, Group
// bookkeeping, Stats and fault detection stay on the TCP/shared-memory
// communicator underneath; the Device methods run on NCCL. When the job
// aborts (a peer died or stalled), every NCCL communicator of the process is
// aborted with ncclCommAbort so that no kernel waits forever.

// ncclUniqueID mirrors ncclUniqueId: 128 opaque bytes, passed by value.
type ncclUniqueID struct{ Internal [128]byte }

type ncclLib struct {
	getUniqueID   func(id *ncclUniqueID) int32
	commInitRank  func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32
	commDestroy   func(comm uintptr) int32
	commAbort     func(comm uintptr) int32
	asyncError    func(comm uintptr, res *int32) int32
	errorString   func(res int32) string
	getVersion    func(v *int32) int32
	allReduce     func(send, recv, count uintptr, dt, op int32, comm, stream uintptr) int32
	allGather     func(send, recv, count uintptr, dt int32, comm, stream uintptr) int32
	reduceScatter func(send, recv, count uintptr, dt, op int32, comm, stream uintptr) int32
	broadcast     func(send, recv, count uintptr, dt, root int32, comm, stream uintptr) int32
	send          func(buf, count uintptr, dt, peer int32, comm, stream uintptr) int32 // nil: see p2pErr
	recv          func(buf, count uintptr, dt, peer int32, comm, stream uintptr) int32
	groupStart    func() int32
	groupEnd      func() int32
	lastError     func(comm uintptr) string // nil before NCCL 2.13
	p2pErr        error                     // why send and recv are nil
	version       int
}

var (
	ncclOnce   sync.Once
	ncclLoaded *ncclLib
	ncclErr    error
)

// NCCLAvailable loads libnccl.so.2 and the CUDA driver and returns nil, or
// the reason the NCCL backend cannot be used on this machine.
func NCCLAvailable() error {
	if _, err := loadNCCL(); err != nil {
		return err
	}
	_, err := loadDriver()
	return err
}

func loadNCCL() (*ncclLib, error) {
	ncclOnce.Do(func() { ncclLoaded, ncclErr = openNCCL() })
	return ncclLoaded, ncclErr
}

func openNCCL() (lib *ncclLib, err error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("nccl backend: needs Linux, not %s", runtime.GOOS)
	}
	h, found, err := cudalib.Open("NCCL", "install NCCL, or pip's nvidia-nccl-cu12 in the job's python3, or add its lib directory to "+cudalib.PathEnv, cudalib.Names("NCCL"), nil)
	if err != nil {
		return nil, fmt.Errorf("nccl backend: %w", err)
	}
	name := found.Path
	defer func() {
		if p := recover(); p != nil { // purego panics on a signature it cannot map
			lib, err = nil, fmt.Errorf("nccl backend: %v", p)
		}
	}()
	lib = &ncclLib{}
	for _, f := range []struct {
		fn   any
		name string
	}{
		{&lib.getUniqueID, "ncclGetUniqueId"}, {&lib.commInitRank, "ncclCommInitRank"},
		{&lib.commDestroy, "ncclCommDestroy"}, {&lib.commAbort, "ncclCommAbort"},
		{&lib.asyncError, "ncclCommGetAsyncError"}, {&lib.errorString, "ncclGetErrorString"},
		{&lib.getVersion, "ncclGetVersion"}, {&lib.allReduce, "ncclAllReduce"},
		{&lib.allGather, "ncclAllGather"}, {&lib.reduceScatter, "ncclReduceScatter"},
		{&lib.broadcast, "ncclBroadcast"}, {&lib.groupStart, "ncclGroupStart"},
		{&lib.groupEnd, "ncclGroupEnd"},
	} {
		sym, err := purego.Dlsym(h, f.name)
		if err != nil {
			return nil, fmt.Errorf("nccl backend: %s lacks %s: %w", name, f.name, err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	// Point-to-point (NCCL 2.7) is looked up apart: without it the
	// collectives still run, and SendDevice and RecvDevice say why not.
	for _, f := range []struct {
		fn   any
		name string
	}{{&lib.send, "ncclSend"}, {&lib.recv, "ncclRecv"}} {
		sym, err := purego.Dlsym(h, f.name)
		if err != nil {
			lib.send, lib.recv = nil, nil
			lib.p2pErr = fmt.Errorf("nccl: %s lacks %s, needed for point-to-point transfers on the device (NCCL 2.7 or later): %w", name, f.name, err)
			break
		}
		purego.RegisterFunc(f.fn, sym)
	}
	if sym, err := purego.Dlsym(h, "ncclGetLastError"); err == nil {
		purego.RegisterFunc(&lib.lastError, sym)
	}
	var v int32
	if r := lib.getVersion(&v); r != 0 {
		return nil, fmt.Errorf("nccl backend: ncclGetVersion: %s", lib.errorString(r))
	}
	lib.version = int(v)
	if lib.version < 21000 {
		return nil, fmt.Errorf("nccl backend: NCCL %d is too old: need 2.10 or later (bf16, avg)", lib.version)
	}
	return lib, nil
}

// check turns a call's ncclResult into an error that says what failed:
// NCCL's string for the result, and the detail NCCL keeps of its last
// failure (ncclGetLastError: "Duplicate GPU detected ...", an invalid
// argument's name), which the string alone only points to.
func (l *ncclLib) check(what string, r int32) error {
	if r == 0 {
		return nil
	}
	detail := ""
	if l.lastError != nil {
		if d := strings.TrimSpace(l.lastError(0)); d != "" {
			detail = ": " + d
		}
	}
	return fmt.Errorf("nccl: %s: %s (ncclResult %d)%s", what, l.errorString(r), r, detail)
}

// ncclComm is a DeviceComm: host collectives from the TCP communicator,
// device collectives from NCCL.
type ncclComm struct {
	*tcpComm
	lib  *ncclLib
	drv  *cuDriver
	dev  int // the CUDA device whose primary context the communicator holds
	comm uintptr
	mu   sync.Mutex // guards comm against a concurrent abort
	// abortErr is why an abort's ncclCommAbort or context release failed,
	// for Close to report.
	abortErr error
}

func ncclDType(dt DataType) (int32, int, error) {
	switch dt {
	case Float32:
		return 7, 4, nil
	case BFloat16:
		return 9, 2, nil
	case Float16:
		return 6, 2, nil
	}
	return 0, 0, fmt.Errorf("nccl: unknown data type %d", dt)
}

func ncclOp(op Op) (int32, error) {
	switch op {
	case Sum:
		return 0, nil
	case Max:
		return 2, nil
	case Avg:
		return 4, nil
	}
	if op.packed() {
		return 0, fmt.Errorf("nccl: %v is a host reduction of packed pairs: on a device use the bf16 data type with sum or avg", op)
	}
	return 0, op.valid()
}

// newNCCLComm makes the NCCL communicator of c's group: group rank 0 gets
// the unique id and publishes it in the Store under the group's id.
func newNCCLComm(c *tcpComm) (*ncclComm, error) {
	lib, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	nd := c.nd
	key := "nccl-id/" + c.id
	var id ncclUniqueID
	if c.rank == 0 {
		if err := lib.check("ncclGetUniqueId", lib.getUniqueID(&id)); err != nil {
			return nil, err
		}
		if nd.store != nil {
			if err := nd.store.Set(key, id.Internal[:]); err != nil {
				return nil, fmt.Errorf("nccl: publish unique id: %w", err)
			}
		}
	} else {
		v, err := nd.store.Get(key, nd.o.Timeout)
		if err != nil {
			return nil, fmt.Errorf("nccl: unique id of group %s from rank %d: %w", c.id, c.ranks[0], err)
		}
		if len(v) != len(id.Internal) {
			return nil, fmt.Errorf("nccl: unique id of group %s has %d bytes, want %d", c.id, len(v), len(id.Internal))
		}
		copy(id.Internal[:], v)
	}
	nc := &ncclComm{tcpComm: c, lib: lib, drv: drv, dev: nd.o.Device}
	// ncclCommInitRank binds to the calling thread's current device, and
	// blocks until every rank calls it: run it on a locked thread of its
	// own, with the rank's device current, so that a peer that never comes
	// is a timeout, not a hang.
	initRank := func() (uintptr, error) {
		if err := drv.retain(nd.o.Device); err != nil {
			return 0, err
		}
		var comm uintptr
		if err := lib.check("ncclCommInitRank", lib.commInitRank(&comm, int32(c.n), id, int32(c.rank))); err != nil {
			return 0, errors.Join(err, drv.release(nd.o.Device))
		}
		return comm, nil
	}
	discard := func(comm uintptr) { // a communicator made after we gave up
		// Nobody waits for this any more (the caller has its timeout or
		// abort error): a failure here has no one to go to.
		_ = errors.Join(lib.check("ncclCommAbort", lib.commAbort(comm)), drv.release(nd.o.Device))
	}
	nc.comm, err = initComm(initRank, discard, nd.o.Timeout, nd.errCh)
	switch {
	case errors.Is(err, errInitAborted):
		return nil, nd.abortErr()
	case errors.Is(err, ErrTimeout):
		return nil, fmt.Errorf("nccl: ncclCommInitRank of group %s: %w", c.id, err)
	case err != nil:
		return nil, err
	}
	nd.mu.Lock()
	nd.onAbort = append(nd.onAbort, nc.abort)
	nd.mu.Unlock()
	return nc, nil
}

// errInitAborted is initComm's answer when the job aborted first.
var errInitAborted = errors.New("nccl: job aborted during communicator setup")

// initComm runs init, which blocks until every rank of the group calls it,
// on a locked OS thread of its own, and waits at most timeout for it, or
// until aborted is closed. When it gives up, the communicator that init
// may still return is handed to discard, so that none is leaked.
func initComm(init func() (uintptr, error), discard func(uintptr), timeout time.Duration, aborted <-chan struct{}) (uintptr, error) {
	type result struct {
		comm uintptr
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		comm, err := init()
		done <- result{comm, err}
	}()
	reap := func() {
		if r := <-done; r.err == nil && r.comm != 0 {
			discard(r.comm)
		}
	}
	select {
	case r := <-done:
		return r.comm, r.err
	case <-aborted:
		go reap()
		return 0, errInitAborted
	case <-time.After(timeout):
		go reap()
		return 0, fmt.Errorf("%w after %v", ErrTimeout, timeout)
	}
}

// abort tears the NCCL communicator down without waiting for peers.
func (nc *ncclComm) abort() {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.comm != 0 {
		nc.abortErr = errors.Join(nc.lib.check("ncclCommAbort", nc.lib.commAbort(nc.comm)), nc.drv.release(nc.dev))
		nc.comm = 0
	}
}

// after checks a launched operation and the communicator's async state,
// and records it as posted on stream (peer: the group rank of a
// point-to-point transfer, -1 for a collective).
func (nc *ncclComm) after(what string, comm uintptr, r int32, stream uintptr, peer int) error {
	if err := nc.lib.check(what, r); err != nil {
		nc.abort()
		if e := nc.nd.abortErr(); e != nil {
			return e
		}
		return err
	}
	var async int32
	if r := nc.lib.asyncError(comm, &async); r != 0 || async != 0 && async != 7 /* ncclInProgress */ {
		if r == 0 {
			r = async
		}
		err := nc.lib.check(what+" (async)", r)
		nc.abort()
		if e := nc.nd.abortErr(); e != nil {
			return e
		}
		return err
	}
	nc.posted(what, stream, peer)
	return nil
}

// ready returns the NCCL communicator to launch on.
func (nc *ncclComm) ready() (uintptr, error) {
	if err := nc.start(); err != nil {
		return 0, err
	}
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.comm == 0 {
		if e := nc.nd.abortErr(); e != nil {
			return 0, e // why the job aborted: a lost peer, a stall
		}
		return 0, errors.New("nccl: communicator aborted")
	}
	return nc.comm, nil
}

func (nc *ncclComm) AllReduceDevice(send, recv uintptr, count int, dt DataType, op Op, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kAllReduce, size*count, time.Now())
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclAllReduce", -1, func() int32 { return nc.lib.allReduce(send, recv, uintptr(count), t, o, comm, stream) })
	return nc.after("ncclAllReduce", comm, r, stream, -1)
}

func (nc *ncclComm) AllGatherDevice(send, recv uintptr, sendcount int, dt DataType, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kAllGather, size*sendcount*nc.n, time.Now())
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclAllGather", -1, func() int32 { return nc.lib.allGather(send, recv, uintptr(sendcount), t, comm, stream) })
	return nc.after("ncclAllGather", comm, r, stream, -1)
}

func (nc *ncclComm) ReduceScatterDevice(send, recv uintptr, recvcount int, dt DataType, op Op, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kReduceScatter, size*recvcount, time.Now())
	o, err := ncclOp(op)
	if err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclReduceScatter", -1, func() int32 { return nc.lib.reduceScatter(send, recv, uintptr(recvcount), t, o, comm, stream) })
	return nc.after("ncclReduceScatter", comm, r, stream, -1)
}

func (nc *ncclComm) BroadcastDevice(send, recv uintptr, count int, dt DataType, root int, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kBroadcast, size*count, time.Now())
	if err := checkRank("BroadcastDevice root", root, nc.n); err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclBroadcast", -1, func() int32 { return nc.lib.broadcast(send, recv, uintptr(count), t, int32(root), comm, stream) })
	return nc.after("ncclBroadcast", comm, r, stream, -1)
}

// SendDevice sends count elements at buf to group rank peer (ncclSend).
func (nc *ncclComm) SendDevice(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kSend, size*count, time.Now())
	if err := nc.checkPeer("SendDevice to", peer); err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclSend", peer, func() int32 { return nc.lib.send(buf, uintptr(count), t, int32(peer), comm, stream) })
	return nc.after("ncclSend", comm, r, stream, peer)
}

// RecvDevice receives count elements from group rank peer into buf
// (ncclRecv).
func (nc *ncclComm) RecvDevice(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	t, size, err := ncclDType(dt)
	if err != nil {
		return err
	}
	defer nc.cnt.add(kRecv, size*count, time.Now())
	if err := nc.checkPeer("RecvDevice from", peer); err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	r := nc.bounded("ncclRecv", peer, func() int32 { return nc.lib.recv(buf, uintptr(count), t, int32(peer), comm, stream) })
	return nc.after("ncclRecv", comm, r, stream, peer)
}

// SendRecvDevice sends count elements of sendType at sendbuf to group
// rank peer and receives count elements of recvType from it into recvbuf
// as one NCCL group (ncclGroupStart, ncclSend, ncclRecv, ncclGroupEnd):
// the two transfers run together, so two ranks that exchange with each
// other never wait on each other's send.
func (nc *ncclComm) SendRecvDevice(sendbuf, recvbuf uintptr, count int, sendType, recvType DataType, peer int, stream uintptr) error {
	t, size, err := ncclDType(sendType)
	if err != nil {
		return err
	}
	rt, rsize, err := ncclDType(recvType)
	if err != nil {
		return err
	}
	start := time.Now()
	defer func() { // one call: its time counts once, as the send's
		nc.cnt.add(kSend, size*count, start)
		nc.cnt.add(kRecv, rsize*count, time.Now())
	}()
	if err := nc.checkPeer("SendRecvDevice with", peer); err != nil {
		return err
	}
	comm, err := nc.ready()
	if err != nil {
		return err
	}
	// NCCL keeps the open group per thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := nc.lib.check("ncclGroupStart", nc.lib.groupStart()); err != nil {
		return err
	}
	rs := nc.lib.send(sendbuf, uintptr(count), t, int32(peer), comm, stream)
	rr := int32(0)
	if rs == 0 {
		rr = nc.lib.recv(recvbuf, uintptr(count), rt, int32(peer), comm, stream)
	}
	re := nc.bounded("ncclSend+ncclRecv", peer, nc.lib.groupEnd) // always closes the group, even after a failed call
	for _, c := range []struct {
		what string
		r    int32
	}{{"ncclSend", rs}, {"ncclRecv", rr}} {
		if c.r != 0 {
			return nc.after(c.what, comm, c.r, stream, peer)
		}
	}
	return nc.after("ncclSend+ncclRecv", comm, re, stream, peer)
}

// checkPeer validates the peer of a point-to-point transfer. A transfer
// to self is refused as the host Send does: on its own (not in an NCCL
// group with its receive) it would wait forever.
func (nc *ncclComm) checkPeer(what string, peer int) error {
	if err := checkRank(what, peer, nc.n); err != nil {
		return err
	}
	if peer == nc.rank {
		return fmt.Errorf("nccl: %s self: use a device copy", what)
	}
	if nc.lib.send == nil || nc.lib.recv == nil {
		return nc.lib.p2pErr
	}
	return nil
}

// Group makes the sub-communicator on both sides: TCP and NCCL.
func (nc *ncclComm) Group(ranks []int) (Comm, error) {
	sub, err := nc.tcpComm.Group(ranks)
	if err != nil {
		return nil, err
	}
	d, err := newNCCLComm(sub.(*tcpComm))
	if err != nil {
		sub.Close()
		return nil, err
	}
	return d, nil
}

// Close destroys the NCCL communicator, then the host one; its error
// joins theirs, and an earlier abort's.
func (nc *ncclComm) Close() error {
	nc.mu.Lock()
	err := nc.abortErr
	if nc.comm != 0 {
		err = errors.Join(nc.lib.check("ncclCommDestroy", nc.lib.commDestroy(nc.comm)), nc.drv.release(nc.dev))
		nc.comm = 0
	}
	nc.abortErr = nil
	nc.mu.Unlock()
	return errors.Join(err, nc.tcpComm.Close())
}

var _ DeviceComm = (*ncclComm)(nil)
