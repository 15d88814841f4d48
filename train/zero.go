package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// ZeRO1 is AdamW with its moments sharded over the data-parallel group
// (ZeRO stage 1, arXiv 1910.02054). The gradients are cut into the
// buckets of GradSync (consecutive parameters, at most bucketElems
// elements, padded to a multiple of dp); each bucket is reduce-scattered
// (averaged) so that DP rank d receives elements [d*per, (d+1)*per) of it,
// updates that range of the parameters with the moments it alone keeps,
// and the updated ranges are all-gathered back into every replica. Per
// step and bucket: one reduce-scatter and one all-gather instead of one
// all-reduce (the same bytes on a ring); the moments take 1/dp of the
// memory. Grad-norm clipping sums the squares of each rank's ranges over
// the DP group, then over TP (sharded parameters on every TP rank,
// replicated ones on TP rank 0), as GradNorm does.
//
// A bucket lives in device memory: packed into one buffer (room for the
// biggest packed bucket), or, for one parameter that needs no padding (a
// large embedding, say), reduce-scattered and all-gathered in the
// parameter's own memory. parallel.Group runs the collectives on the
// device (NCCL on the compute stream) or through host memory. The
// parameters are fp32 on every device this runs on, so there are no
// separate master weights to shard.
type ZeRO1 struct {
	*AdamW // hyperparameters and the step count; it holds no moments

	dev         tensor.Device
	dp, tp      *parallel.Group
	uncount     *parallel.Param // a parameter another stage counts in the norm (the tied embedding's copy)
	params      []*parallel.Param
	ranges      []*tensor.Tensor // this rank's range of each gradient (nil: none)
	firsts      []int            // where each range starts in its gradient
	buckets     []zeroBucket
	flat, shard *tensor.Tensor // a packed bucket, padded, and this rank's range of it (nil: no bucket is packed)
	norm        *gradNorm      // over this rank's ranges: summed over dp, then tp
}

// zeroBucket is one bucket: its parameters, its padded size and this
// rank's range of it.
type zeroBucket struct {
	params []*parallel.Param
	n, per int            // elements, elements per DP rank (padded)
	m, v   *tensor.Tensor // moments of this rank's range (per)
	segs   []zeroSeg      // the parameters' pieces in this rank's range
}

// zeroSeg is the part of parameter idx (of the optimizer's params) that
// falls in this rank's range: n elements from pOff in the parameter,
// from sOff in the range.
type zeroSeg struct {
	idx           int
	pOff, sOff, n int
}

// memoryModes names the memory-saving parallelism a config turns on, for
// the run's first log line ("" when none).
func memoryModes(cfg config.Config) string {
	s := ""
	if cfg.SP {
		s += " + sequence parallel"
	}
	if cfg.Zero == 1 {
		s += " + ZeRO-1"
	}
	return s
}

// NewZeRO1 buckets params as NewGradSync does and allocates the moments of
// this DP rank's ranges and the bucket buffers on dev.
func NewZeRO1(dev tensor.Device, params []*parallel.Param, dp, tp nccl.Comm, weightDecay, clip float64, bucketElems int) (*ZeRO1, error) {
	adam, err := NewAdamW(dev, nil, weightDecay, clip)
	if err != nil {
		return nil, err
	}
	z := &ZeRO1{AdamW: adam, dev: dev, dp: parallel.NewDeviceGroup(dp, dev), tp: parallel.NewDeviceGroup(tp, dev), params: params,
		ranges: make([]*tensor.Tensor, len(params)), firsts: make([]int, len(params))}
	size, rank := z.dp.Size(), z.dp.Rank()
	buckets, _ := bucketParams(params, bucketElems)
	index := make(map[*parallel.Param]int, len(params))
	for i, p := range params {
		index[p] = i
	}
	packed := 0
	for _, ps := range buckets {
		b := zeroBucket{params: ps}
		for _, p := range ps {
			b.n += p.Data.Len()
		}
		b.per = (b.n + size - 1) / size
		lo, hi := rank*b.per, min((rank+1)*b.per, b.n)
		off := 0
		for _, p := range ps {
			s, e := max(off, lo), min(off+p.Data.Len(), hi)
			if s < e {
				b.segs = append(b.segs, zeroSeg{idx: index[p], pOff: s - off, sOff: s - lo, n: e - s})
				z.ranges[index[p]], z.firsts[index[p]] = p.Grad.View(s-off, e-s), s-off
			}
			off += p.Data.Len()
		}
		if b.m, err = dev.Alloc(b.per); err == nil {
			if b.v, err = dev.Alloc(b.per); err != nil {
				dev.Free(b.m)
			}
		}
		if err != nil {
			z.Close()
			return nil, fmt.Errorf("zero-1 moments: %w", err)
		}
		dev.Zero(b.m)
		dev.Zero(b.v)
		z.buckets = append(z.buckets, b)
		if !b.inPlace(size) {
			packed = max(packed, b.per*size)
		}
	}
	if packed > 0 {
		if z.flat, err = dev.Alloc(packed); err == nil {
			z.shard, err = dev.Alloc(packed / size)
		}
		if err != nil {
			z.Close()
			return nil, fmt.Errorf("zero-1 bucket: %w", err)
		}
	}
	if err := z.setPipeline(nil, nil); err != nil {
		z.Close()
		return nil, err
	}
	return z, nil
}

// inPlace reports whether the bucket runs in its one parameter's memory:
// the gradient reduce-scattered and the parameter all-gathered in place,
// this rank's range being [rank*per, (rank+1)*per) of it.
func (b *zeroBucket) inPlace(dp int) bool {
	return len(b.params) == 1 && b.n == b.per*dp
}

// Close frees the moments and the buffers.
func (z *ZeRO1) Close() {
	for _, b := range z.buckets {
		z.dev.Free(b.m)
		z.dev.Free(b.v)
	}
	z.buckets = nil
	for _, t := range []**tensor.Tensor{&z.flat, &z.shard} {
		if *t != nil {
			z.dev.Free(*t)
			*t = nil
		}
	}
	if z.norm != nil {
		z.norm.close()
		z.norm = nil
	}
}

// reduce reduce-scatters the gradients (optimizer).
func (z *ZeRO1) reduce() error { return z.reduceScatter() }

// update enqueues the norm of this rank's ranges, the clipped AdamW update
// of the ranges and the all-gather of the parameters (optimizer).
func (z *ZeRO1) update(lr float64) error {
	views := normViews(z.params, z.uncount, z.tp.Rank(), func(i int) (*tensor.Tensor, int) { return z.ranges[i], z.firsts[i] })
	if err := z.norm.compute(views); err != nil {
		return err
	}
	z.AdamW.step++
	for _, b := range z.buckets {
		for _, s := range b.segs {
			p := z.params[s.idx]
			z.dev.AdamW(p.Data.View(s.pOff, s.n), p.Grad.View(s.pOff, s.n), b.m.View(s.sOff, s.n), b.v.View(s.sOff, s.n), z.hyper(p, lr), z.norm.scale())
		}
	}
	return z.allGather()
}

func (z *ZeRO1) gradNorm() *gradNorm { return z.norm }

func (z *ZeRO1) close() { z.Close() }

// reduceScatter averages every bucket's gradients over the DP group into
// this rank's range of each gradient (the rest is left as it was and is
// not read).
func (z *ZeRO1) reduceScatter() error {
	for i := range z.buckets {
		if err := z.reduceScatterBucket(&z.buckets[i]); err != nil {
			return fmt.Errorf("zero-1 gradient reduce-scatter (bucket %d of %d): %w", i+1, len(z.buckets), err)
		}
	}
	return nil
}

// allGather gives every replica every rank's updated ranges.
func (z *ZeRO1) allGather() error {
	for i := range z.buckets {
		if err := z.allGatherBucket(&z.buckets[i]); err != nil {
			return fmt.Errorf("zero-1 parameter all-gather (bucket %d of %d): %w", i+1, len(z.buckets), err)
		}
	}
	return nil
}

// reduceScatterBucket packs b's gradients (padding zeroed), averages them
// over the DP group into this rank's range and copies the range back into
// the gradients; or, in place, averages the gradient's range where it is.
func (z *ZeRO1) reduceScatterBucket(b *zeroBucket) error {
	size := z.dp.Size()
	if b.inPlace(size) {
		g := b.params[0].Grad
		return z.dp.ReduceScatter(g.View(z.dp.Rank()*b.per, b.per), g, nccl.Avg)
	}
	flat, shard := z.flat.View(0, b.per*size), z.shard.View(0, b.per)
	off := 0
	for _, p := range b.params {
		z.dev.Copy(flat.View(off, p.Grad.Len()), p.Grad)
		off += p.Grad.Len()
	}
	if off < flat.Len() {
		z.dev.Zero(flat.View(off, flat.Len()-off))
	}
	if err := z.dp.ReduceScatter(shard, flat, nccl.Avg); err != nil {
		return err
	}
	for _, s := range b.segs {
		z.dev.Copy(z.params[s.idx].Grad.View(s.pOff, s.n), shard.View(s.sOff, s.n))
	}
	return nil
}

// allGatherBucket packs this rank's updated range of b's parameters,
// gathers every rank's into the bucket buffer and copies the whole bucket
// back into the parameters; or, in place, gathers every rank's range into
// the parameter.
func (z *ZeRO1) allGatherBucket(b *zeroBucket) error {
	size := z.dp.Size()
	if b.inPlace(size) {
		d := b.params[0].Data
		return z.dp.AllGather(d, d.View(z.dp.Rank()*b.per, b.per))
	}
	flat, shard := z.flat.View(0, b.per*size), z.shard.View(0, b.per)
	covered := 0
	for _, s := range b.segs {
		covered += s.n
	}
	if covered < b.per { // the last rank's range runs into the padding
		z.dev.Zero(shard)
	}
	for _, s := range b.segs {
		z.dev.Copy(shard.View(s.sOff, s.n), z.params[s.idx].Data.View(s.pOff, s.n))
	}
	if err := z.dp.AllGather(flat, shard); err != nil {
		return err
	}
	off := 0
	for _, p := range b.params {
		z.dev.Copy(p.Data, flat.View(off, p.Data.Len()))
		off += p.Data.Len()
	}
	return nil
}

// setPipeline makes the norm a pipeline's: the squares also joined over
// the stages pp (nil: none), without those of uncount (nil: none), which
// another stage counts. Every stage calls it.
func (z *ZeRO1) setPipeline(pp nccl.Comm, uncount *parallel.Param) error {
	if z.norm != nil {
		z.norm.close()
	}
	z.uncount = uncount
	count := len(z.params)
	if uncount != nil {
		count--
	}
	var err error
	z.norm, err = newGradNorm(z.dev, count, z.clip, parallel.NewDeviceGroup(pp, z.dev), z.dp, z.tp)
	return err
}

// Pieces copies this rank's moments to the host, one piece per parameter
// range it owns, for a checkpoint.
func (z *ZeRO1) Pieces() []ckpt.ZeroPiece {
	var out []ckpt.ZeroPiece
	for _, b := range z.buckets {
		for _, s := range b.segs {
			pc := ckpt.ZeroPiece{Name: z.params[s.idx].Name, Offset: s.pOff, M: make([]float32, s.n), V: make([]float32, s.n)}
			z.dev.CopyToHost(pc.M, b.m.View(s.sOff, s.n))
			z.dev.CopyToHost(pc.V, b.v.View(s.sOff, s.n))
			out = append(out, pc)
		}
	}
	return out
}

// LoadMoments sets parameter i's moments from the whole (TP-local) m and v:
// this rank keeps the range it owns.
func (z *ZeRO1) LoadMoments(i int, m, v []float32) error {
	if n := z.params[i].Data.Len(); len(m) != n || len(v) != n {
		return fmt.Errorf("zero-1 %s: moments of %d and %d elements for a parameter of %d", z.params[i].Name, len(m), len(v), n)
	}
	for _, b := range z.buckets {
		for _, s := range b.segs {
			if s.idx == i {
				z.dev.CopyFromHost(b.m.View(s.sOff, s.n), m[s.pOff:s.pOff+s.n])
				z.dev.CopyFromHost(b.v.View(s.sOff, s.n), v[s.pOff:s.pOff+s.n])
			}
		}
	}
	return nil
}
