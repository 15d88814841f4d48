package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// ZeRO-1 on the device: with an NCCL data-parallel group on the CUDA
// device, a ZeRO1's buckets never leave device memory. Each bucket's
// gradients are packed into a device buffer, reduce-scattered (averaged)
// into this rank's range and copied back into the gradients (a bucket of
// one parameter that needs no padding, a large embedding say, is reduced
// and later gathered in place, in the parameter's own memory); the squared
// norm of the ranges is summed over DP, TP (and a pipeline's stages) by
// NCCL, the clip coefficient is computed on the device and read there by
// the AdamW kernel; the updated ranges are packed and all-gathered back
// into the parameters. All of it is enqueued on the compute stream in
// order, so one bucket buffer serves every bucket and the host waits for
// nothing: the GPU step (gpustep.go) reads the norm with its loss, once.

// zeroDevice is the device half of a ZeRO1: its communicator and buffers.
type zeroDevice struct {
	dev     deviceOps
	dp      nccl.DeviceComm
	flat    *tensor.Tensor // a whole bucket, padded (room for the biggest packed one; nil: none is)
	shard   *tensor.Tensor // this rank's range of a packed bucket
	scalars *tensor.Tensor // Step's own: [0:2] squared norm (hi, lo), [2] clip coefficient, [3] norm
	norm    [1]float32
}

// zeroOnDevice returns ZeRO-1's device half when the buckets can stay in
// device memory: dev keeps its scalars on the device (the CUDA device) and
// the data-parallel group, and the tensor-parallel one when it has more
// than one rank, run NCCL. nil: the buckets are staged through host
// memory.
func zeroOnDevice(dev tensor.Device, dp, tp nccl.Comm) *zeroDevice {
	d, ok := dev.(deviceOps)
	if !ok {
		return nil
	}
	dc, ok := dp.(nccl.DeviceComm)
	if !ok {
		return nil
	}
	if tp != nil && tp.Size() > 1 {
		if _, ok := tp.(nccl.DeviceComm); !ok {
			return nil
		}
	}
	return &zeroDevice{dev: d, dp: dc}
}

// inPlace reports whether bucket b runs in its one parameter's memory:
// NCCL reduce-scatters the gradient and all-gathers the parameter in
// place, this rank's range being [rank*per, (rank+1)*per) of it.
func (g *zeroDevice) inPlace(b *zeroBucket) bool {
	return len(b.params) == 1 && b.n == b.per*g.dp.Size()
}

// alloc makes the scalars and the buffers of the buckets that are packed.
func (g *zeroDevice) alloc(buckets []zeroBucket) error {
	biggest := 0
	for i := range buckets {
		if !g.inPlace(&buckets[i]) {
			biggest = max(biggest, buckets[i].per*g.dp.Size())
		}
	}
	var err error
	g.scalars, err = g.dev.Alloc(4)
	if err == nil && biggest > 0 {
		if g.flat, err = g.dev.Alloc(biggest); err == nil {
			g.shard, err = g.dev.Alloc(biggest / g.dp.Size())
		}
	}
	if err != nil {
		g.free()
	}
	return err
}

// free releases the buffers.
func (g *zeroDevice) free() {
	for _, t := range []*tensor.Tensor{g.flat, g.shard, g.scalars} {
		if t != nil {
			g.dev.Free(t)
		}
	}
	g.flat, g.shard, g.scalars = nil, nil, nil
}

// stepOnDevice is Step on the device half: the step, then one read of
// the norm.
func (z *ZeRO1) stepOnDevice(lr float64) (float64, error) {
	g := z.gpu
	if err := z.stepDevice(lr, g.scalars.View(0, 2), g.scalars.View(2, 2)); err != nil {
		return 0, err
	}
	if err := g.dev.Fetch(g.norm[:], g.scalars.View(3, 1)); err != nil {
		return 0, err
	}
	return float64(g.norm[0]), nil
}

// stepDevice enqueues one ZeRO-1 step at learning rate lr and returns
// without waiting for the device: sumsq (2 elements) receives the squared
// global norm (hi, lo), scale (2) the clip coefficient and the norm
// (ClipScale's), which the update reads.
func (z *ZeRO1) stepDevice(lr float64, sumsq, scale *tensor.Tensor) error {
	d := z.gpu.dev
	for i := range z.buckets {
		if err := z.reduceScatterDevice(&z.buckets[i]); err != nil {
			return fmt.Errorf("zero-1 gradient reduce-scatter (bucket %d of %d): %w", i+1, len(z.buckets), err)
		}
	}
	if err := z.normDevice(sumsq); err != nil {
		return err
	}
	d.ClipScale(scale, sumsq, float32(z.clip))
	z.AdamW.step++
	for _, b := range z.buckets {
		for _, s := range b.segs {
			p := z.params[s.idx]
			d.AdamWScaled(p.Data.View(s.pOff, s.n), p.Grad.View(s.pOff, s.n), b.m.View(s.sOff, s.n), b.v.View(s.sOff, s.n), z.hyper(p, lr, 1), scale)
		}
	}
	for i := range z.buckets {
		if err := z.allGatherDevice(&z.buckets[i]); err != nil {
			return fmt.Errorf("zero-1 parameter all-gather (bucket %d of %d): %w", i+1, len(z.buckets), err)
		}
	}
	return nil
}

// reduceScatterDevice is reduceScatter in device memory: b's gradients
// packed into the bucket buffer (padding zeroed), averaged over the DP
// group into this rank's range, and the range copied back into the
// gradients; or, in place, the gradient's range averaged where it is.
func (z *ZeRO1) reduceScatterDevice(b *zeroBucket) error {
	g := z.gpu
	if g.inPlace(b) {
		grad := b.params[0].Grad
		return g.dp.ReduceScatterDevice(grad.Ptr(), grad.View(g.dp.Rank()*b.per, b.per).Ptr(), b.per, nccl.Float32, nccl.Avg, g.dev.Stream())
	}
	flat, shard := g.flat.View(0, b.per*g.dp.Size()), g.shard.View(0, b.per)
	off := 0
	for _, p := range b.params {
		g.dev.Copy(flat.View(off, p.Grad.Len()), p.Grad)
		off += p.Grad.Len()
	}
	if off < flat.Len() {
		g.dev.Zero(flat.View(off, flat.Len()-off))
	}
	if err := g.dp.ReduceScatterDevice(flat.Ptr(), shard.Ptr(), b.per, nccl.Float32, nccl.Avg, g.dev.Stream()); err != nil {
		return err
	}
	for _, s := range b.segs {
		g.dev.Copy(z.params[s.idx].Grad.View(s.pOff, s.n), shard.View(s.sOff, s.n))
	}
	return nil
}

// allGatherDevice is allGather in device memory: this rank's updated range
// of b's parameters packed, every rank's gathered into the bucket buffer
// and copied back into the parameters; or, in place, every rank's range
// gathered into the parameter.
func (z *ZeRO1) allGatherDevice(b *zeroBucket) error {
	g := z.gpu
	if g.inPlace(b) {
		data := b.params[0].Data
		return g.dp.AllGatherDevice(data.View(g.dp.Rank()*b.per, b.per).Ptr(), data.Ptr(), b.per, nccl.Float32, g.dev.Stream())
	}
	flat, shard := g.flat.View(0, b.per*g.dp.Size()), g.shard.View(0, b.per)
	covered := 0
	for _, s := range b.segs {
		covered += s.n
	}
	if covered < b.per { // the last rank's range runs into the padding
		g.dev.Zero(shard)
	}
	for _, s := range b.segs {
		g.dev.Copy(shard.View(s.sOff, s.n), z.params[s.idx].Data.View(s.pOff, s.n))
	}
	if err := g.dp.AllGatherDevice(shard.Ptr(), flat.Ptr(), b.per, nccl.Float32, g.dev.Stream()); err != nil {
		return err
	}
	off := 0
	for _, p := range b.params {
		g.dev.Copy(p.Data, flat.View(off, p.Data.Len()))
		off += p.Data.Len()
	}
	return nil
}

// normDevice writes into sumsq (hi, lo) the squared global gradient norm
// from this rank's ranges, by norm's rule (sharded parameters on every TP
// rank, replicated ones on TP rank 0, a pipeline's uncounted copy left
// out), summed over DP, TP and a pipeline's stages by NCCL on the stream.
func (z *ZeRO1) normDevice(sumsq *tensor.Tensor) error {
	var sharded, replicated []*tensor.Tensor
	for _, b := range z.buckets {
		for _, s := range b.segs {
			p := z.params[s.idx]
			if p == z.uncount {
				continue
			}
			if p.Shard.Replicated() {
				replicated = append(replicated, p.Grad.View(s.pOff, s.n))
			} else {
				sharded = append(sharded, p.Grad.View(s.pOff, s.n))
			}
		}
	}
	d := z.gpu.dev
	d.SumSquaresTo(sumsq, false, sharded...)
	if z.tp == nil || z.tp.Rank() == 0 {
		d.SumSquaresTo(sumsq, true, replicated...)
	}
	for _, c := range []nccl.Comm{z.dp, z.tp, z.pp} {
		if c == nil || c.Size() == 1 {
			continue
		}
		dc, ok := c.(nccl.DeviceComm)
		if !ok {
			return fmt.Errorf("grad norm: a group of %d ranks has no NCCL communicator for the device-resident ZeRO-1", c.Size())
		}
		if err := dc.AllReduceDevice(sumsq.Ptr(), sumsq.Ptr(), 2, nccl.Float32, nccl.Sum, d.Stream()); err != nil {
			return fmt.Errorf("grad norm: %w", err)
		}
	}
	return nil
}
