package train

import (
	"fmt"
	"math"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// The GPU step: a language model on a device that keeps its scalars in
// its own memory (the CUDA device), with NCCL for every collective, runs
// an optimizer step with one host synchronisation. The loss of each
// micro-batch is summed on the device, the DP gradient all-reduce (or
// ZeRO-1's reduce-scatter, sharded update and all-gather: zero_device.go)
// and the TP and DP reductions of the norm and the loss run as NCCL
// collectives on the compute stream, the clip coefficient is computed
// there and read by the AdamW kernel, and the step ends with one read of
// (norm, loss).
// Everywhere else (the CPU, a classifier, host-staged collectives) the
// step of loop.go runs.

// deviceOps is what the GPU step needs of a device beyond tensor.Device.
type deviceOps interface {
	tensor.Device
	parallel.Streamer
	SumSquaresTo(out *tensor.Tensor, accumulate bool, ts ...*tensor.Tensor)
	ClipScale(out, sumsq *tensor.Tensor, clip float32)
	AdamWScaled(param, grad, m, v *tensor.Tensor, p tensor.AdamWParams, scale *tensor.Tensor)
	SumTo(out *tensor.Tensor, alpha float32, accumulate bool, x *tensor.Tensor)
	Fetch(dst []float32, src *tensor.Tensor) error
	HostSyncs() int64
}

// deviceLM is a model whose training Forward can leave the loss on the
// device (the GPT language model).
type deviceLM interface {
	DeviceLoss() bool
	ForwardOnDevice(b *Batch) (losses *tensor.Tensor, count int, err error)
}

// deviceStep holds the GPU step's device scalars, in one tensor:
// [0:2] the squared norm (hi, lo), [2] the clip coefficient, [3] the norm,
// [4] the mean loss; [3:5] is what the step reads back.
type deviceStep struct {
	dev   deviceOps
	lm    deviceLM
	tp    *parallel.Group
	dp    *parallel.Group
	zero  *ZeRO1 // the optimizer when it is ZeRO-1 on the device (nil: AdamW after the all-reduce)
	buf   *tensor.Tensor
	sumsq *tensor.Tensor
	scale *tensor.Tensor
	loss  *tensor.Tensor
	out   [2]float32 // norm, loss
}

// scalarDevice returns dev's scalar operations when a step's scalars (the
// loss, the squared norm, the clip coefficient) can stay in its memory:
// dev has them (the CUDA device) and every group's collectives run there.
func scalarDevice(dev tensor.Device, groups ...*parallel.Group) (deviceOps, bool) {
	d, ok := dev.(deviceOps)
	if !ok {
		return nil, false
	}
	for _, g := range groups {
		if !g.Resident(dev) {
			return nil, false
		}
	}
	return d, true
}

// newDeviceStep returns the GPU step for this trainer, or nil and why not
// ("" when the device is the CPU, where nothing needs saying).
func newDeviceStep(dev tensor.Device, m model, tp, dp *parallel.Group) (*deviceStep, string, error) {
	if _, ok := dev.(deviceOps); !ok {
		return nil, "", nil
	}
	lm, ok := m.(deviceLM)
	if !ok || !lm.DeviceLoss() {
		return nil, "the classifier reads its predictions each micro-batch", nil
	}
	d, ok := scalarDevice(dev, tp, dp)
	if !ok {
		return nil, "a parallel group has no NCCL communicator", nil
	}
	ds := &deviceStep{dev: d, lm: lm, tp: tp, dp: dp}
	buf, err := dev.Alloc(5)
	if err != nil {
		return nil, "", fmt.Errorf("gpu step: %w", err)
	}
	ds.buf, ds.sumsq, ds.scale, ds.loss = buf, buf.View(0, 2), buf.View(2, 2), buf.View(4, 1)
	return ds, "", nil
}

// norm computes the global gradient norm and the clip coefficient on the
// device (GradNorm's rule: sharded parameters on every TP rank, replicated
// ones on TP rank 0, summed over the TP group).
func (ds *deviceStep) norm(params []*parallel.Param, tpRank int, clip float64) error {
	var sharded, replicated []*tensor.Tensor
	for _, p := range params {
		if p.Shard.Replicated() {
			replicated = append(replicated, p.Grad)
		} else {
			sharded = append(sharded, p.Grad)
		}
	}
	ds.dev.SumSquaresTo(ds.sumsq, false, sharded...)
	if tpRank == 0 {
		ds.dev.SumSquaresTo(ds.sumsq, true, replicated...)
	}
	if err := ds.tp.AllReduce(ds.sumsq, nccl.Sum); err != nil {
		return fmt.Errorf("grad norm: %w", err)
	}
	ds.dev.ClipScale(ds.scale, ds.sumsq, float32(clip))
	return nil
}

// run makes one optimizer step on the device over accum micro-batches from
// next: zeroed gradients, the forward and backward passes with the loss
// summed on the device, the update at lr (update's: the DP average of
// the gradients, the norm and clip coefficient, AdamW), the DP mean of
// the loss, and the step's one read of (norm, loss).
func (ds *deviceStep) run(m model, sync *GradSync, opt *AdamW, tpRank int, clip, lr float64, accum int, next func() *Batch) (res deviceResult, err error) {
	syncs0 := ds.dev.HostSyncs()
	m.MarkGradsStale()
	for a := 0; a < accum; a++ {
		b := next()
		losses, count, err := ds.lm.ForwardOnDevice(b)
		if err != nil {
			return res, err
		}
		if count > 0 {
			ds.dev.SumTo(ds.loss, float32(1/(float64(count)*float64(accum))), a > 0, losses)
		} else if a == 0 {
			ds.dev.Zero(ds.loss)
		}
		if err := m.Backward(1 / float32(accum)); err != nil {
			return res, err
		}
		res.samples += int64(b.B)
		res.tokens += int64(b.B * b.T)
	}
	if err := m.ReduceGrads(); err != nil {
		return res, err
	}
	if err := ds.update(m, sync, opt, tpRank, clip, lr); err != nil {
		return res, err
	}
	if err := ds.dp.AllReduce(ds.loss, nccl.Avg); err != nil {
		return res, err
	}
	if err := ds.dev.Fetch(ds.out[:], ds.buf.View(3, 2)); err != nil {
		return res, err
	}
	res.norm, res.loss = float64(ds.out[0]), float64(ds.out[1])
	res.syncs = ds.dev.HostSyncs() - syncs0
	return res, nil
}

// update averages the gradients over the DP group, computes the norm and
// the clip coefficient and updates the parameters, on the device: ZeRO-1's
// step, or the all-reduce (sync may be nil) and AdamW.
func (ds *deviceStep) update(m model, sync *GradSync, opt *AdamW, tpRank int, clip, lr float64) error {
	if ds.zero != nil {
		return ds.zero.stepDevice(lr, ds.sumsq, ds.scale)
	}
	if sync != nil {
		if err := sync.Sync(); err != nil {
			return err
		}
	}
	if err := ds.norm(m.Params(), tpRank, clip); err != nil {
		return err
	}
	opt.StepScaled(lr, ds.scale)
	return nil
}

// deviceResult is what one device step reports.
type deviceResult struct {
	norm, loss      float64
	tokens, samples int64
	syncs           int64 // host synchronisations in the step
}

// close frees the step's device scalars.
func (ds *deviceStep) close() { ds.dev.Free(ds.buf) }

// trainStepDevice is trainStep on the GPU path.
func (t *trainer) trainStepDevice(step int) (metrics.Step, error) {
	start, comm0 := time.Now(), t.commNow()
	lr := scheduleLR(t.cfg, step, t.total)
	r, err := t.gpu.run(t.model, t.sync, t.opt, t.mesh.TPRank(), t.cfg.GradClip, lr, t.cfg.GradAccum, t.nextBatch)
	if err != nil {
		return metrics.Step{}, err
	}
	if math.IsNaN(r.loss) || math.IsInf(r.loss, 0) {
		return metrics.Step{}, fmt.Errorf("loss is %v: lower --lr", r.loss)
	}
	mem := t.dev.MemStats()
	return metrics.Step{
		Step: step + 1, Epoch: t.epoch, Loss: r.loss, LR: lr, GradNorm: r.norm,
		Tokens: r.tokens, Samples: r.samples,
		StepS: time.Since(start).Seconds(), CommS: (t.commNow() - comm0).Seconds(),
		MemBytes: mem.Current, MemPeakBytes: mem.Peak, HostSyncs: r.syncs,
	}, nil
}
