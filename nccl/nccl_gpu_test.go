package nccl

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/internal/cudalib"
)

// Without NCCL, choosing the backend fails with the reason; it is never
// silently replaced.
func TestNCCLUnavailableSaysWhy(t *testing.T) {
	reason := NCCLAvailable()
	if reason == nil {
		t.Skip("NCCL is available here")
	}
	_, err := Init(context.Background(), Options{Rank: 0, Size: 1, Backend: BackendNCCL})
	if err == nil || !strings.Contains(err.Error(), "libnccl") {
		t.Fatalf("Init with the NCCL backend and no NCCL: %v, want the reason (%v)", err, reason)
	}
}

type cudaRT struct {
	malloc    func(p *uintptr, size uintptr) int32
	free      func(p uintptr) int32
	memcpy    func(dst, src, size uintptr, kind int32) int32
	sync      func() int32
	setDevice func(dev int32) int32
	count     func(n *int32) int32
}

// loadCudaRT opens the CUDA runtime, looked for in cudalib's directories
// first (where the simulation's is), then by the dynamic linker.
func loadCudaRT(t *testing.T) *cudaRT {
	var cands []string
	names := []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}
	for _, d := range cudalib.SearchDirs() {
		for _, n := range names {
			cands = append(cands, filepath.Join(d.Path, n))
		}
	}
	for _, name := range append(cands, names...) {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			continue
		}
		rt := &cudaRT{}
		purego.RegisterLibFunc(&rt.malloc, h, "cudaMalloc")
		purego.RegisterLibFunc(&rt.free, h, "cudaFree")
		purego.RegisterLibFunc(&rt.memcpy, h, "cudaMemcpy")
		purego.RegisterLibFunc(&rt.sync, h, "cudaDeviceSynchronize")
		purego.RegisterLibFunc(&rt.setDevice, h, "cudaSetDevice")
		purego.RegisterLibFunc(&rt.count, h, "cudaGetDeviceCount")
		return rt
	}
	t.Skip("no CUDA runtime (libcudart) to allocate device buffers")
	return nil
}

func (rt *cudaRT) upload(t *testing.T, v []float32) uintptr {
	p, err := rt.put(v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.free(p) })
	return p
}

func (rt *cudaRT) download(t *testing.T, p uintptr, n int) []float32 {
	v, err := rt.get(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// put copies v into a new buffer on the calling thread's current device.
func (rt *cudaRT) put(v []float32) (uintptr, error) {
	return rt.putBytes(unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)))
}

// get waits for the current device and copies n floats at p to the host.
func (rt *cudaRT) get(p uintptr, n int) ([]float32, error) {
	b, err := rt.getBytes(p, 4*n)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n), nil
}

// One rank per GPU: on a one-GPU machine NCCL runs a world of one (it
// refuses the same GPU twice in a communicator).
func TestGPUNCCLOneRank(t *testing.T) {
	if err := NCCLAvailable(); err != nil {
		t.Skipf("NCCL backend unavailable: %v", err)
	}
	rt := loadCudaRT(t)
	c, err := Init(context.Background(), Options{Rank: 0, Size: 1, Backend: BackendNCCL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dc, ok := c.(DeviceComm)
	if !ok {
		t.Fatalf("NCCL backend returned %T, not a DeviceComm", c)
	}
	in := []float32{1, -2, 3.5, 4}
	src, dst := rt.upload(t, in), rt.upload(t, make([]float32, 4))
	for _, op := range []Op{Sum, Avg, Max} {
		if err := dc.AllReduceDevice(src, dst, 4, Float32, op, 0); err != nil {
			t.Fatal(err)
		}
		if got := rt.download(t, dst, 4); closeTo(got, in, 1, true) != nil {
			t.Fatalf("AllReduceDevice %v = %v, want %v", op, got, in)
		}
	}
	if err := dc.AllGatherDevice(src, dst, 4, Float32, 0); err != nil {
		t.Fatal(err)
	}
	if err := dc.ReduceScatterDevice(src, dst, 4, Float32, Sum, 0); err != nil {
		t.Fatal(err)
	}
	if err := dc.BroadcastDevice(src, dst, 4, Float32, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got := rt.download(t, dst, 4); closeTo(got, in, 1, true) != nil {
		t.Fatalf("BroadcastDevice = %v, want %v", got, in)
	}
	if st := c.Stats(); st.AllReduce.Calls != 3 || st.Broadcast.Calls != 1 {
		t.Fatalf("Stats = %+v", st)
	}
}

// Two ranks, one GPU each (NCCL refuses two ranks of a communicator on
// one GPU), exchange buffers with SendDevice and RecvDevice, rank 0
// sending first and rank 1 receiving first; both transfers are counted
// in Stats. With fewer than two GPUs it skips, which gpu-check allows
// for tests named TwoRanks.
func TestGPUNCCLSendRecvTwoRanks(t *testing.T) {
	if err := NCCLAvailable(); err != nil {
		t.Skipf("NCCL backend unavailable: %v", err)
	}
	rt := loadCudaRT(t)
	var n int32
	if r := rt.count(&n); r != 0 || n < 2 {
		t.Skipf("needs 2 GPUs, one a rank: %d visible (cudaGetDeviceCount error %d)", n, r)
	}
	port := freePort(t)
	msg := func(r int) []float32 { return []float32{float32(r) + 1, -2, 3.5 * float32(r+1), 4, float32(10 * r)} }
	got := make([][]float32, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[r], errs[r] = exchange(rt, r, port, msg(r))
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the exchange did not finish in 2 minutes: a send waits for a receive that never runs")
	}
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if want := msg(1 - r); closeTo(got[r], want, 1, true) != nil {
			t.Errorf("rank %d received %v, want %v", r, got[r], want)
		}
	}
}

// exchange is rank r of TestGPUNCCLSendRecvTwoRanks on GPU r: it sends
// mine to the other rank and returns what the other rank sent, then
// exchanges again with SendRecvDevice and checks it receives the same.
func exchange(rt *cudaRT, r, port int, mine []float32) ([]float32, error) {
	runtime.LockOSThread() // the CUDA runtime's current device is per thread
	defer runtime.UnlockOSThread()
	if e := rt.setDevice(int32(r)); e != 0 {
		return nil, fmt.Errorf("cudaSetDevice(%d): error %d", r, e)
	}
	c, err := Init(context.Background(), Options{Rank: r, Size: 2, MasterAddr: "127.0.0.1", MasterPort: port,
		Token: "test-token", Timeout: time.Minute, Backend: BackendNCCL, Device: r})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dc := c.(DeviceComm)
	src, err := rt.put(mine)
	if err != nil {
		return nil, err
	}
	defer rt.free(src)
	dst, err := rt.put(make([]float32, len(mine)))
	if err != nil {
		return nil, err
	}
	defer rt.free(dst)
	peer, n := 1-r, len(mine)
	send := func() error { return dc.SendDevice(src, n, Float32, peer, 0) }
	recv := func() error { return dc.RecvDevice(dst, n, Float32, peer, 0) }
	steps := []func() error{send, recv}
	if r == 1 {
		steps = []func() error{recv, send}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	got, err := rt.get(dst, n)
	if err != nil {
		return nil, err
	}
	if st := c.Stats(); st.Send.Calls != 1 || st.Recv.Calls != 1 || st.Send.Bytes != int64(4*n) || st.Recv.Bytes != int64(4*n) {
		return nil, fmt.Errorf("Stats: send %+v, recv %+v; want one call of %d bytes each", st.Send, st.Recv, 4*n)
	}
	if err := dc.SendDevice(src, n, Float32, r, 0); err == nil || !strings.Contains(err.Error(), "self") {
		return nil, fmt.Errorf("SendDevice to self: %v, want a refusal", err)
	}
	// Both ranks exchange in the same order: one NCCL group each.
	dst2, err := rt.put(make([]float32, n))
	if err != nil {
		return nil, err
	}
	defer rt.free(dst2)
	if err := dc.SendRecvDevice(src, dst2, n, Float32, Float32, peer, 0); err != nil {
		return nil, err
	}
	got2, err := rt.get(dst2, n)
	if err != nil {
		return nil, err
	}
	if closeTo(got2, got, 1, true) != nil {
		return nil, fmt.Errorf("SendRecvDevice received %v, SendDevice/RecvDevice %v", got2, got)
	}
	return got, nil
}

// A communicator setup that outlives its timeout (or the job's abort) is
// not leaked: when ncclCommInitRank returns at last, its communicator is
// handed to discard.
func TestInitCommDiscardsLateCommunicator(t *testing.T) {
	for _, abort := range []bool{false, true} {
		release := make(chan struct{})
		discarded := make(chan uintptr, 1)
		aborted := make(chan struct{})
		if abort {
			close(aborted)
		}
		init := func() (uintptr, error) { <-release; return 42, nil }
		comm, err := initComm(init, func(c uintptr) { discarded <- c }, 20*time.Millisecond, aborted)
		if comm != 0 || err == nil {
			t.Fatalf("abort %v: initComm = %d, %v; want an error", abort, comm, err)
		}
		if want := map[bool]error{false: ErrTimeout, true: errInitAborted}[abort]; !errors.Is(err, want) {
			t.Errorf("abort %v: %v, want %v", abort, err, want)
		}
		close(release)
		select {
		case c := <-discarded:
			if c != 42 {
				t.Errorf("abort %v: discarded %d, want 42", abort, c)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("abort %v: the late communicator was never discarded", abort)
		}
	}
	comm, err := initComm(func() (uintptr, error) { return 7, nil }, func(uintptr) { t.Error("discarded a communicator in time") }, time.Second, nil)
	if comm != 7 || err != nil {
		t.Errorf("in time: %d, %v", comm, err)
	}
}

// The NCCL backend binds each rank's device through the CUDA driver: where
// there is none, the reason names libcuda.so.1 instead of every rank
// silently binding device 0.
func TestNCCLDeviceBindingNeedsDriver(t *testing.T) {
	if _, err := loadDriver(); err == nil {
		t.Skip("the CUDA driver loads here")
	} else if !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Errorf("without a driver: %v, want it to name libcuda.so.1", err)
	}
	if err := NCCLAvailable(); err == nil {
		t.Error("NCCLAvailable says yes without a CUDA driver")
	}
}
