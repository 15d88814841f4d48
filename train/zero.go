package train

import (
	"fmt"
	"slices"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// ZeRO is AdamW with its moments sharded over the data-parallel group
// (ZeRO stage 1, arXiv 1910.02054), at stage 2 the gradients too and at
// stage 3 the parameters. The gradients are cut into the buckets of
// GradSync (consecutive parameters, at most bucketElems
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
//
// ZeRO-2 (NewBlockZeRO) keeps only this rank's range of the blocks'
// gradients: the model's blocks write their gradients into one buffer
// they share (parallel.ParamSet's BlockGrads), each block is one bucket,
// and as a block's backward ends its bucket is reduce-scattered out of
// that buffer into the range this rank keeps (reduceBlock), added up over
// the step's micro-batches; the embeddings', the final norm's and the
// head's gradients are whole and reduced after the backward as at stage
// 1. Per step and dp rank the gradients then take one block's whole, the
// rest's whole and 1/dp of the blocks', instead of all of them whole.
// ZeRO-3 updates the range of the blocks' values the set keeps
// (BlockShard) in place and all-gathers nothing after the update: the
// set gathers each block before it runs. Under hybrid sharding dp is
// ZeRO's group of the data-parallel ranks (parallel.Mesh.ZeroShard), and
// each reduce-scattered range is averaged over the replicas. Under
// grad_reduce bf16 (ReduceInBF16) the reduce-scatters, and the replicas'
// averages, carry bfloat16.
type ZeRO struct {
	*AdamW // hyperparameters and the step count; it holds no moments

	dev         tensor.Device
	dp, tp      *parallel.Group
	uncount     *parallel.Param // a parameter another stage counts in the norm (the tied embedding's copy)
	params      []*parallel.Param
	ranges      []*tensor.Tensor // this rank's range of each gradient (nil: none)
	firsts      []int            // where each range starts in its gradient
	buckets     []zeroBucket
	flat, shard *tensor.Tensor // a packed bucket, padded, and this rank's range of it (nil: no bucket is packed)
	// flatHalf and shardHalf are the largest bucket, padded, rounded to
	// bfloat16, and its range, under grad_reduce bf16 (nil: float32).
	flatHalf, shardHalf *tensor.Tensor
	norm                *gradNorm // over this rank's ranges: summed over dp, then tp
	blockBucket         []int     // ZeRO-2 and 3: the bucket of each block of the stage
	set                 *parallel.ParamSet
	// replicas, under hybrid sharding, holds this rank's ranges in the
	// other groups of dp ranks: each reduce-scattered range is then
	// averaged over it (nil: dp is the whole data-parallel group).
	replicas *parallel.Group
}

// zeroBucket is one bucket: its parameters, its padded size and this
// rank's range of it.
type zeroBucket struct {
	params []*parallel.Param
	n, per int            // elements, elements per DP rank (padded)
	m, v   *tensor.Tensor // moments of this rank's range (per)
	segs   []zeroSeg      // the parameters' pieces in this rank's range
	// A block's bucket under ZeRO-2 and 3: its gradients are the blocks'
	// shared buffer (blockFlat, padded), reduce-scattered into grad, this
	// rank's range, after each micro-batch's backward of the block (fresh:
	// none yet this step); under ZeRO-3 data is this rank's range of its
	// values (the set's BlockShard), the rest of them nowhere here.
	blockFlat, grad, data *tensor.Tensor
	fresh                 bool
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
	if cfg.Zero > 0 {
		s += fmt.Sprintf(" + ZeRO-%d", cfg.Zero)
		if cfg.ZeroGroup == "node" {
			s += " over each node's dp ranks (hybrid)"
		} else if cfg.ZeroGroup != "" {
			s += " over groups of " + cfg.ZeroGroup + " dp ranks (hybrid)"
		}
	}
	return s
}

// NewZeRO1 buckets params as NewGradSync does and allocates the moments of
// this DP rank's ranges and the bucket buffers on dev.
func NewZeRO1(dev tensor.Device, params []*parallel.Param, dp, tp nccl.Comm, weightDecay, clip float64, bucketElems int) (*ZeRO, error) {
	return newZeRO(dev, params, nil, dp, tp, weightDecay, clip, bucketElems)
}

// NewBlockZeRO is NewZeRO1 at stage 2, or 3, over the parameters of set,
// whose blocks write their gradients into one shared buffer (and at stage
// 3 keep their ranges of their values): each block is a bucket of its
// own, reduce-scattered as its backward ends (reduceBlock), whose range of
// values (stage 3) is updated in the set's shard and gathered by the set
// before the block runs; the others are bucketed as NewZeRO1's.
func NewBlockZeRO(dev tensor.Device, set *parallel.ParamSet, dp, tp nccl.Comm, weightDecay, clip float64, bucketElems int) (*ZeRO, error) {
	if len(set.Blocks()) > 0 && set.BlockGrads() == nil {
		return nil, fmt.Errorf("zero: the blocks' gradients are not shared (stages 2 and 3 need the model's shared buffer)")
	}
	return newZeRO(dev, set.Params(), set, dp, tp, weightDecay, clip, bucketElems)
}

// zeroBuckets cuts params into ZeRO's buckets (parallel.BlockBuckets):
// each of blocks one bucket, the runs of parameters between them as
// bucketParams cuts them. It returns, for each block, the index of its
// bucket.
func zeroBuckets(params []*parallel.Param, blocks [][]*parallel.Param, bucketElems int) (buckets [][]*parallel.Param, blockBucket []int) {
	in := make(map[*parallel.Param]int)
	for i, b := range blocks {
		for _, p := range b {
			in[p] = i
		}
	}
	sizes, block := make([]int64, len(params)), make([]int, len(params))
	for i, p := range params {
		sizes[i], block[i] = int64(p.Grad.Len()), -1
		if b, ok := in[p]; ok {
			block[i] = b
		}
	}
	for _, b := range parallel.BlockBuckets(sizes, block, int64(bucketElems)) {
		if b.Block {
			blockBucket = append(blockBucket, len(buckets))
		}
		buckets = append(buckets, params[:b.Tensors:b.Tensors])
		params = params[b.Tensors:]
	}
	return buckets, blockBucket
}

func newZeRO(dev tensor.Device, params []*parallel.Param, set *parallel.ParamSet, dp, tp nccl.Comm, weightDecay, clip float64, bucketElems int) (*ZeRO, error) {
	var blocks [][]*parallel.Param
	var blockGrads *tensor.Tensor
	if set != nil {
		blocks, blockGrads = set.Blocks(), set.BlockGrads()
	}
	adam, err := NewAdamW(dev, nil, weightDecay, clip)
	if err != nil {
		return nil, err
	}
	z := &ZeRO{AdamW: adam, dev: dev, dp: parallel.NewDeviceGroup(dp, dev), tp: parallel.NewDeviceGroup(tp, dev), params: params,
		ranges: make([]*tensor.Tensor, len(params)), firsts: make([]int, len(params)), set: set}
	size, rank := z.dp.Size(), z.dp.Rank()
	buckets, blockBucket := zeroBuckets(params, blocks, bucketElems)
	z.blockBucket = blockBucket
	early := make(map[int]bool, len(blockBucket))
	for _, i := range blockBucket {
		early[i] = true
	}
	index := make(map[*parallel.Param]int, len(params))
	for i, p := range params {
		index[p] = i
	}
	packed, scratch := 0, 0
	for bi, ps := range buckets {
		b := zeroBucket{params: ps}
		for _, p := range ps {
			b.n += p.Data.Len()
		}
		b.per = (b.n + size - 1) / size
		lo, hi := rank*b.per, min((rank+1)*b.per, b.n)
		if early[bi] {
			if b.per*size > blockGrads.Len() {
				z.Close()
				return nil, fmt.Errorf("zero: a block of %d gradients, padded to %d, in a shared buffer of %d", b.n, b.per*size, blockGrads.Len())
			}
			b.blockFlat, b.fresh, b.data = blockGrads.View(0, b.per*size), true, set.BlockShard(slices.Index(blockBucket, bi))
			if b.data != nil && b.data.Len() != b.per {
				z.Close()
				return nil, fmt.Errorf("zero 3: a block's range of %d values, its bucket's %d", b.data.Len(), b.per)
			}
			if b.grad, err = dev.Alloc(b.per); err != nil {
				z.Close()
				return nil, fmt.Errorf("zero gradients: %w", err)
			}
			scratch = max(scratch, b.per)
		}
		off := 0
		for _, p := range ps {
			s, e := max(off, lo), min(off+p.Data.Len(), hi)
			if s < e {
				b.segs = append(b.segs, zeroSeg{idx: index[p], pOff: s - off, sOff: s - lo, n: e - s})
				z.ranges[index[p]], z.firsts[index[p]] = p.Grad.View(s-off, e-s), s-off
				if b.grad != nil {
					z.ranges[index[p]] = b.grad.View(s-lo, e-s)
				}
			}
			off += p.Data.Len()
		}
		if b.m, err = dev.Alloc(b.per); err == nil {
			if b.v, err = dev.Alloc(b.per); err != nil {
				dev.Free(b.m)
			}
		}
		if err != nil {
			if b.grad != nil {
				dev.Free(b.grad)
			}
			z.Close()
			return nil, fmt.Errorf("zero moments: %w", err)
		}
		dev.Zero(b.m)
		dev.Zero(b.v)
		z.buckets = append(z.buckets, b)
		if b.blockFlat == nil && !b.inPlace(size) {
			packed = max(packed, b.per*size)
		}
	}
	// The blocks' buckets gather in their shared buffer, and need a range
	// of their own to stage the update and the micro-batches'
	// reduce-scatters.
	if packed > 0 {
		if z.flat, err = dev.Alloc(packed); err != nil {
			z.Close()
			return nil, fmt.Errorf("zero bucket: %w", err)
		}
	}
	if shard := max(packed/size, scratch); shard > 0 {
		if z.shard, err = dev.Alloc(shard); err != nil {
			z.Close()
			return nil, fmt.Errorf("zero bucket: %w", err)
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
func (z *ZeRO) Close() {
	for _, b := range z.buckets {
		z.dev.Free(b.m)
		z.dev.Free(b.v)
		if b.grad != nil {
			z.dev.Free(b.grad)
		}
	}
	z.buckets = nil
	for _, t := range []**tensor.Tensor{&z.flat, &z.shard, &z.flatHalf, &z.shardHalf} {
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
func (z *ZeRO) reduce() error { return z.reduceScatter() }

// update enqueues the norm of this rank's ranges, the clipped AdamW update
// of the ranges and the all-gather of the parameters (optimizer).
func (z *ZeRO) update(lr float64) error {
	views := normViews(z.params, z.uncount, z.tp.Rank(), func(i int) (*tensor.Tensor, int) { return z.ranges[i], z.firsts[i] })
	if err := z.norm.compute(views); err != nil {
		return err
	}
	z.AdamW.step++
	for i := range z.buckets {
		b := &z.buckets[i]
		for _, s := range b.segs {
			p := z.params[s.idx]
			values := p.Data.View(s.pOff, s.n)
			if b.data != nil {
				values = b.data.View(s.sOff, s.n)
			}
			z.dev.AdamW(values, z.ranges[s.idx], b.m.View(s.sOff, s.n), b.v.View(s.sOff, s.n), nil, z.hyper(p, lr), z.norm.scale())
		}
		b.fresh = b.grad != nil
	}
	if z.set != nil {
		z.set.Updated()
	}
	return z.allGather()
}

func (z *ZeRO) gradNorm() *gradNorm { return z.norm }

func (z *ZeRO) close() { z.Close() }

// reduceScatter averages every bucket's gradients over the DP group into
// this rank's range of each gradient (the rest is left as it was and is
// not read).
func (z *ZeRO) reduceScatter() error {
	for i := range z.buckets {
		b := &z.buckets[i]
		switch {
		case b.grad != nil && b.fresh:
			return fmt.Errorf("zero: bucket %d of %d, a block's, got no gradient this step", i+1, len(z.buckets))
		case b.grad != nil: // reduced as the block's backward ended
		default:
			if err := z.reduceScatterBucket(b); err != nil {
				return fmt.Errorf("zero gradient reduce-scatter (bucket %d of %d): %w", i+1, len(z.buckets), err)
			}
		}
	}
	return nil
}

// reduceBlock averages block l's gradients of one micro-batch, in the
// blocks' shared buffer, over the DP group into this rank's range of them,
// which the step's first micro-batch overwrites and the others add to
// (blockGrads.reduce).
func (z *ZeRO) reduceBlock(l int) error {
	if l < 0 || l >= len(z.blockBucket) {
		return fmt.Errorf("zero: block %d of %d", l, len(z.blockBucket))
	}
	b := &z.buckets[z.blockBucket[l]]
	dst := b.grad
	if !b.fresh {
		dst = z.shard.View(0, b.per)
	}
	if z.flatHalf != nil {
		shard, err := z.reduceHalf(b, func(flat *tensor.Tensor) { z.dev.Copy(flat, b.blockFlat) })
		if err != nil {
			return fmt.Errorf("zero gradient reduce-scatter (block %d): %w", l, err)
		}
		z.dev.Copy(dst, shard)
	} else {
		if err := z.dp.ReduceScatter(dst, b.blockFlat, nccl.Avg); err != nil {
			return fmt.Errorf("zero gradient reduce-scatter (block %d): %w", l, err)
		}
		if err := z.overReplicas(dst); err != nil {
			return fmt.Errorf("zero gradient all-reduce over the replicas (block %d): %w", l, err)
		}
	}
	if !b.fresh {
		z.dev.Add(b.grad, b.grad, dst)
	}
	b.fresh = false
	return nil
}

// allGather gives every replica every rank's updated ranges; under ZeRO-3
// not of the blocks, which the set gathers before each runs.
func (z *ZeRO) allGather() error {
	for i := range z.buckets {
		if z.buckets[i].data != nil {
			continue
		}
		if err := z.allGatherBucket(&z.buckets[i]); err != nil {
			return fmt.Errorf("zero parameter all-gather (bucket %d of %d): %w", i+1, len(z.buckets), err)
		}
	}
	return nil
}

// reduceScatterBucket packs b's gradients (padding zeroed), averages them
// over the DP group into this rank's range and copies the range back into
// the gradients; or, in place, averages the gradient's range where it is.
func (z *ZeRO) reduceScatterBucket(b *zeroBucket) error {
	size := z.dp.Size()
	if z.flatHalf != nil {
		shard, err := z.reduceHalf(b, func(flat *tensor.Tensor) { z.pack(flat, b) })
		if err != nil {
			return err
		}
		for _, s := range b.segs {
			z.dev.Copy(z.params[s.idx].Grad.View(s.pOff, s.n), shard.View(s.sOff, s.n))
		}
		return nil
	}
	if b.inPlace(size) {
		g := b.params[0].Grad
		mine := g.View(z.dp.Rank()*b.per, b.per)
		if err := z.dp.ReduceScatter(mine, g, nccl.Avg); err != nil {
			return err
		}
		return z.overReplicas(mine)
	}
	flat, shard := z.flat.View(0, b.per*size), z.shard.View(0, b.per)
	z.pack(flat, b)
	if err := z.dp.ReduceScatter(shard, flat, nccl.Avg); err != nil {
		return err
	}
	if err := z.overReplicas(shard); err != nil {
		return err
	}
	for _, s := range b.segs {
		z.dev.Copy(z.params[s.idx].Grad.View(s.pOff, s.n), shard.View(s.sOff, s.n))
	}
	return nil
}

// pack copies b's gradients one after the other into flat (b.per*dp
// elements, float32 or bfloat16: rounded), the padding zeroed.
func (z *ZeRO) pack(flat *tensor.Tensor, b *zeroBucket) {
	off := 0
	for _, p := range b.params {
		z.dev.Copy(flat.View(off, p.Grad.Len()), p.Grad)
		off += p.Grad.Len()
	}
	if off < flat.Len() {
		z.dev.Zero(flat.View(off, flat.Len()-off))
	}
}

// ReduceInBF16 makes the gradients' reduce-scatters carry bfloat16
// (grad_reduce bf16, as Megatron-LM's distributed optimizer with
// --grad-reduce-in-bf16): each bucket rounded into a bfloat16 buffer,
// averaged over the DP group (and the replicas) in bfloat16 into its
// range, widened into the float32 range the update reads.
func (z *ZeRO) ReduceInBF16() error {
	if z.flatHalf != nil {
		return nil
	}
	size, flat, per := z.dp.Size(), 0, 0
	for _, b := range z.buckets {
		flat, per = max(flat, b.per*size), max(per, b.per)
	}
	var err error
	if z.flatHalf, err = z.dev.AllocAs(tensor.BFloat16, flat); err != nil {
		return fmt.Errorf("zero bf16 bucket: %w", err)
	}
	if z.shardHalf, err = z.dev.AllocAs(tensor.BFloat16, per); err != nil {
		z.dev.Free(z.flatHalf)
		z.flatHalf = nil
		return fmt.Errorf("zero bf16 bucket: %w", err)
	}
	return nil
}

// reduceHalf averages bucket b in bfloat16 over the DP group and the
// replicas: pack writes its float32 gradients, padded, into the bfloat16
// bucket (rounding them); it returns this rank's range (b.per bfloat16
// elements).
func (z *ZeRO) reduceHalf(b *zeroBucket, pack func(flat *tensor.Tensor)) (*tensor.Tensor, error) {
	flat, shard := z.flatHalf.View(0, b.per*z.dp.Size()), z.shardHalf.View(0, b.per)
	pack(flat)
	if err := z.dp.ReduceScatter(shard, flat, nccl.Avg); err != nil {
		return nil, err
	}
	if err := z.overReplicas(shard); err != nil {
		return nil, err
	}
	return shard, nil
}

// allGatherBucket packs this rank's updated range of b's parameters,
// gathers every rank's into the bucket buffer and copies the whole bucket
// back into the parameters; or, in place, gathers every rank's range into
// the parameter.
func (z *ZeRO) allGatherBucket(b *zeroBucket) error {
	size := z.dp.Size()
	if b.blockFlat == nil && b.inPlace(size) {
		d := b.params[0].Data
		return z.dp.AllGather(d, d.View(z.dp.Rank()*b.per, b.per))
	}
	flat, shard := b.blockFlat, z.shard.View(0, b.per)
	if flat == nil {
		flat = z.flat.View(0, b.per*size)
	}
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
func (z *ZeRO) setPipeline(pp nccl.Comm, uncount *parallel.Param) error {
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
func (z *ZeRO) Pieces() []ckpt.ZeroPiece {
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
func (z *ZeRO) LoadMoments(i int, m, v []float32) error {
	if n := z.params[i].Data.Len(); len(m) != n || len(v) != n {
		return fmt.Errorf("zero %s: moments of %d and %d elements for a parameter of %d", z.params[i].Name, len(m), len(v), n)
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

// newOptimZeRO is the run's ZeRO optimizer over m's parameters, at the
// config's stage: at stages 2 and 3 it takes each block's gradients out of
// the model's shared buffer as the block's backward ends.
func newOptimZeRO(cfg config.Config, m model, dev tensor.Device, mesh *parallel.Mesh) (*ZeRO, error) {
	var z *ZeRO
	var err error
	t, ok := m.(*transformer)
	switch {
	case cfg.Zero == 1:
		z, err = NewZeRO1(dev, m.Params(), mesh.ZeroShard, mesh.TP, cfg.WeightDecay, cfg.GradClip, 0)
	case !ok || t.blockGrads == nil:
		return nil, fmt.Errorf("zero %d: this model does not share its blocks' gradients: use zero 1", cfg.Zero)
	default:
		z, err = NewBlockZeRO(dev, t.set, mesh.ZeroShard, mesh.TP, cfg.WeightDecay, cfg.GradClip, 0)
	}
	if err != nil {
		return nil, err
	}
	if mesh.ZeroReplicas != nil {
		z.replicas = parallel.NewDeviceGroup(mesh.ZeroReplicas, dev)
	}
	if cfg.GradReduceBF16() {
		if err := z.ReduceInBF16(); err != nil {
			z.Close()
			return nil, err
		}
	}
	if ok && t.blockGrads != nil {
		t.blockGrads.reduce = z.reduceBlock
	}
	return z, nil
}

// overReplicas averages a reduce-scattered range over the groups that
// hold the same range under hybrid sharding (nothing without).
func (z *ZeRO) overReplicas(r *tensor.Tensor) error {
	if z.replicas == nil {
		return nil
	}
	return z.replicas.AllReduce(r, nccl.Avg)
}
