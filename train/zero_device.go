package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// ZeRO-1's scalars on the device: on the CUDA device with NCCL groups, the
// squared norm of the ranges is summed over DP, TP (and a pipeline's
// stages) by NCCL, the clip coefficient is computed on the device and read
// there by the AdamW kernel. All of it is enqueued on the compute stream in
// order, so the host waits for nothing: the GPU step (gpustep.go) reads
// the norm with its loss, once.

// zeroDevice is the device half of a ZeRO1: its scalars.
type zeroDevice struct {
	dev     deviceOps
	scalars *tensor.Tensor // Step's own: [0:2] squared norm (hi, lo), [2] clip coefficient, [3] norm
	norm    [1]float32
}

// newZeroDevice returns ZeRO-1's device half when the norm can stay in
// device memory: dev keeps its scalars on the device (the CUDA device) and
// the groups run there. nil: the norm is summed on the host.
func newZeroDevice(dev tensor.Device, groups ...*parallel.Group) (*zeroDevice, error) {
	d, ok := scalarDevice(dev, groups...)
	if !ok {
		return nil, nil
	}
	s, err := d.Alloc(4)
	if err != nil {
		return nil, err
	}
	return &zeroDevice{dev: d, scalars: s}, nil
}

// free releases the scalars.
func (g *zeroDevice) free() { g.dev.Free(g.scalars) }

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
	if err := z.reduceScatter(); err != nil {
		return err
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
	return z.allGather()
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
	if z.tp.Rank() == 0 {
		d.SumSquaresTo(sumsq, true, replicated...)
	}
	for _, g := range []*parallel.Group{z.dp, z.tp, z.pp} {
		if g == nil {
			continue
		}
		if err := g.AllReduce(sumsq, nccl.Sum); err != nil {
			return fmt.Errorf("grad norm: %w", err)
		}
	}
	return nil
}
