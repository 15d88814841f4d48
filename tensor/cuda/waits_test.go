package cuda

import (
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/hpcrun/hpcrun/tensor"
)

// fakeWatch is a WaitWatch that counts what the device tells it.
type fakeWatch struct {
	limit   time.Duration
	drained atomic.Int32
	stalled atomic.Int32
}

func (w *fakeWatch) WaitLimit() time.Duration { return w.limit }
func (w *fakeWatch) StreamDrained(uintptr)    { w.drained.Add(1) }
func (w *fakeWatch) StreamStalled(_ uintptr, waited time.Duration) error {
	w.stalled.Add(1)
	return errors.New("ncclAllReduce of group tp waited " + waited.String() + " for rank 1")
}

func noCuErr(fn string, r int32) error { return &Error{Call: fn, Code: int(r)} }

// A wait on a stream that never ends (an NCCL kernel whose peer never
// posts its call) gives up after the limit with the watch's error; one
// that ends says the stream drained; a failed query is the query's error.
// Before, every wait blocked in cuStreamSynchronize.
func TestPollStream(t *testing.T) {
	w := &fakeWatch{limit: 30 * time.Millisecond}
	start := time.Now()
	err := pollStream(func() int32 { return errNotReady }, noCuErr, 7, w, time.Sleep)
	if err == nil || !strings.Contains(err.Error(), "for rank 1") || w.stalled.Load() != 1 || w.drained.Load() != 0 {
		t.Fatalf("a stream that never ends: %v (stalled %d, drained %d)", err, w.stalled.Load(), w.drained.Load())
	}
	if d := time.Since(start); d < 2*w.limit || d > 2*w.limit+time.Second {
		t.Errorf("gave up after %v, want about %v (the limit, then as long for the aborted kernel)", d, 2*w.limit)
	}

	w = &fakeWatch{limit: time.Second}
	n := 0
	err = pollStream(func() int32 { n++; return map[bool]int32{true: errNotReady, false: 0}[n < 5] }, noCuErr, 7, w, time.Sleep)
	if err != nil || w.drained.Load() != 1 || w.stalled.Load() != 0 {
		t.Errorf("a stream that ends: %v (stalled %d, drained %d)", err, w.stalled.Load(), w.drained.Load())
	}

	// The stream ends once the watch aborted it: still the watch's error.
	w = &fakeWatch{limit: 10 * time.Millisecond}
	err = pollStream(func() int32 {
		if w.stalled.Load() > 0 {
			return 0
		}
		return errNotReady
	}, noCuErr, 7, w, time.Sleep)
	if err == nil || !strings.Contains(err.Error(), "ncclAllReduce") {
		t.Errorf("a stream aborted: %v", err)
	}

	err = pollStream(func() int32 { return 700 }, noCuErr, 7, &fakeWatch{limit: time.Second}, time.Sleep)
	var ce *Error
	if !errors.As(err, &ce) || ce.Call != "cuStreamQuery" || ce.Code != 700 {
		t.Errorf("a failed query: %v", err)
	}
}

// cbDriver is a driverAPI whose entry points are Go functions (purego
// callbacks): each returns its CUresult from rc and counts its calls.
type cbDriver struct {
	rc    map[string]int32
	calls map[string]*atomic.Int32
}

// fakeDrv and fakeAPI are the fake driver; callbacks are a process-wide
// resource, so fakeOnce makes them once.
var (
	fakeDrv = &cbDriver{rc: map[string]int32{}, calls: map[string]*atomic.Int32{}}
	fakeAPI driverAPI
)

var fakeOnce = func() func() {
	done := false
	return func() {
		if done {
			return
		}
		done = true
		cb := func(name string) uintptr {
			fakeDrv.calls[name] = &atomic.Int32{}
			return purego.NewCallback(func(a, b, c, d, e, f uintptr) uintptr {
				fakeDrv.calls[name].Add(1)
				return uintptr(uint32(fakeDrv.rc[name]))
			})
		}
		fakeAPI = driverAPI{
			ctxSetCurrent: cb("cuCtxSetCurrent"), launchKernel: cb("cuLaunchKernel"),
			streamSynchronize: cb("cuStreamSynchronize"), memFree: cb("cuMemFree_v2"),
			memFreeHost: cb("cuMemFreeHost"), primaryCtxRelease: cb("cuDevicePrimaryCtxRelease_v2"),
			memcpyDtoHAsync: cb("cuMemcpyDtoHAsync_v2"),
			getErrorName:    cb("cuGetErrorName"), getErrorString: cb("cuGetErrorString"),
		}
	}
}()

// fakeDevice is a Device on the fake driver, with every result rc (0:
// success) and the calls counted afresh.
func fakeDevice(t *testing.T, rc map[string]int32) *Device {
	fakeOnce()
	for k := range fakeDrv.rc {
		delete(fakeDrv.rc, k)
	}
	for k, v := range rc {
		fakeDrv.rc[k] = v
	}
	fakeDrv.rc["cuGetErrorName"], fakeDrv.rc["cuGetErrorString"] = 1, 1 // no names: "CUresult N"
	for _, c := range fakeDrv.calls {
		c.Store(0)
	}
	d := &Device{l: &libs{cu: fakeAPI}, ctx: 1, sms: 1, fn: map[string]uintptr{"fill_f32": 1}}
	for i := range d.argp {
		d.argp[i] = unsafe.Pointer(&d.argv[i])
	}
	d.alloc = newAllocator(d.memAlloc, d.memFree, d.streamSync)
	return d
}

// When the device's context cannot be made current, nothing is enqueued
// (before, the launch went to whatever context the thread had), Sync
// reports it once, and a copy to the host gives NaN.
func TestEnterWithoutContext(t *testing.T) {
	d := fakeDevice(t, map[string]int32{"cuCtxSetCurrent": 201})
	x := tensor.NewTensor(tensor.NewBuffer(d, 4, nil, 0x1000), 0, 4)
	d.Fill(x, 1)
	if n := fakeDrv.calls["cuLaunchKernel"].Load(); n != 0 {
		t.Errorf("%d launches without the context", n)
	}
	got := []float32{1, 2, 3, 4}
	d.CopyToHost(got, x)
	if !math.IsNaN(float64(got[0])) || fakeDrv.calls["cuMemcpyDtoHAsync_v2"].Load() != 0 {
		t.Errorf("CopyToHost without the context: %v, %d copies", got, fakeDrv.calls["cuMemcpyDtoHAsync_v2"].Load())
	}
	if err := d.Sync(); err == nil || !strings.Contains(err.Error(), "cuCtxSetCurrent") {
		t.Errorf("Sync: %v, want the cuCtxSetCurrent failure", err)
	}
	fakeDrv.rc["cuCtxSetCurrent"] = 0
	if err := d.Sync(); err != nil {
		t.Errorf("second Sync: %v", err)
	}
	d.Fill(x, 1)
	if n := fakeDrv.calls["cuLaunchKernel"].Load(); n != 1 {
		t.Errorf("%d launches with the context, want 1", n)
	}
}

// Close reports the frees the driver refused (before, cuMemFree and
// cuMemFreeHost results were dropped) and still releases the context.
func TestCloseReportsFrees(t *testing.T) {
	d := fakeDevice(t, map[string]int32{"cuMemFreeHost": 1, "cuMemFree_v2": 700})
	var host [16]int32
	d.ids = idRing{host: unsafe.Pointer(&host[0]), dev: 0x2000, n: 16}
	d.alloc.workspace(16 * 4)
	err := d.Close()
	for _, want := range []string{"cuMemFreeHost", "cuMemFree_v2"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Close: %v, want it to name %s", err, want)
		}
	}
	if fakeDrv.calls["cuDevicePrimaryCtxRelease_v2"].Load() != 1 {
		t.Error("the context was not released")
	}

	d = fakeDevice(t, map[string]int32{"cuCtxSetCurrent": 201})
	d.ids = idRing{host: unsafe.Pointer(&host[0]), dev: 0x2000, n: 16}
	if err := d.Close(); err == nil || !strings.Contains(err.Error(), "cuCtxSetCurrent") {
		t.Errorf("Close without the context: %v", err)
	}
	if n := fakeDrv.calls["cuMemFreeHost"].Load() + fakeDrv.calls["cuMemFree_v2"].Load(); n != 0 {
		t.Errorf("%d frees from another context", n)
	}
	if fakeDrv.calls["cuDevicePrimaryCtxRelease_v2"].Load() != 1 {
		t.Error("the context was not released")
	}
}
