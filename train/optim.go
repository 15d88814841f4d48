package train

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// AdamW is the optimizer: Adam moments per parameter, decoupled weight
// decay, bias correction, and gradient-norm clipping that is correct under
// tensor and data parallelism.
type AdamW struct {
	dev         tensor.Device
	params      []*parallel.Param
	m, v        []*tensor.Tensor
	beta1       float32
	beta2       float32
	eps         float32
	weightDecay float32
	clip        float64
	step        int
}

// NewAdamW allocates the moments of params on dev.
func NewAdamW(dev tensor.Device, params []*parallel.Param, weightDecay, clip float64) (*AdamW, error) {
	o := &AdamW{dev: dev, params: params, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: float32(weightDecay), clip: clip}
	for _, p := range params {
		m, err := dev.Alloc(p.Data.Shape()...)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("adamw %s: %w", p.Name, err)
		}
		v, err := dev.Alloc(p.Data.Shape()...)
		if err != nil {
			dev.Free(m)
			o.Close()
			return nil, fmt.Errorf("adamw %s: %w", p.Name, err)
		}
		o.m, o.v = append(o.m, m), append(o.v, v)
	}
	return o, nil
}

// Close frees the moments; the optimizer must not be used again.
func (o *AdamW) Close() {
	for i := range o.m {
		o.dev.Free(o.m[i])
		o.dev.Free(o.v[i])
	}
	o.m, o.v = nil, nil
}

// GradNorm is the L2 norm of the whole model's gradient. Sharded parameters
// count on every TP rank and replicated ones on TP rank 0 only; the squares
// are then summed over the TP group. Gradients are the same on every DP rank
// (after the DP all-reduce), so the DP group needs no reduction.
func GradNorm(dev tensor.Device, params []*parallel.Param, tp nccl.Comm) (float64, error) {
	var sharded, replicated []*tensor.Tensor
	for _, p := range params {
		if p.Shard.Replicated() {
			replicated = append(replicated, p.Grad)
		} else {
			sharded = append(sharded, p.Grad)
		}
	}
	ss := dev.SumSquares(sharded...)
	if tp == nil || tp.Rank() == 0 {
		ss += dev.SumSquares(replicated...)
	}
	if tp != nil && tp.Size() > 1 {
		// float32 all-reduce of a float64 split in a high and a low part
		// keeps the sum exact enough for a norm.
		hi := float32(ss)
		buf := []float32{hi, float32(ss - float64(hi))}
		if err := tp.AllReduce(buf, nccl.Sum); err != nil {
			return 0, fmt.Errorf("grad norm: %w", err)
		}
		ss = float64(buf[0]) + float64(buf[1])
	}
	return math.Sqrt(ss), nil
}

// Step applies one AdamW update at learning rate lr to the gradients in the
// params, after clipping them to the global norm norm (from GradNorm).
func (o *AdamW) Step(lr, norm float64) {
	o.step++
	scale := float32(1)
	if o.clip > 0 && norm > o.clip {
		scale = float32(o.clip / (norm + 1e-6))
	}
	for i, p := range o.params {
		wd := float32(0)
		if p.Decay {
			wd = o.weightDecay
		}
		o.dev.AdamW(p.Data, p.Grad, o.m[i], o.v[i], tensor.AdamWParams{
			LR: float32(lr), Beta1: o.beta1, Beta2: o.beta2, Eps: o.eps,
			WeightDecay: wd, Step: o.step, GradScale: scale,
		})
	}
}

// gradBucketElems is the size of one DP all-reduce bucket: 4 Mi floats
// (16 MiB), large enough to amortise latency, small enough to bound the
// staging buffer.
const gradBucketElems = 1 << 22

// GradSync averages gradients over the data-parallel group in buckets: each
// bucket packs consecutive gradients into one buffer, all-reduces it, and
// unpacks it.
type GradSync struct {
	dev     tensor.Device
	dp      nccl.Comm
	buckets [][]*parallel.Param
	buf     []float32
}

// NewGradSync groups params into buckets of at most bucketElems elements (a
// larger parameter gets a bucket of its own); bucketElems <= 0 uses 4 Mi.
func NewGradSync(dev tensor.Device, dp nccl.Comm, params []*parallel.Param, bucketElems int) *GradSync {
	if bucketElems <= 0 {
		bucketElems = gradBucketElems
	}
	s := &GradSync{dev: dev, dp: dp}
	var cur []*parallel.Param
	n, biggest := 0, 0
	for _, p := range params {
		if len(cur) > 0 && n+p.Grad.Len() > bucketElems {
			s.buckets = append(s.buckets, cur)
			biggest = max(biggest, n)
			cur, n = nil, 0
		}
		cur = append(cur, p)
		n += p.Grad.Len()
	}
	if len(cur) > 0 {
		s.buckets = append(s.buckets, cur)
		biggest = max(biggest, n)
	}
	s.buf = make([]float32, biggest)
	return s
}

// Buckets is the number of all-reduces one Sync makes.
func (s *GradSync) Buckets() int { return len(s.buckets) }

// Sync averages every gradient over the DP group.
func (s *GradSync) Sync() error {
	if s.dp == nil || s.dp.Size() == 1 {
		return nil
	}
	for i, b := range s.buckets {
		off := 0
		for _, p := range b {
			s.dev.CopyToHost(s.buf[off:off+p.Grad.Len()], p.Grad)
			off += p.Grad.Len()
		}
		if err := s.dp.AllReduce(s.buf[:off], nccl.Avg); err != nil {
			return fmt.Errorf("gradient all-reduce (bucket %d of %d): %w", i+1, len(s.buckets), err)
		}
		off = 0
		for _, p := range b {
			s.dev.CopyFromHost(p.Grad, s.buf[off:off+p.Grad.Len()])
			off += p.Grad.Len()
		}
	}
	return nil
}

// Moments returns the AdamW first and second moments of parameter i (in
// the order of the params given to NewAdamW).
func (o *AdamW) Moments(i int) (m, v *tensor.Tensor) { return o.m[i], o.v[i] }

// Steps is the number of updates made, the t of Adam's bias correction.
func (o *AdamW) Steps() int { return o.step }

// SetSteps sets the update count, when the moments come from a checkpoint.
func (o *AdamW) SetSteps(n int) { o.step = n }
