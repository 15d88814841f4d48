package train

import (
	"fmt"

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

// StepScaled applies one AdamW update at learning rate lr to the
// gradients in the params, scaled by the clip coefficient in scale[0] in
// device memory (gradNorm's), so that the host need not wait for the norm.
// A parameter's bfloat16 copy (Param.Copy) gets its new values in the
// same pass.
func (o *AdamW) StepScaled(lr float64, scale *tensor.Tensor) {
	o.step++
	if many, ok := o.dev.(tensor.MultiTensorAdamW); ok && len(o.params) > 1 {
		n := len(o.params)
		data, grads, halves, hyper := make([]*tensor.Tensor, n), make([]*tensor.Tensor, n), make([]*tensor.Tensor, n), make([]tensor.AdamWParams, n)
		for i, p := range o.params {
			data[i], grads[i], halves[i], hyper[i] = p.Data, p.Grad, p.Copy, o.hyper(p, lr)
		}
		many.AdamWMany(data, grads, o.m, o.v, halves, hyper, scale)
		return
	}
	for i, p := range o.params {
		o.dev.AdamW(p.Data, p.Grad, o.m[i], o.v[i], p.Copy, o.hyper(p, lr), scale)
	}
}

// hyper is the AdamW step's hyperparameters for p.
func (o *AdamW) hyper(p *parallel.Param, lr float64) tensor.AdamWParams {
	wd := float32(0)
	if p.Decay {
		wd = o.weightDecay
	}
	return tensor.AdamWParams{
		LR: float32(lr), Beta1: o.beta1, Beta2: o.beta2, Eps: o.eps,
		WeightDecay: wd, Step: o.step,
	}
}

// GradSync averages gradients over the data-parallel group in buckets: a
// bucket of one gradient is all-reduced in place, a bucket of several is
// packed into one device buffer (allocated on the first Sync that needs
// it), all-reduced and unpacked; in bfloat16 every bucket goes through
// the buffer, rounded on the way in and widened on the way out.
// parallel.Group runs the all-reduce on device memory (NCCL on the
// compute stream) or through host memory.
type GradSync struct {
	dev     tensor.Device
	dp      *parallel.Group
	buckets [][]*parallel.Param
	biggest int
	buf     *tensor.Tensor // the packed bucket
	bf16    bool           // all-reduce bfloat16 (grad_reduce bf16)
}

// NewGradSync groups params into buckets of at most bucketElems elements (a
// larger parameter gets a bucket of its own); bucketElems <= 0 uses
// parallel.GradBucketElems. With bf16 every bucket is rounded into a
// bfloat16 buffer, all-reduced in bfloat16 and widened back into the
// gradients (grad_reduce bf16).
func NewGradSync(dev tensor.Device, dp nccl.Comm, params []*parallel.Param, bucketElems int, bf16 bool) *GradSync {
	s := &GradSync{dev: dev, dp: parallel.NewDeviceGroup(dp, dev), bf16: bf16}
	s.buckets, s.biggest = bucketParams(params, bucketElems)
	return s
}

// bucketParams cuts params into parallel.GradBuckets' buckets and returns
// them with the element count of the biggest.
func bucketParams(params []*parallel.Param, bucketElems int) (buckets [][]*parallel.Param, biggest int) {
	sizes := make([]int64, len(params))
	for i, p := range params {
		sizes[i] = int64(p.Grad.Len())
	}
	for _, b := range parallel.GradBuckets(sizes, int64(bucketElems)) {
		buckets = append(buckets, params[:b.Tensors:b.Tensors])
		params = params[b.Tensors:]
		biggest = max(biggest, int(b.Elems))
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
	if len(b) == 1 && !s.bf16 {
		return s.dp.AllReduce(b[0].Grad, nccl.Avg)
	}
	if s.buf == nil {
		dt := tensor.Float32
		if s.bf16 {
			dt = tensor.BFloat16
		}
		var err error
		if s.buf, err = s.dev.AllocAs(dt, s.biggest); err != nil {
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

// optimizer turns a step's gradients into the parameters' update: the
// replicated AdamW after a data-parallel all-reduce, or ZeRO.
type optimizer interface {
	// reduce averages the gradients over the data-parallel group.
	reduce() error
	// update enqueues the gradient norm, the clip and AdamW at lr.
	update(lr float64) error
	// gradNorm is the norm update computes, and the step's scalars.
	gradNorm() *gradNorm
	close()
}

// replicated is the optimizer of data-parallel ranks that each hold all
// the moments: GradSync's all-reduce, then the norm and AdamW.
type replicated struct {
	sync  *GradSync
	adam  *AdamW
	norm  *gradNorm
	views []*tensor.Tensor // the norm's list of gradients
}

// newReplicated makes the replicated optimizer of params with adam's
// moments: the norm summed over tp and joined over a pipeline's stages pp
// (nil: none), leaving out skip (a copy another stage counts);
// bf16Reduce all-reduces the gradients in bfloat16.
func newReplicated(dev tensor.Device, params []*parallel.Param, adam *AdamW, dp, tp, pp nccl.Comm, skip *parallel.Param, clip float64, bf16Reduce bool) (*replicated, error) {
	r := &replicated{sync: NewGradSync(dev, dp, params, 0, bf16Reduce), adam: adam}
	tpg := parallel.NewDeviceGroup(tp, dev)
	r.views = normViews(params, skip, tpg.Rank(), func(i int) (*tensor.Tensor, int) { return params[i].Grad, 0 })
	var err error
	if r.norm, err = newGradNorm(dev, len(r.views), clip, parallel.NewDeviceGroup(pp, dev), tpg); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *replicated) reduce() error { return r.sync.Sync() }

func (r *replicated) update(lr float64) error {
	if err := r.norm.compute(r.views); err != nil {
		return err
	}
	r.adam.StepScaled(lr, r.norm.scale())
	return nil
}

func (r *replicated) gradNorm() *gradNorm { return r.norm }

func (r *replicated) close() {
	r.sync.Close()
	r.norm.close()
	r.adam.Close()
}

// Moments returns the AdamW first and second moments of parameter i (in
// the order of the params given to NewAdamW).
func (o *AdamW) Moments(i int) (m, v *tensor.Tensor) { return o.m[i], o.v[i] }

// Steps is the number of updates made, the t of Adam's bias correction.
func (o *AdamW) Steps() int { return o.step }

// SetSteps sets the update count, when the moments come from a checkpoint.
func (o *AdamW) SetSteps(n int) { o.step = n }
