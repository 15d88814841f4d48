package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// group is a layer's view of its tensor-parallel communicator. A nil Comm
// is the unsharded layer: size 1, every collective a no-op. It is the one
// place where tensors meet the Comm: on a streamed device with an NCCL
// communicator the collective runs on the tensors' device memory (onDevice),
// else on host slices (host: the CPU device's own memory, or a staging copy).
type group struct {
	comm  nccl.Comm
	stage []float32 // host staging for devices whose memory is not host memory
}

func newGroup(c nccl.Comm) *group { return &group{comm: c} }

func (g *group) size() int {
	if g.comm == nil {
		return 1
	}
	return g.comm.Size()
}

func (g *group) rank() int {
	if g.comm == nil {
		return 0
	}
	return g.comm.Rank()
}

// host returns t's elements as a host slice: t's own memory on the CPU
// device, else a staging copy (then put must copy it back).
func (g *group) host(t *tensor.Tensor, n int) (buf []float32, staged bool) {
	if t.Buffer().Host() != nil {
		return t.Host(), false
	}
	if cap(g.stage) < n {
		g.stage = make([]float32, n)
	}
	buf = g.stage[:n]
	t.Device().CopyToHost(buf[:t.Len()], t)
	return buf, true
}

// Streamer is a device whose work runs in order on one CUDA stream (the
// CUDA device): a collective on its tensors is enqueued on that stream,
// after the kernels that write them and before those that read the
// result, with no host synchronisation.
type Streamer interface {
	Stream() uintptr
}

// onDevice returns the NCCL communicator and the stream to run a
// collective on t's memory, when the group has one and t lives on a
// streamed device; ok is false for the host-staged path.
func (g *group) onDevice(t *tensor.Tensor) (dc nccl.DeviceComm, stream uintptr, ok bool) {
	dc, ok = g.comm.(nccl.DeviceComm)
	if !ok || t.Ptr() == 0 {
		return nil, 0, false
	}
	s, ok := t.Device().(Streamer)
	if !ok {
		return nil, 0, false
	}
	return dc, s.Stream(), true
}

// allReduce reduces t in place over the group.
func (g *group) allReduce(t *tensor.Tensor, op nccl.Op) error {
	if g.size() == 1 {
		return nil
	}
	if dc, stream, ok := g.onDevice(t); ok {
		return dc.AllReduceDevice(t.Ptr(), t.Ptr(), t.Len(), nccl.Float32, op, stream)
	}
	buf, staged := g.host(t, t.Len())
	if err := g.comm.AllReduce(buf, op); err != nil {
		return err
	}
	if staged {
		t.Device().CopyFromHost(t, buf)
	}
	return nil
}

// allGatherCols gathers the (N, c) blocks of every rank into the columns of
// out (N, size*c): rank r's block lands in columns [r*c, (r+1)*c). scratch
// is (size, N, c), the gathered blocks in rank order.
func (g *group) allGatherCols(out, in, scratch *tensor.Tensor) error {
	if g.size() == 1 {
		in.Device().Copy(out, in)
		return nil
	}
	n := in.Len()
	rows, c := in.Rows(), in.Cols()
	if dc, stream, ok := g.onDevice(in); ok && scratch.Ptr() != 0 {
		if err := dc.AllGatherDevice(in.Ptr(), scratch.Ptr(), n, nccl.Float32, stream); err != nil {
			return err
		}
		for r := 0; r < g.size(); r++ {
			copyCols(out, r*c, scratch.View(r*n, rows, c), 0, c)
		}
		return nil
	}
	src, staged := g.host(in, n)
	if staged {
		src = append([]float32(nil), src...)
	}
	dst, _ := g.host(scratch, scratch.Len())
	if err := g.comm.AllGather(src, dst); err != nil {
		return err
	}
	if staged || scratch.Buffer().Host() == nil {
		scratch.Device().CopyFromHost(scratch, dst)
	}
	for r := 0; r < g.size(); r++ {
		copyCols(out, r*c, scratch.View(r*n, rows, c), 0, c)
	}
	return nil
}

// copyCols copies columns [srcCol, srcCol+cols) of every row of src into
// columns [dstCol, dstCol+cols) of dst; both are (N, *) with the same N.
// A strided block copy on the device (Copy2D).
func copyCols(dst *tensor.Tensor, dstCol int, src *tensor.Tensor, srcCol, cols int) {
	rows := src.Rows()
	if rows != dst.Rows() {
		panic(fmt.Sprintf("parallel: copyCols of %v into %v: row counts differ", src, dst))
	}
	src.Device().Copy2D(dst, dstCol, dst.Cols(), src, srcCol, src.Cols(), rows, cols)
}

// CopyToRegion is Megatron's f operator, placed where a replicated
// activation enters a tensor-parallel region: the identity forward, an
// all-reduce (sum) of the input gradient backward.
func CopyToRegion(tp nccl.Comm) *Region { return &Region{g: newGroup(tp), reduceBackward: true} }

// ReduceFromRegion is Megatron's g operator, placed where the partial
// results of a tensor-parallel region leave it: an all-reduce (sum) forward,
// the identity backward.
func ReduceFromRegion(tp nccl.Comm) *Region { return &Region{g: newGroup(tp), reduceForward: true} }

// Region is one of the two conjugate operators f and g. Both run in place.
type Region struct {
	g                             *group
	reduceForward, reduceBackward bool
}

// Forward applies the operator to the activation x in place.
func (r *Region) Forward(x *tensor.Tensor) error {
	if r.reduceForward {
		return r.g.allReduce(x, nccl.Sum)
	}
	return nil
}

// Backward applies the operator's gradient to dx in place.
func (r *Region) Backward(dx *tensor.Tensor) error {
	if r.reduceBackward {
		return r.g.allReduce(dx, nccl.Sum)
	}
	return nil
}

// GatherFromRegion concatenates every rank's (N, c) slice along the last
// dimension into (N, tp*c) forward; backward it keeps this rank's columns of
// the gradient. ScatterToRegion is its conjugate.
type GatherFromRegion struct {
	g       *group
	scratch *tensor.Tensor
}

// NewGatherFromRegion returns the gather operator over the group tp.
func NewGatherFromRegion(tp nccl.Comm) *GatherFromRegion {
	return &GatherFromRegion{g: newGroup(tp)}
}

// Forward is out = [in_0 | in_1 | ... ] over the group's ranks.
// in is (N, c), out is (N, tp*c).
func (o *GatherFromRegion) Forward(out, in *tensor.Tensor) error {
	if out.Rows() != in.Rows() || out.Cols() != in.Cols()*o.g.size() {
		return fmt.Errorf("gather: out %v is not %d columns of in %v per rank", out, in.Cols(), in)
	}
	if o.g.size() > 1 && (o.scratch == nil || o.scratch.Len() != o.g.size()*in.Len()) {
		dev := in.Device()
		if o.scratch != nil {
			dev.Free(o.scratch)
		}
		var err error
		if o.scratch, err = dev.Alloc(o.g.size() * in.Len()); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
	}
	return o.g.allGatherCols(out, in, o.scratch)
}

// Backward accumulates this rank's columns of dout (N, tp*c) into din (N, c).
func (o *GatherFromRegion) Backward(din, dout *tensor.Tensor) error {
	return addCols(din, dout, o.g.rank()*din.Cols())
}

// ScatterToRegion keeps this rank's columns of a replicated (N, tp*c)
// activation forward and all-gathers the gradient backward.
type ScatterToRegion struct {
	gather *GatherFromRegion
	tmp    *tensor.Tensor
}

// NewScatterToRegion returns the scatter operator over the group tp.
func NewScatterToRegion(tp nccl.Comm) *ScatterToRegion {
	return &ScatterToRegion{gather: NewGatherFromRegion(tp)}
}

// Forward is out = this rank's c columns of in. in is (N, tp*c), out (N, c).
func (o *ScatterToRegion) Forward(out, in *tensor.Tensor) error {
	g := o.gather.g
	if out.Rows() != in.Rows() || in.Cols() != out.Cols()*g.size() {
		return fmt.Errorf("scatter: in %v is not %d columns of out %v per rank", in, out.Cols(), out)
	}
	copyCols(out, 0, in, g.rank()*out.Cols(), out.Cols())
	return nil
}

// Backward accumulates the gathered dout (N, c) of every rank into din (N, tp*c).
func (o *ScatterToRegion) Backward(din, dout *tensor.Tensor) error {
	dev := din.Device()
	if o.tmp == nil || o.tmp.Len() != din.Len() {
		if o.tmp != nil {
			dev.Free(o.tmp)
		}
		var err error
		if o.tmp, err = dev.Alloc(din.Shape()...); err != nil {
			return fmt.Errorf("scatter: %w", err)
		}
	}
	tmp := o.tmp.Reshape(din.Shape()...)
	if err := o.gather.Forward(tmp, dout); err != nil {
		return err
	}
	dev.Axpy(din, 1, tmp)
	return nil
}

// addCols accumulates columns [col, col+din.Cols()) of dout into din.
func addCols(din, dout *tensor.Tensor, col int) error {
	if din.Rows() != dout.Rows() || col+din.Cols() > dout.Cols() {
		return fmt.Errorf("parallel: columns [%d,%d) of %v do not fit %v", col, col+din.Cols(), dout, din)
	}
	din.Device().Axpy2D(din, 0, din.Cols(), 1, dout, col, dout.Cols(), din.Rows(), din.Cols())
	return nil
}
