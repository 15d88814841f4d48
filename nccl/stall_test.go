package nccl

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeNCCL is an NCCL communicator of group rank me in a group of world
// ranks, on a fake libnccl and libcuda whose calls succeed unless rc
// says otherwise; aborts counts ncclCommAbort.
func fakeNCCL(t *testing.T, ranks []int, me int, rc map[string]int32) (*ncclComm, *atomic.Int32) {
	nd := &node{o: Options{Rank: ranks[me], Size: 8, Timeout: 50 * time.Millisecond}, errCh: make(chan struct{})}
	var aborts atomic.Int32
	ok := func(name string) int32 { return rc[name] }
	lib := &ncclLib{
		commDestroy: func(uintptr) int32 { return ok("ncclCommDestroy") },
		commAbort:   func(uintptr) int32 { aborts.Add(1); return ok("ncclCommAbort") },
		asyncError:  func(_ uintptr, r *int32) int32 { *r = 0; return 0 },
		errorString: func(r int32) string { return "fake NCCL error" },
		allReduce:   func(_, _, _ uintptr, _, _ int32, _, _ uintptr) int32 { return 0 },
		send:        func(_, _ uintptr, _, _ int32, _, _ uintptr) int32 { return 0 },
		recv:        func(_, _ uintptr, _, _ int32, _, _ uintptr) int32 { return 0 },
		groupStart:  func() int32 { return 0 },
		groupEnd:    func() int32 { return 0 },
	}
	drv := &cuDriver{
		deviceGet:  func(dev *int32, _ int32) int32 { *dev = 0; return 0 },
		ctxRelease: func(int32) int32 { return ok("cuDevicePrimaryCtxRelease") },
	}
	tc := &tcpComm{nd: nd, id: "tp-1", ranks: ranks, rank: me, n: len(ranks)}
	nc := &ncclComm{tcpComm: tc, lib: lib, drv: drv, comm: 1}
	nd.onAbort = append(nd.onAbort, nc.abort)
	return nc, &aborts
}

// A device wait past the limit aborts the job's NCCL communicators and
// names the first operation posted since the stream last drained and the
// peer it waited on; a drained stream forgets its operations.
func TestStreamStalledNamesOperationAndPeer(t *testing.T) {
	nc, aborts := fakeNCCL(t, []int{2, 5}, 0, nil)
	const stream = 42
	if err := nc.AllReduceDevice(0x100, 0x100, 4, Float32, Sum, stream); err != nil {
		t.Fatal(err)
	}
	nc.StreamDrained(stream)
	for range 3 {
		if err := nc.AllReduceDevice(0x100, 0x100, 4, Float32, Sum, stream); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.SendDevice(0x100, 4, Float32, 1, stream); err != nil {
		t.Fatal(err)
	}
	if nc.WaitLimit() != 50*time.Millisecond {
		t.Errorf("WaitLimit %v, want the comm timeout", nc.WaitLimit())
	}
	err := nc.StreamStalled(stream, 51*time.Millisecond)
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 5 || !errors.Is(err, ErrTimeout) {
		t.Fatalf("StreamStalled: %v, want a timeout naming rank 5", err)
	}
	for _, want := range []string{"ncclAllReduce of group tp-1 (world ranks 2,5) (3 times) waited 51ms", "rank 5, which never posted its call", "posted after it: ncclSend with rank 5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\nwant it to say %q", err, want)
		}
	}
	deadline := time.Now().Add(time.Second)
	for aborts.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if aborts.Load() != 1 {
		t.Errorf("%d ncclCommAbort calls, want 1", aborts.Load())
	}
	if err := nc.AllReduceDevice(0x100, 0x100, 4, Float32, Sum, stream); err == nil || !strings.Contains(err.Error(), "never posted") {
		t.Errorf("an operation after the abort: %v, want the job's failure", err)
	}
}

// A collective of three ranks waits on either of the other two.
func TestStallErrorCollectiveOfThree(t *testing.T) {
	pe := stallError(0, "on the device", time.Second, []postedOp{{what: "ncclAllGather", group: "dp", ranks: []int{0, 4, 8}, me: 0, peer: -1, n: 1}})
	if pe.Rank != 4 || !strings.Contains(pe.Error(), "one of ranks 4,8") {
		t.Errorf("%v", pe)
	}
	if pe := stallError(3, "on the device", time.Second, nil); pe.Rank != 3 || !strings.Contains(pe.Error(), "no NCCL operation pending") {
		t.Errorf("nothing pending: %v", pe)
	}
}

// Close reports a failed ncclCommDestroy and context release, and an
// abort's failures (before, their results were dropped).
func TestNCCLCloseReportsFailures(t *testing.T) {
	nc, _ := fakeNCCL(t, []int{0, 1}, 0, map[string]int32{"ncclCommDestroy": 3, "cuDevicePrimaryCtxRelease": 201})
	err := nc.Close()
	for _, want := range []string{"ncclCommDestroy", "cuDevicePrimaryCtxRelease(device 0) failed with CUresult 201"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Close: %v, want it to name %s", err, want)
		}
	}
	nc, _ = fakeNCCL(t, []int{0, 1}, 0, map[string]int32{"ncclCommAbort": 3})
	nc.abort()
	if err := nc.Close(); err == nil || !strings.Contains(err.Error(), "ncclCommAbort") {
		t.Errorf("Close after a failed abort: %v", err)
	}
}

// A call that blocks the host (ncclSend connecting to a peer that never
// posts its receive) is aborted after the comm timeout, and returns the
// job's failure naming it and the peer.
func TestBlockingCallIsBounded(t *testing.T) {
	nc, aborts := fakeNCCL(t, []int{1, 6}, 0, nil)
	released := make(chan struct{})
	nc.lib.send = func(_, _ uintptr, _, _ int32, _, _ uintptr) int32 { <-released; return 3 }
	nc.lib.commAbort = func(uintptr) int32 { aborts.Add(1); close(released); return 0 }
	start := time.Now()
	err := nc.SendDevice(0x100, 4, Float32, 1, 9)
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 6 || !strings.Contains(err.Error(), "ncclSend with rank 6 of group tp-1 waited") || !strings.Contains(err.Error(), "in the call") {
		t.Fatalf("SendDevice to a peer that never receives: %v", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v, want the comm timeout (50ms)", d)
	}
}
