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

// SetBetas sets Adam's beta1, beta2 and epsilon (NewAdamW starts at 0.9,
// 0.95, 1e-8).
func (o *AdamW) SetBetas(beta1, beta2, eps float64) {
	o.beta1, o.beta2, o.eps = float32(beta1), float32(beta2), float32(eps)
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
	return gradNormOver(dev, params, tp, nil)
}

// gradNormOver is GradNorm with the squares also added over pp, the
// stages of a pipeline (nil: one stage), each stage giving params without
// the copies of a parameter another stage counts.
func gradNormOver(dev tensor.Device, params []*parallel.Param, tp, pp nccl.Comm) (float64, error) {
	sq := make([]float64, len(params))
	for i, p := range params {
		if !p.Shard.Replicated() || tp == nil || tp.Rank() == 0 {
			sq[i] = dev.SumSquares(p.Grad)
		}
	}
	return normFromSquares(sq, pp, tp)
}

// normFromSquares is the global gradient norm from this rank's sums of
// squares, one per parameter it counts (in the model's order): each is
// summed over the groups in sum (ZeRO-1's DP group, then TP) in rank
// order, the stages' lists are joined in stage order over pp, and the
// whole list is summed in order. The values travel as the bits of their
// float64s (all-gathers copy them), so a model split over any number of
// stages adds the same numbers in the same order as one stage does, and
// its clip coefficient is the same to the bit: a float32 all-reduce would
// round the sum differently for every split.
func normFromSquares(sq []float64, pp nccl.Comm, sum ...nccl.Comm) (float64, error) {
	for _, c := range sum {
		if c == nil || c.Size() == 1 {
			continue
		}
		all, err := gatherFloat64s(c, sq)
		if err != nil {
			return 0, fmt.Errorf("grad norm: %w", err)
		}
		for i := range sq {
			sq[i] = 0
			for r := range c.Size() {
				sq[i] += all[r*len(sq)+i]
			}
		}
	}
	if pp != nil && pp.Size() > 1 {
		// The stages count different numbers of parameters: pad to the
		// largest, the first entry of each stage's list being its length.
		most := []float32{float32(len(sq))}
		if err := pp.AllReduce(most, nccl.Max); err != nil {
			return 0, fmt.Errorf("grad norm: %w", err)
		}
		n := int(most[0]) + 1
		mine := make([]float64, n)
		mine[0] = float64(len(sq))
		copy(mine[1:], sq)
		all, err := gatherFloat64s(pp, mine)
		if err != nil {
			return 0, fmt.Errorf("grad norm: %w", err)
		}
		sq = sq[:0:0]
		for s := range pp.Size() {
			stage := all[s*n : (s+1)*n]
			sq = append(sq, stage[1:1+int(stage[0])]...)
		}
	}
	total := 0.0
	for _, v := range sq {
		total += v
	}
	return math.Sqrt(total), nil
}

// gatherFloat64s all-gathers x (the same length on every rank of c) bit
// for bit; the result holds rank r's x at [r*len(x), (r+1)*len(x)).
func gatherFloat64s(c nccl.Comm, x []float64) ([]float64, error) {
	send := packFloat64s(x)
	recv := make([]float32, len(send)*c.Size())
	if err := c.AllGather(send, recv); err != nil {
		return nil, err
	}
	return unpackFloat64s(recv), nil
}

// packFloat64s carries each float64 of x as two float32 bit patterns, for
// collectives that copy (all-gather, broadcast) and so keep every bit.
func packFloat64s(x []float64) []float32 {
	out := make([]float32, 2*len(x))
	for i, v := range x {
		b := math.Float64bits(v)
		out[2*i], out[2*i+1] = math.Float32frombits(uint32(b>>32)), math.Float32frombits(uint32(b))
	}
	return out
}

// unpackFloat64s undoes packFloat64s.
func unpackFloat64s(b []float32) []float64 {
	out := make([]float64, len(b)/2)
	for i := range out {
		out[i] = math.Float64frombits(uint64(math.Float32bits(b[2*i]))<<32 | uint64(math.Float32bits(b[2*i+1])))
	}
	return out
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
		o.dev.AdamW(p.Data, p.Grad, o.m[i], o.v[i], o.hyper(p, lr, scale))
	}
}

// StepScaled is Step with the clip coefficient read from scale[0] in
// device memory (deviceStep.norm's), so that the host need not wait for
// the norm. The device must have AdamWScaled (the CUDA device).
func (o *AdamW) StepScaled(lr float64, scale *tensor.Tensor) {
	d := o.dev.(interface {
		AdamWScaled(param, grad, m, v *tensor.Tensor, p tensor.AdamWParams, scale *tensor.Tensor)
	})
	o.step++
	for i, p := range o.params {
		d.AdamWScaled(p.Data, p.Grad, o.m[i], o.v[i], o.hyper(p, lr, 1), scale)
	}
}

// hyper is the AdamW step's hyperparameters for p.
func (o *AdamW) hyper(p *parallel.Param, lr float64, scale float32) tensor.AdamWParams {
	wd := float32(0)
	if p.Decay {
		wd = o.weightDecay
	}
	return tensor.AdamWParams{
		LR: float32(lr), Beta1: o.beta1, Beta2: o.beta2, Eps: o.eps,
		WeightDecay: wd, Step: o.step, GradScale: scale,
	}
}

// gradBucketElems is the size of one DP all-reduce bucket: 4 Mi floats
// (16 MiB), large enough to amortise latency, small enough to bound the
// staging buffer.
const gradBucketElems = 1 << 22

// GradSync averages gradients over the data-parallel group in buckets: a
// bucket of one gradient is all-reduced in place, a bucket of several is
// packed into one device buffer (allocated on the first Sync that needs
// it), all-reduced and unpacked. parallel.Group runs the all-reduce on
// device memory (NCCL on the compute stream) or through host memory.
type GradSync struct {
	dev     tensor.Device
	dp      *parallel.Group
	buckets [][]*parallel.Param
	biggest int
	buf     *tensor.Tensor // the packed bucket
}

// NewGradSync groups params into buckets of at most bucketElems elements (a
// larger parameter gets a bucket of its own); bucketElems <= 0 uses 4 Mi.
func NewGradSync(dev tensor.Device, dp nccl.Comm, params []*parallel.Param, bucketElems int) *GradSync {
	s := &GradSync{dev: dev, dp: parallel.NewDeviceGroup(dp, dev)}
	s.buckets, s.biggest = bucketParams(params, bucketElems)
	return s
}

// bucketParams cuts params into runs of consecutive parameters of at most
// bucketElems elements (<= 0: 4 Mi), a larger one alone, and returns them
// with the element count of the biggest.
func bucketParams(params []*parallel.Param, bucketElems int) (buckets [][]*parallel.Param, biggest int) {
	if bucketElems <= 0 {
		bucketElems = gradBucketElems
	}
	var cur []*parallel.Param
	n := 0
	for _, p := range params {
		if len(cur) > 0 && n+p.Grad.Len() > bucketElems {
			buckets = append(buckets, cur)
			biggest = max(biggest, n)
			cur, n = nil, 0
		}
		cur = append(cur, p)
		n += p.Grad.Len()
	}
	if len(cur) > 0 {
		buckets = append(buckets, cur)
		biggest = max(biggest, n)
	}
	return buckets, biggest
}

// Buckets is the number of all-reduces one Sync makes.
func (s *GradSync) Buckets() int { return len(s.buckets) }

// Sync averages every gradient over the DP group.
func (s *GradSync) Sync() error {
	if s.dp.Size() == 1 {
		return nil
	}
	for i, b := range s.buckets {
		if err := s.syncBucket(b); err != nil {
			return fmt.Errorf("gradient all-reduce (bucket %d of %d): %w", i+1, len(s.buckets), err)
		}
	}
	return nil
}

// syncBucket averages one bucket's gradients.
func (s *GradSync) syncBucket(b []*parallel.Param) error {
	if len(b) == 1 {
		return s.dp.AllReduce(b[0].Grad, nccl.Avg)
	}
	if s.buf == nil {
		var err error
		if s.buf, err = s.dev.Alloc(s.biggest); err != nil {
			return err
		}
	}
	off := 0
	for _, p := range b {
		s.dev.Copy(s.buf.View(off, p.Grad.Len()), p.Grad)
		off += p.Grad.Len()
	}
	if err := s.dp.AllReduce(s.buf.View(0, off), nccl.Avg); err != nil {
		return err
	}
	off = 0
	for _, p := range b {
		s.dev.Copy(p.Grad, s.buf.View(off, p.Grad.Len()))
		off += p.Grad.Len()
	}
	return nil
}

// Close frees the bucket buffer.
func (s *GradSync) Close() {
	if s.buf != nil {
		s.dev.Free(s.buf)
		s.buf = nil
	}
}

// Moments returns the AdamW first and second moments of parameter i (in
// the order of the params given to NewAdamW).
func (o *AdamW) Moments(i int) (m, v *tensor.Tensor) { return o.m[i], o.v[i] }

// Steps is the number of updates made, the t of Adam's bias correction.
func (o *AdamW) Steps() int { return o.step }

// SetSteps sets the update count, when the moments come from a checkpoint.
func (o *AdamW) SetSteps(n int) { o.step = n }
