package tensor

import (
	"fmt"
	"strings"
)

// Buffer is one allocation on a device. Tensors are contiguous views into a
// Buffer; the Buffer is what Device.Free releases. Its storage is opaque to
// callers: a host slice on the CPU device, a device address on others.
type Buffer struct {
	dev   Device
	dtype DType
	host  []float32 // CPU storage of a Float32 buffer; nil on other devices
	half  []uint16  // CPU storage of a BFloat16 buffer; nil on other devices
	ptr   uintptr   // device address of element 0; 0 on the CPU device
	n     int       // elements
	freed bool
}

// NewBuffer wraps storage a Device allocated. Backends call it from Alloc:
// host is the storage on the CPU device (len(host) == n), ptr the device
// address of element 0 on others. Layers never call it.
func NewBuffer(dev Device, n int, host []float32, ptr uintptr) *Buffer {
	if host != nil && len(host) != n {
		panic(fmt.Sprintf("tensor.NewBuffer: len(host)=%d, want %d", len(host), n))
	}
	return &Buffer{dev: dev, host: host, ptr: ptr, n: n}
}

// NewBF16Buffer is NewBuffer for a BFloat16 buffer: host is the CPU
// device's storage (len(host) == n), ptr the device address of element 0
// on others.
func NewBF16Buffer(dev Device, n int, host []uint16, ptr uintptr) *Buffer {
	if host != nil && len(host) != n {
		panic(fmt.Sprintf("tensor.NewBF16Buffer: len(host)=%d, want %d", len(host), n))
	}
	return &Buffer{dev: dev, dtype: BFloat16, half: host, ptr: ptr, n: n}
}

// DType is how the buffer stores its elements.
func (b *Buffer) DType() DType { return b.dtype }

// Bytes is the buffer's size in bytes.
func (b *Buffer) Bytes() int64 { return int64(b.n) * int64(b.dtype.Size()) }

// Device is the device the buffer lives on.
func (b *Buffer) Device() Device { return b.dev }

// Len is the number of elements in the buffer.
func (b *Buffer) Len() int { return b.n }

// Freed reports whether the buffer was released with Device.Free.
func (b *Buffer) Freed() bool { return b.freed }

// MarkFreed records that the device released the buffer; backends call it
// from Free. It reports false when the buffer was already freed.
func (b *Buffer) MarkFreed() bool {
	if b.freed {
		return false
	}
	b.freed = true
	b.host, b.half = nil, nil
	return true
}

// Host is a Float32 buffer's host storage: valid only on the CPU device
// (nil elsewhere, for a BFloat16 buffer, and after Free).
func (b *Buffer) Host() []float32 { return b.host }

// HostBF16 is the bfloat16 elements of a host-memory buffer (the CPU
// device's) stored as BFloat16, nil otherwise.
func (b *Buffer) HostBF16() []uint16 { return b.half }

// Ptr is the device address of element 0 (0 on the CPU device).
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Tensor is a contiguous, row-major view of the elements of a Buffer:
// a shape and an element offset. Views share storage with the tensor they
// come from; none of them owns it. A Tensor is a small value behind a
// pointer: make views once (at model setup, llm.c style) and reuse them; the
// kernels themselves never allocate.
type Tensor struct {
	buf   *Buffer
	off   int
	n     int
	shape []int
}

// NewTensor makes a tensor that views n = prod(shape) elements of buf
// starting at element off. Backends call it from Alloc; layers use View and
// Reshape.
func NewTensor(buf *Buffer, off int, shape ...int) *Tensor {
	n, err := shapeLen(shape)
	if err != nil {
		panic("tensor.NewTensor: " + err.Error())
	}
	if off < 0 || off+n > buf.n {
		panic(fmt.Sprintf("tensor.NewTensor: view [%d,%d) is outside the buffer of %d elements", off, off+n, buf.n))
	}
	return &Tensor{buf: buf, off: off, n: n, shape: append([]int(nil), shape...)}
}

// shapeLen is the element count of shape, or an error for a negative dimension.
func shapeLen(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		n *= d
	}
	return n, nil
}

// Device is the device holding the tensor's storage.
func (t *Tensor) Device() Device { return t.buf.dev }

// Buffer is the allocation the tensor views.
func (t *Tensor) Buffer() *Buffer { return t.buf }

// Offset is the element offset of the tensor's first element in its Buffer.
func (t *Tensor) Offset() int { return t.off }

// Len is the number of elements, the product of the shape.
func (t *Tensor) Len() int { return t.n }

// Bytes is the size of the tensor's elements in bytes.
func (t *Tensor) Bytes() int64 { return int64(t.n) * int64(t.buf.dtype.Size()) }

// DType is how the tensor's buffer stores its elements.
func (t *Tensor) DType() DType { return t.buf.dtype }

// Shape is the tensor's shape. The slice is the tensor's own: do not modify it.
func (t *Tensor) Shape() []int { return t.shape }

// Rank is the number of dimensions.
func (t *Tensor) Rank() int { return len(t.shape) }

// Dim is the size of dimension i; negative i counts from the end (-1 is the
// last dimension).
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	if i < 0 || i >= len(t.shape) {
		panic(fmt.Sprintf("tensor: dimension %d of a rank-%d tensor", i, len(t.shape)))
	}
	return t.shape[i]
}

// Cols is the last dimension (1 for a scalar): the row length when the
// tensor is seen as a matrix.
func (t *Tensor) Cols() int {
	if len(t.shape) == 0 {
		return 1
	}
	return t.shape[len(t.shape)-1]
}

// Rows is Len()/Cols(): every leading dimension flattened, the row count when
// the tensor is seen as a matrix.
func (t *Tensor) Rows() int {
	if c := t.Cols(); c > 0 {
		return t.n / c
	}
	return 0
}

// View is the contiguous tensor of the given shape that starts offset
// elements after t's first element; it must lie inside t. It shares t's
// storage. For example the per-layer slices of one flat parameter tensor.
func (t *Tensor) View(offset int, shape ...int) *Tensor {
	n, err := shapeLen(shape)
	if err != nil {
		panic("tensor.View: " + err.Error())
	}
	if offset < 0 || offset+n > t.n {
		panic(fmt.Sprintf("tensor.View: [%d,%d) is outside a tensor of %d elements %v", offset, offset+n, t.n, t.shape))
	}
	return &Tensor{buf: t.buf, off: t.off + offset, n: n, shape: append([]int(nil), shape...)}
}

// Reshape is a view of t with another shape of the same number of elements.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	n, err := shapeLen(shape)
	if err != nil {
		panic("tensor.Reshape: " + err.Error())
	}
	if n != t.n {
		panic(fmt.Sprintf("tensor.Reshape: %v has %d elements, the tensor %v has %d", shape, n, t.shape, t.n))
	}
	return &Tensor{buf: t.buf, off: t.off, n: n, shape: append([]int(nil), shape...)}
}

// Host is the tensor's elements in host memory. It is valid only on the CPU
// device, where kernels and Host share the same memory; on any other device
// it panics (copy with Device.CopyToHost instead).
func (t *Tensor) Host() []float32 {
	if t.buf.host == nil {
		t.noHost("Host", Float32, "HostBF16")
	}
	return t.buf.host[t.off : t.off+t.n : t.off+t.n]
}

// HostBF16 is a BFloat16 tensor's elements in host memory, as Host is a
// Float32 tensor's: valid only on the CPU device.
func (t *Tensor) HostBF16() []uint16 {
	if t.buf.half == nil {
		t.noHost("HostBF16", BFloat16, "Host")
	}
	return t.buf.half[t.off : t.off+t.n : t.off+t.n]
}

// noHost panics saying why t has no host storage of dtype want for fn:
// freed, another dtype (other is its accessor), or not on the CPU.
func (t *Tensor) noHost(fn string, want DType, other string) {
	switch {
	case t.buf.freed:
		panic(fmt.Sprintf("tensor.%s: the tensor's buffer was freed", fn))
	case t.buf.dtype != want:
		panic(fmt.Sprintf("tensor.%s: the tensor %v stores %s; use %s", fn, t, t.buf.dtype, other))
	}
	panic(fmt.Sprintf("tensor.%s: the tensor is on device %s, not on the CPU; use CopyToHost", fn, t.buf.dev.Name()))
}

// Ptr is the device address of the tensor's first element, for libraries
// that take raw device pointers (NCCL, cuBLAS). It is 0 on the CPU device,
// whose memory is reached with Host.
func (t *Tensor) Ptr() uintptr {
	if t.buf.ptr == 0 {
		return 0
	}
	return t.buf.ptr + uintptr(t.off)*uintptr(t.buf.dtype.Size())
}

// String describes the tensor: its shape and device, not its elements.
func (t *Tensor) String() string {
	var sb strings.Builder
	sb.WriteString("Tensor(")
	for i, d := range t.shape {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, d)
	}
	sb.WriteString(")")
	if t.buf.dtype != Float32 {
		sb.WriteString(" " + t.buf.dtype.String())
	}
	sb.WriteString(" on ")
	if t.buf.dev != nil {
		sb.WriteString(t.buf.dev.Name())
	}
	return sb.String()
}
