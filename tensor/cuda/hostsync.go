package cuda

import (
	"math"
	"unsafe"

	"github.com/hpcrun/hpcrun/tensor"
)

// HostSyncs is the number of times the host has waited for the device's
// stream since Open: Sync, copies to the host, and the waits
// of scratch growth and of the id ring. A training step on the GPU path
// makes one (Fetch); the step metrics report the count.
func (d *Device) HostSyncs() int64 { return d.syncs.Load() }

// Fetch copies src into dst after every enqueued operation and returns
// the first error since the last Sync, as Sync does: the one host
// synchronisation of a training step (its loss and norm), where CopyToHost
// then Sync would wait twice. On an error dst holds NaNs.
func (d *Device) Fetch(dst []float32, src *tensor.Tensor) error {
	d.own("Fetch", src)
	if len(dst) != src.Len() {
		panic("tensor.Fetch: len(dst) differs from src's")
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	if len(dst) > 0 {
		d.fail(d.l.cuErr("cuMemcpyDtoHAsync_v2", call(d.l.cu.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), src.Ptr(), uintptr(len(dst)*4), d.stream)))
	}
	d.fail(d.streamSync())
	err := d.err
	d.err = nil
	if err != nil {
		for i := range dst {
			dst[i] = float32(math.NaN())
		}
	}
	return err
}

// SumTo adds alpha times the sum of x's elements to out[0] (out[0] is set
// when not accumulate), summed in float64 in a fixed order: a mean loss
// kept on the device across micro-batches. It enqueues and returns.
func (d *Device) SumTo(out *tensor.Tensor, alpha float32, accumulate bool, x *tensor.Tensor) {
	d.own("SumTo", out, x)
	if out.Len() < 1 {
		panic("tensor.SumTo: out is empty")
	}
	if d.enter() != nil {
		return
	}
	defer d.leave()
	part, counts, err := d.sumPartials([]*tensor.Tensor{x}, false)
	if err != nil {
		d.fail(err)
		return
	}
	d.launch("sum_finish_f32", dim3{1, 1, 1}, dim3{1, 1, 1}, tp(out), ptr(part), i32(counts[0]), f32(alpha), i32(boolInt(accumulate)))
}

// boolInt is 1 for true, a kernel's int flag.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
