package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/ebitengine/purego"
)

// The NCCL backend: libnccl.so.2 (and the CUDA runtime, to pick the device)
// are opened at run time with purego, so nothing of CUDA is needed to build.
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
	setDevice     func(dev int32) int32 // cudaSetDevice; nil without the CUDA runtime
	version       int
}

var (
	ncclOnce   sync.Once
	ncclLoaded *ncclLib
	ncclErr    error
)

// NCCLAvailable loads libnccl.so.2 and returns nil, or the reason the NCCL
// backend cannot be used on this machine.
func NCCLAvailable() error {
	_, err := loadNCCL()
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
	h, err := purego.Dlopen("libnccl.so.2", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("nccl backend: cannot load libnccl.so.2 (install NCCL or add it to LD_LIBRARY_PATH): %w", err)
	}
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
		{&lib.broadcast, "ncclBroadcast"},
	} {
		sym, err := purego.Dlsym(h, f.name)
		if err != nil {
			return nil, fmt.Errorf("nccl backend: libnccl.so.2 lacks %s: %w", f.name, err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	var v int32
	if r := lib.getVersion(&v); r != 0 {
		return nil, fmt.Errorf("nccl backend: ncclGetVersion: %s", lib.errorString(r))
	}
	lib.version = int(v)
	if lib.version < 21000 {
		return nil, fmt.Errorf("nccl backend: NCCL %d is too old: need 2.10 or later (bf16, avg)", lib.version)
	}
	for _, name := range []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"} {
		if rt, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			if sym, err := purego.Dlsym(rt, "cudaSetDevice"); err == nil {
				purego.RegisterFunc(&lib.setDevice, sym)
				break
			}
		}
	}
	return lib, nil
}

func (l *ncclLib) check(what string, r int32) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("nccl: %s: %s (ncclResult %d)", what, l.errorString(r), r)
}

// ncclComm is a DeviceComm: host collectives from the TCP communicator,
// device collectives from NCCL.
type ncclComm struct {
	*tcpComm
	lib  *ncclLib
	comm uintptr
	mu   sync.Mutex // guards comm against a concurrent abort
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
	return 0, op.valid()
}

// newNCCLComm makes the NCCL communicator of c's group: group rank 0 gets
// the unique id and publishes it in the Store under the group's id.
func newNCCLComm(c *tcpComm) (*ncclComm, error) {
	lib, err := loadNCCL()
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
	nc := &ncclComm{tcpComm: c, lib: lib}
	// ncclCommInitRank binds to the calling thread's current device, and
	// blocks until every rank calls it: run it on a locked thread of its
	// own so that a peer that never comes is a timeout, not a hang.
	type result struct {
		comm uintptr
		r    int32
		dev  int32
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if lib.setDevice != nil {
			if r := lib.setDevice(int32(nd.o.Device)); r != 0 {
				done <- result{dev: r}
				return
			}
		}
		var comm uintptr
		r := lib.commInitRank(&comm, int32(c.n), id, int32(c.rank))
		done <- result{comm: comm, r: r}
	}()
	select {
	case res := <-done:
		if res.dev != 0 {
			return nil, fmt.Errorf("nccl: cudaSetDevice(%d) failed with cudaError %d: check Options.Device and CUDA_VISIBLE_DEVICES", nd.o.Device, res.dev)
		}
		if err := lib.check("ncclCommInitRank", res.r); err != nil {
			return nil, err
		}
		nc.comm = res.comm
	case <-nd.errCh:
		return nil, nd.abortErr()
	case <-time.After(nd.o.Timeout):
		return nil, fmt.Errorf("nccl: ncclCommInitRank of group %s: %w after %v", c.id, ErrTimeout, nd.o.Timeout)
	}
	nd.mu.Lock()
	nd.onAbort = append(nd.onAbort, nc.abort)
	nd.mu.Unlock()
	return nc, nil
}

// abort tears the NCCL communicator down without waiting for peers.
func (nc *ncclComm) abort() {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	if nc.comm != 0 {
		nc.lib.commAbort(nc.comm)
		nc.comm = 0
	}
}

// after checks a launched operation and the communicator's async state.
func (nc *ncclComm) after(what string, comm uintptr, r int32) error {
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
	return nc.after("ncclAllReduce", comm, nc.lib.allReduce(send, recv, uintptr(count), t, o, comm, stream))
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
	return nc.after("ncclAllGather", comm, nc.lib.allGather(send, recv, uintptr(sendcount), t, comm, stream))
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
	return nc.after("ncclReduceScatter", comm, nc.lib.reduceScatter(send, recv, uintptr(recvcount), t, o, comm, stream))
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
	return nc.after("ncclBroadcast", comm, nc.lib.broadcast(send, recv, uintptr(count), t, int32(root), comm, stream))
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

// Close destroys the NCCL communicator, then the host one.
func (nc *ncclComm) Close() error {
	nc.mu.Lock()
	if nc.comm != 0 {
		nc.lib.commDestroy(nc.comm)
		nc.comm = 0
	}
	nc.mu.Unlock()
	return nc.tcpComm.Close()
}

var _ DeviceComm = (*ncclComm)(nil)
