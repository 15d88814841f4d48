package cuda

import (
	"fmt"

	"github.com/hpcrun/hpcrun/tensor"
)

// Shape checks are tensor/internal/check's, shared with the
// CPU device so a wrong shape panics the same way on every backend, before
// anything is enqueued. Only ownership is checked here, with this device's
// name in the message.

// own panics unless every tensor is a live Float32 tensor of this device.
func (d *Device) own(fn string, ts ...*tensor.Tensor) {
	d.ownAny(fn, ts...)
	for _, t := range ts {
		if t.DType() != tensor.Float32 {
			panic(fmt.Sprintf("tensor.%s: tensor %v stores %s; the kernel takes float32 tensors", fn, t, t.DType()))
		}
	}
}

// ownAny panics unless every tensor is a live tensor of this device, of
// any dtype.
func (d *Device) ownAny(fn string, ts ...*tensor.Tensor) {
	for _, t := range ts {
		if t == nil {
			panic(fmt.Sprintf("tensor.%s: nil tensor", fn))
		}
		if t.Device() != tensor.Device(d) {
			panic(fmt.Sprintf("tensor.%s: tensor %v is not on this cuda device", fn, t))
		}
		if t.Buffer().Freed() {
			panic(fmt.Sprintf("tensor.%s: tensor %v was freed", fn, t))
		}
	}
}

// ownHalf panics unless t is a live BFloat16 tensor of this device.
func (d *Device) ownHalf(fn string, t *tensor.Tensor) {
	d.ownAny(fn, t)
	if t.DType() != tensor.BFloat16 {
		panic(fmt.Sprintf("tensor.%s: tensor %v stores %s; want bfloat16", fn, t, t.DType()))
	}
}
