package parallel

import (
	"fmt"
	"unsafe"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// Group is a communicator seen through tensors: the collectives and
// point-to-point transfers of nccl.Comm on *tensor.Tensor. A nil Comm is
// the unsharded layer: size 1, every collective a no-op. It is the one
// place where tensors meet a Comm and the one place that decides between
// the device and the host (onDevice): on a streamed device with an NCCL
// communicator the operation runs on the tensors' device memory, on the
// compute stream; else on host slices (the CPU device's own memory, or a
// staging copy). Every layer, the data-parallel gradient sync, ZeRO-1 and
// the pipeline's transfers go through it.
type Group struct {
	comm  nccl.Comm
	dev   tensor.Device // the device whose tensors it moves (nil: each tensor's own)
	stage [2][]float32  // host staging for devices whose memory is not host memory
	alias []float32     // the input of an in-place gather or scatter, copied
	words [2][]float32  // bfloat16 elements packed two a float32 word (allGatherHalf, allReduceHalf, reduceScatterHalf)
}

// NewGroup wraps c (nil: the group of one rank, as is a nil *Group).
func NewGroup(c nccl.Comm) *Group { return &Group{comm: c} }

// NewDeviceGroup wraps c for the tensors of dev: the host-or-device
// choice is dev's, whatever device a tensor names (a device that wraps
// another, as a test's simulated GPU wraps the CPU, is the one that
// counts).
func NewDeviceGroup(c nccl.Comm, dev tensor.Device) *Group { return &Group{comm: c, dev: dev} }

// Comm is the wrapped communicator (nil for the group of one rank).
func (g *Group) Comm() nccl.Comm {
	if g == nil {
		return nil
	}
	return g.comm
}

// Size is the number of ranks in the group.
func (g *Group) Size() int {
	if g == nil || g.comm == nil {
		return 1
	}
	return g.comm.Size()
}

// Rank is this rank's place in the group.
func (g *Group) Rank() int {
	if g == nil || g.comm == nil {
		return 0
	}
	return g.comm.Rank()
}

// host returns t's elements as a host slice: t's own memory on the CPU
// device, else a copy in staging buffer k (then put must copy it back).
func (g *Group) host(t *tensor.Tensor, k int) (buf []float32, staged bool) {
	if t.Buffer().Host() != nil {
		return t.Host(), false
	}
	buf = grow(&g.stage[k], t.Len())
	t.Device().CopyToHost(buf, t)
	return buf, true
}

// overlap reports whether a and b share memory.
func overlap(a, b *tensor.Tensor) bool {
	return a.Buffer() == b.Buffer() && a.Offset() < b.Offset()+b.Len() && b.Offset() < a.Offset()+a.Len()
}

// source is in's host slice for a collective into out: staged in slot 0,
// or, when in lies inside out's memory (in place), a copy, since the host
// collectives take separate buffers.
func (g *Group) source(in, out *tensor.Tensor) []float32 {
	src, staged := g.host(in, 0)
	if staged || !overlap(in, out) {
		return src
	}
	alias := grow(&g.alias, len(src))
	copy(alias, src)
	return alias
}

// put copies a staged host slice back into t.
func put(t *tensor.Tensor, buf []float32, staged bool) {
	if staged {
		t.Device().CopyFromHost(t, buf)
	}
}

// Streamer is a device whose work runs in order on one CUDA stream (the
// CUDA device): a collective on its tensors is enqueued on that stream,
// after the kernels that write them and before those that read the
// result, with no host synchronisation.
type Streamer interface {
	Stream() uintptr
}

// Resident reports whether the group's operations on dev's tensors run in
// device memory (NCCL on dev's stream): the one rule onDevice applies. A
// group of one rank moves nothing and is resident anywhere.
func (g *Group) Resident(dev tensor.Device) bool {
	if g.Size() == 1 {
		return true
	}
	_, ok := g.comm.(nccl.DeviceComm)
	_, streamed := dev.(Streamer)
	return ok && streamed
}

// onDevice returns the NCCL communicator and the stream to run an
// operation on the memory of ts, when the group is Resident on their
// device and they have device addresses; ok is false for the host-staged
// path.
func (g *Group) onDevice(ts ...*tensor.Tensor) (dc nccl.DeviceComm, stream uintptr, ok bool) {
	dev := g.dev
	if dev == nil {
		dev = ts[0].Device()
	}
	if g.Size() == 1 || !g.Resident(dev) {
		return nil, 0, false
	}
	for _, t := range ts {
		if t.Ptr() == 0 {
			return nil, 0, false
		}
	}
	return g.comm.(nccl.DeviceComm), dev.(Streamer).Stream(), true
}

// AllReduce reduces t in place over the group. A bfloat16 t is summed or
// averaged in bfloat16 (NCCL's bf16 on a GPU; through the host
// collectives packed two a word, nccl.SumBF16).
func (g *Group) AllReduce(t *tensor.Tensor, op nccl.Op) error {
	if g.Size() == 1 {
		return nil
	}
	if dc, stream, ok := g.onDevice(t); ok {
		return dc.AllReduceDevice(t.Ptr(), t.Ptr(), t.Len(), ncclType(t.DType()), op, stream)
	}
	if t.DType() == tensor.BFloat16 {
		return g.allReduceHalf(t, op)
	}
	buf, staged := g.host(t, 0)
	if err := g.comm.AllReduce(buf, op); err != nil {
		return err
	}
	put(t, buf, staged)
	return nil
}

// AllGather concatenates every rank's in, in rank order, into out
// (Size()*in.Len() elements). in may be a view of out (NCCL's in-place
// all-gather: rank r's in at block r).
func (g *Group) AllGather(out, in *tensor.Tensor) error {
	if g.Size() == 1 {
		if out.Buffer() != in.Buffer() || out.Offset() != in.Offset() {
			in.Device().Copy(out.View(0, in.Len()), in)
		}
		return nil
	}
	if in.DType() != out.DType() {
		return fmt.Errorf("parallel: all-gather of a %v tensor into a %v one", in.DType(), out.DType())
	}
	if dc, stream, ok := g.onDevice(in, out); ok {
		return dc.AllGatherDevice(in.Ptr(), out.Ptr(), in.Len(), ncclType(in.DType()), stream)
	}
	if in.DType() == tensor.BFloat16 {
		return g.allGatherHalf(out, in)
	}
	src := g.source(in, out)
	dst, dstStaged := g.host(out, 1)
	if err := g.comm.AllGather(src, dst); err != nil {
		return err
	}
	put(out, dst, dstStaged)
	return nil
}

// ncclType is the NCCL element type of dt.
func ncclType(dt tensor.DType) nccl.DataType {
	if dt == tensor.BFloat16 {
		return nccl.BFloat16
	}
	return nccl.Float32
}

// allGatherHalf is AllGather of bfloat16 tensors through the host
// collectives, which carry float32 words: each rank's elements packed two
// a word (its block padded to an even count), so the wire carries 2 bytes
// an element, the bits unchanged.
func (g *Group) allGatherHalf(out, in *tensor.Tensor) error {
	n, size := in.Len(), g.Size()
	w := (n + 1) / 2 // words a rank
	send := grow(&g.words[0], w)
	recv := grow(&g.words[1], size*w)
	g.loadHalves(send, in)
	if err := g.comm.AllGather(send, recv); err != nil {
		return err
	}
	rh := halves(recv)
	if out.Buffer().HostBF16() != nil {
		dst := out.HostBF16()
		for r := range size {
			copy(dst[r*n:(r+1)*n], rh[2*r*w:2*r*w+n])
		}
		return nil
	}
	wide := grow(&g.stage[1], size*n)
	for r := range size {
		tensor.WidenBF16(wide[r*n:(r+1)*n], rh[2*r*w:2*r*w+n])
	}
	out.Device().CopyFromHost(out, wide)
	return nil
}

// allReduceHalf is AllReduce of a bfloat16 tensor through the host
// collectives: its elements packed two a word (padded to an even count
// with a zero) and summed by nccl.SumBF16, so the wire carries 2 bytes an
// element and every step's sum is rounded to bfloat16 as NCCL's is; an
// average first scales this rank's elements by 1/n, rounded, as NCCL's avg
// of floating types does (PreMulSum).
func (g *Group) allReduceHalf(t *tensor.Tensor, op nccl.Op) error {
	if op != nccl.Sum && op != nccl.Avg {
		return fmt.Errorf("parallel: a bfloat16 all-reduce sums or averages, not %v", op)
	}
	n := t.Len()
	buf := grow(&g.words[0], (n+1)/2)
	h := g.loadHalves(buf, t)
	if op == nccl.Avg {
		g.scaleHalves(h[:n])
	}
	if err := g.comm.AllReduce(buf, nccl.SumBF16); err != nil {
		return err
	}
	g.storeHalves(t, h[:n])
	return nil
}

// reduceScatterHalf is ReduceScatter of bfloat16 tensors through the host
// collectives: each rank's block of in packed two a word (an odd block
// padded with a zero, so that every block starts a word) and summed by
// nccl.SumBF16, an average pre-multiplied as allReduceHalf's, so the wire
// carries 2 bytes an element and every step's sum is rounded as NCCL's.
func (g *Group) reduceScatterHalf(out, in *tensor.Tensor, op nccl.Op) error {
	if op != nccl.Sum && op != nccl.Avg {
		return fmt.Errorf("parallel: a bfloat16 reduce-scatter sums or averages, not %v", op)
	}
	n, size := out.Len(), g.Size()
	w := (n + 1) / 2 // words a rank
	send := grow(&g.words[0], size*w)
	sh := g.loadBlocks(send, in, size)
	if op == nccl.Avg {
		g.scaleHalves(sh)
	}
	recv := grow(&g.words[1], w)
	if err := g.comm.ReduceScatter(send, recv, nccl.SumBF16); err != nil {
		return err
	}
	g.storeHalves(out, halves(recv)[:n])
	return nil
}

// scaleHalves multiplies each bfloat16 element of h by 1/Size(), rounding
// (the pre-multiplication of an average, as NCCL's PreMulSum).
func (g *Group) scaleHalves(h []uint16) {
	scale := float32(1 / float64(g.Size()))
	for i, v := range h {
		h[i] = tensor.BF16FromFloat32(tensor.Float32FromBF16(v) * scale)
	}
}

// storeHalves writes the bfloat16 elements h into t (t.Len() of them).
func (g *Group) storeHalves(t *tensor.Tensor, h []uint16) {
	if t.Buffer().HostBF16() != nil {
		copy(t.HostBF16(), h)
		return
	}
	wide := grow(&g.stage[1], len(h))
	tensor.WidenBF16(wide, h)
	t.Device().CopyFromHost(t, wide)
}

// loadHalves packs t's bfloat16 elements two a word into words ((t.Len()+1)/2
// of them, an odd count's last half zero) and returns words as halves.
func (g *Group) loadHalves(words []float32, t *tensor.Tensor) []uint16 {
	return g.loadBlocks(words, t, 1)
}

// loadBlocks packs t's bfloat16 elements, cut into blocks equal blocks,
// into words, each block from a word of its own ((n+1)/2 words for n
// elements, an odd block's last half zero), and returns words as halves.
func (g *Group) loadBlocks(words []float32, t *tensor.Tensor, blocks int) []uint16 {
	h, n := halves(words), t.Len()/blocks
	w := (n + 1) / 2
	var wide []float32
	if t.Buffer().HostBF16() == nil {
		wide = grow(&g.stage[0], t.Len())
		t.Device().CopyToHost(wide, t)
	}
	for r := range blocks {
		dst := h[2*r*w : 2*r*w+n]
		if wide != nil {
			tensor.RoundBF16(dst, wide[r*n:(r+1)*n]) // exact: the values are bfloat16
		} else {
			copy(dst, t.HostBF16()[r*n:(r+1)*n])
		}
		if n%2 == 1 {
			h[2*r*w+n] = 0
		}
	}
	return h
}

// grow returns (*s)[:n], reallocated when shorter.
func grow(s *[]float32, n int) []float32 {
	if cap(*s) < n {
		*s = make([]float32, n)
	}
	return (*s)[:n]
}

// halves is the memory of words as bfloat16 elements, two a word.
func halves(words []float32) []uint16 {
	if len(words) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(words))), 2*len(words))
}

// ReduceScatter reduces in (Size()*out.Len() elements) over the group and
// leaves block Rank() of the result in out. out may be that block of in
// (NCCL's in-place reduce-scatter). Bfloat16 tensors are summed or
// averaged in bfloat16 (NCCL's bf16 on a GPU; through the host
// collectives packed two a word, nccl.SumBF16).
func (g *Group) ReduceScatter(out, in *tensor.Tensor, op nccl.Op) error {
	if g.Size() == 1 {
		if out.Buffer() != in.Buffer() || out.Offset() != in.Offset() {
			in.Device().Copy(out, in.View(0, out.Len()))
		}
		return nil
	}
	if in.DType() != out.DType() {
		return fmt.Errorf("parallel: reduce-scatter of a %v tensor into a %v one", in.DType(), out.DType())
	}
	if in.Len() != g.Size()*out.Len() {
		return fmt.Errorf("parallel: reduce-scatter of %d elements into %d on each of %d ranks", in.Len(), out.Len(), g.Size())
	}
	if dc, stream, ok := g.onDevice(in, out); ok {
		return dc.ReduceScatterDevice(in.Ptr(), out.Ptr(), out.Len(), ncclType(in.DType()), op, stream)
	}
	if in.DType() == tensor.BFloat16 {
		return g.reduceScatterHalf(out, in, op)
	}
	src := g.source(in, out)
	dst, dstStaged := g.host(out, 1)
	if err := g.comm.ReduceScatter(src, dst, op); err != nil {
		return err
	}
	put(out, dst, dstStaged)
	return nil
}

// Broadcast copies root's t into every other rank's t.
func (g *Group) Broadcast(t *tensor.Tensor, root int) error {
	if g.Size() == 1 {
		return nil
	}
	if dc, stream, ok := g.onDevice(t); ok {
		return dc.BroadcastDevice(t.Ptr(), t.Ptr(), t.Len(), nccl.Float32, root, stream)
	}
	buf, staged := g.host(t, 0)
	if err := g.comm.Broadcast(buf, root); err != nil {
		return err
	}
	put(t, buf, staged)
	return nil
}

// Send sends t to group rank peer, which must Recv the same number of
// elements of the same dtype. It may wait until the peer receives (NCCL
// holds the stream, a host link its sender): callers order their
// transfers so that each send meets a posted receive, and exchange with
// SendRecv. A bfloat16 t travels as bfloat16 (NCCL's bf16 on a device;
// through the host packed two a word, as allGatherHalf's).
func (g *Group) Send(t *tensor.Tensor, peer int) error {
	if dc, stream, ok := g.onDevice(t); ok {
		return dc.SendDevice(t.Ptr(), t.Len(), ncclType(t.DType()), peer, stream)
	}
	return g.comm.Send(g.sendWords(t), peer)
}

// sendWords is what the host link carries of t: its float32 elements
// (staged in slot 0 where t is not in host memory), or a bfloat16 t's
// packed two a word.
func (g *Group) sendWords(t *tensor.Tensor) []float32 {
	if t.DType() == tensor.BFloat16 {
		w := grow(&g.words[0], (t.Len()+1)/2)
		g.loadHalves(w, t)
		return w
	}
	buf, _ := g.host(t, 0)
	return buf
}

// Recv receives t from group rank peer.
func (g *Group) Recv(t *tensor.Tensor, peer int) error {
	if dc, stream, ok := g.onDevice(t); ok {
		return dc.RecvDevice(t.Ptr(), t.Len(), ncclType(t.DType()), peer, stream)
	}
	if t.DType() == tensor.BFloat16 {
		w := grow(&g.words[1], (t.Len()+1)/2)
		if err := g.comm.Recv(w, peer); err != nil {
			return err
		}
		g.storeHalves(t, halves(w)[:t.Len()])
		return nil
	}
	buf, staged := g.host(t, 1)
	if err := g.comm.Recv(buf, peer); err != nil {
		return err
	}
	put(t, buf, staged)
	return nil
}

// SendRecv sends send to peer and receives recv from it, both at once
// (one NCCL group on the device): the way two ranks exchange without
// ordering their calls. send and recv hold as many elements; each may be
// either dtype (as Send's and Recv's).
func (g *Group) SendRecv(send, recv *tensor.Tensor, peer int) error {
	if dc, stream, ok := g.onDevice(send, recv); ok {
		return dc.SendRecvDevice(send.Ptr(), recv.Ptr(), send.Len(), ncclType(send.DType()), ncclType(recv.DType()), peer, stream)
	}
	// The send runs beside the receive, as in an NCCL group: two peers
	// that exchange at once both find their message taken.
	buf := g.sendWords(send)
	sent := make(chan error, 1)
	go func() { sent <- g.comm.Send(buf, peer) }()
	err := g.Recv(recv, peer)
	if serr := <-sent; serr != nil {
		return serr
	}
	return err
}

// AllGatherCols gathers the (N, c) blocks of every rank into the columns of
// out (N, size*c): rank r's block lands in columns [r*c, (r+1)*c). scratch
// is (size, N, c), the gathered blocks in rank order.
func (g *Group) AllGatherCols(out, in, scratch *tensor.Tensor) error {
	if g.Size() == 1 {
		in.Device().Copy(out, in)
		return nil
	}
	n := in.Len()
	rows, c := in.Rows(), in.Cols()
	if dc, stream, ok := g.onDevice(in); ok && scratch.Ptr() != 0 {
		if err := dc.AllGatherDevice(in.Ptr(), scratch.Ptr(), n, nccl.Float32, stream); err != nil {
			return err
		}
		for r := 0; r < g.Size(); r++ {
			copyCols(out, r*c, scratch.View(r*n, rows, c), 0, c)
		}
		return nil
	}
	src, _ := g.host(in, 0)
	dst, staged := g.host(scratch, 1)
	if err := g.comm.AllGather(src, dst); err != nil {
		return err
	}
	put(scratch, dst, staged)
	for r := 0; r < g.Size(); r++ {
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
func CopyToRegion(tp nccl.Comm) *Region { return &Region{g: NewGroup(tp), reduceBackward: true} }

// ReduceFromRegion is Megatron's g operator, placed where the partial
// results of a tensor-parallel region leave it: an all-reduce (sum) forward,
// the identity backward.
func ReduceFromRegion(tp nccl.Comm) *Region { return &Region{g: NewGroup(tp), reduceForward: true} }

// Region is one of the two conjugate operators f and g. Both run in place.
type Region struct {
	g                             *Group
	reduceForward, reduceBackward bool
}

// Forward applies the operator to the activation x in place.
func (r *Region) Forward(x *tensor.Tensor) error {
	if r.reduceForward {
		return r.g.AllReduce(x, nccl.Sum)
	}
	return nil
}

// Backward applies the operator's gradient to dx in place.
func (r *Region) Backward(dx *tensor.Tensor) error {
	if r.reduceBackward {
		return r.g.AllReduce(dx, nccl.Sum)
	}
	return nil
}

// GatherFromRegion concatenates every rank's (N, c) slice along the last
// dimension into (N, tp*c) forward; backward it keeps this rank's columns of
// the gradient. ScatterToRegion is its conjugate.
type GatherFromRegion struct {
	g       *Group
	scratch *tensor.Tensor
}

// NewGatherFromRegion returns the gather operator over the group tp.
func NewGatherFromRegion(tp nccl.Comm) *GatherFromRegion {
	return &GatherFromRegion{g: NewGroup(tp)}
}

// Forward is out = [in_0 | in_1 | ... ] over the group's ranks.
// in is (N, c), out is (N, tp*c).
func (o *GatherFromRegion) Forward(out, in *tensor.Tensor) error {
	if out.Rows() != in.Rows() || out.Cols() != in.Cols()*o.g.Size() {
		return fmt.Errorf("gather: out %v is not %d columns of in %v per rank", out, in.Cols(), in)
	}
	if o.g.Size() > 1 && (o.scratch == nil || o.scratch.Len() != o.g.Size()*in.Len()) {
		dev := in.Device()
		if o.scratch != nil {
			dev.Free(o.scratch)
		}
		var err error
		if o.scratch, err = dev.Alloc(o.g.Size() * in.Len()); err != nil {
			return fmt.Errorf("gather: %w", err)
		}
	}
	return o.g.AllGatherCols(out, in, o.scratch)
}

// Backward accumulates this rank's columns of dout (N, tp*c) into din (N, c).
func (o *GatherFromRegion) Backward(din, dout *tensor.Tensor) error {
	return addCols(din, dout, o.g.Rank()*din.Cols())
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
	if out.Rows() != in.Rows() || in.Cols() != out.Cols()*g.Size() {
		return fmt.Errorf("scatter: in %v is not %d columns of out %v per rank", in, out.Cols(), out)
	}
	copyCols(out, 0, in, g.Rank()*out.Cols(), out.Cols())
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
