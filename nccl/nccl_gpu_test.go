package nccl

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
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
	malloc func(p *uintptr, size uintptr) int32
	free   func(p uintptr) int32
	memcpy func(dst, src, size uintptr, kind int32) int32
	sync   func() int32
}

func loadCudaRT(t *testing.T) *cudaRT {
	for _, name := range []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"} {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			continue
		}
		rt := &cudaRT{}
		purego.RegisterLibFunc(&rt.malloc, h, "cudaMalloc")
		purego.RegisterLibFunc(&rt.free, h, "cudaFree")
		purego.RegisterLibFunc(&rt.memcpy, h, "cudaMemcpy")
		purego.RegisterLibFunc(&rt.sync, h, "cudaDeviceSynchronize")
		return rt
	}
	t.Skip("no CUDA runtime (libcudart) to allocate device buffers")
	return nil
}

func (rt *cudaRT) upload(t *testing.T, v []float32) uintptr {
	var p uintptr
	if r := rt.malloc(&p, uintptr(4*len(v))); r != 0 {
		t.Fatalf("cudaMalloc: error %d", r)
	}
	t.Cleanup(func() { rt.free(p) })
	if r := rt.memcpy(p, uintptr(unsafe.Pointer(&v[0])), uintptr(4*len(v)), 1); r != 0 {
		t.Fatalf("cudaMemcpy to device: error %d", r)
	}
	return p
}

func (rt *cudaRT) download(t *testing.T, p uintptr, n int) []float32 {
	rt.sync()
	v := make([]float32, n)
	if r := rt.memcpy(uintptr(unsafe.Pointer(&v[0])), p, uintptr(4*n), 2); r != 0 {
		t.Fatalf("cudaMemcpy to host: error %d", r)
	}
	return v
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
