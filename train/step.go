package train

import (
	"fmt"
	"math"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// The training step, one for every device and layout: one loop over the
// micro-batches in the 1F1B order of this rank's stage (parallel.OneFOneB;
// a pipeline stage, or the model run whole, the one-stage case F0 B0 F1
// B1 ... of the plain and accumulated steps), the gradients reduced over
// tp (ReduceGrads), then the optimizer (replicated or ZeRO) on the
// device, with the gradient norm and the clip coefficient made in device
// memory (gradNorm), and one read of the step's scalars at its end.
// Collectives go through parallel.Group, which alone decides between
// device memory (NCCL on the compute stream) and the host.
//
// The loss is the one thing read where it is made: on the CPU, and for a
// model that reads its predictions (the classifier) or a pipeline's last
// stage, each micro-batch's loss comes back as a float64 (the precision
// of the reference curves); a language model elsewhere leaves it on the
// device (deviceLM), summed there and read with the norm, so that a GPU
// step waits for the device once. The loop hands every forward's loss to
// stepLoss, which keeps it either way.

// deviceLM is a model whose training Forward can leave the loss on the
// device (the GPT language model).
type deviceLM interface {
	DeviceLoss() bool
	ForwardOnDevice(b *data.Batch) (losses *tensor.Tensor, count int, err error)
}

// lossOnDevice returns m's device loss when the step keeps its loss on
// dev, nil when it reads each micro-batch's (see above), and why, for
// the log ("" where nothing needs saying).
func lossOnDevice(dev tensor.Device, m model, pipelined bool) (deviceLM, string) {
	if hostMemory(dev) {
		return nil, ""
	}
	lm, ok := m.(deviceLM)
	switch {
	case !ok || !lm.DeviceLoss():
		return nil, "step: the loss is read each micro-batch: the classifier reads its predictions"
	case pipelined:
		return nil, "step: the loss is read each micro-batch on the last stage of the pipeline"
	}
	return lm, ""
}

// hostMemory says whether dev's tensors live in host memory (the CPU
// device): there every value is read where it is made.
func hostMemory(dev tensor.Device) bool {
	_, cpu := dev.(*tensor.CPUDevice)
	return cpu
}

// checkLoss refuses a loss that is not finite: training has diverged.
func checkLoss(l float64) error {
	if math.IsNaN(l) || math.IsInf(l, 0) {
		return fmt.Errorf("loss is %v: lower --lr", l)
	}
	return nil
}

// trainStep runs one optimizer step over the step's micro-batches.
func (t *trainer) trainStep(step int) (metrics.Step, error) {
	start, comm0, syncs0 := time.Now(), t.commNow(), t.dev.HostSyncs()
	t.model.MarkGradsStale()
	loss, err := t.forwardBackward()
	if err != nil {
		return metrics.Step{}, err
	}
	span := time.Since(start)
	if err := t.model.ReduceGrads(); err != nil {
		return metrics.Step{}, err
	}
	lr := config.ScheduleLR(t.cfg, step, t.total)
	if err := t.update(lr); err != nil {
		return metrics.Step{}, err
	}
	norm, loss, err := t.readScalars(loss)
	if err != nil {
		return metrics.Step{}, err
	}
	if err := checkLoss(loss); err != nil {
		return metrics.Step{}, err
	}
	mem := t.dev.MemStats()
	samples := int64(t.cfg.BatchSize * t.cfg.Micro())
	s := metrics.Step{
		Step: step + 1, Epoch: t.epoch, Loss: loss, LR: lr, GradNorm: norm,
		Tokens: samples * int64(t.cfg.Seq), Samples: samples,
		StepS: time.Since(start).Seconds(), CommS: (t.commNow() - comm0).Seconds(),
		MemBytes: mem.Current, MemPeakBytes: mem.Peak, HostSyncs: t.dev.HostSyncs() - syncs0,
	}
	if t.pipe != nil {
		s.Bubble = t.pipe.wait.Seconds() / span.Seconds()
		s.BubbleTheory = parallel.BubbleFraction(t.pipe.stages, len(t.batches))
	}
	return s, nil
}

// stage is what runs on this rank of the step's micro-batch schedule: a
// pipeline stage (pipeline), or the model run whole, the one stage of a
// schedule of one (wholeModel).
type stage interface {
	// schedule starts a step of n micro-batches and returns its ops.
	schedule(n int) []parallel.PipeOp
	// forward runs ops[k], a forward, on its micro-batch b.
	forward(ops []parallel.PipeOp, k int, b *data.Batch) (microLoss, error)
	// backward runs ops[k], a backward, accumulating the gradients of
	// scale * its micro-batch's loss.
	backward(ops []parallel.PipeOp, k int, scale float32) error
	// evalForward runs b forward without training and returns its loss
	// (0 on a pipeline's stages but the last).
	evalForward(b *data.Batch) (float64, error)
}

// wholeModel is the model run whole on this rank: parallel.OneFOneB(1, 0,
// n), each micro-batch's forward right before its backward.
type wholeModel struct {
	m  model
	lm deviceLM // the model, when the step keeps its loss on the device
}

// schedule implements stage.
func (w wholeModel) schedule(n int) []parallel.PipeOp { return parallel.OneFOneB(1, 0, n) }

// forward runs b forward, its loss left on the device when the step keeps
// it there.
func (w wholeModel) forward(_ []parallel.PipeOp, _ int, b *data.Batch) (microLoss, error) {
	if w.lm != nil {
		losses, count, err := w.lm.ForwardOnDevice(b)
		return microLoss{losses: losses, count: count, onDevice: true}, err
	}
	l, err := w.m.Forward(b, true)
	return microLoss{l: l}, err
}

// backward implements stage.
func (w wholeModel) backward(_ []parallel.PipeOp, _ int, scale float32) error {
	return w.m.Backward(scale)
}

// evalForward implements stage.
func (w wholeModel) evalForward(b *data.Batch) (float64, error) { return w.m.Forward(b, false) }

// microLoss is one forward's loss: read on the host (l), or left on the
// device (onDevice) as per-row losses whose sum over count is the mean.
type microLoss struct {
	l        float64
	losses   *tensor.Tensor
	count    int
	onDevice bool
}

// stepLoss is the loss of a step's n micro-batches, kept as their
// forwards hand it over: its mean in float64 on the host, or summed on
// the device into slot (the gradient norm's loss slot, which readScalars
// reads with the norm).
type stepLoss struct {
	n    int
	mean float64
	dev  tensor.Device
	slot *tensor.Tensor
}

// add keeps micro-batch i's loss l, refusing one read as not finite.
func (s *stepLoss) add(i int, l microLoss) error {
	if l.onDevice {
		if l.count > 0 {
			s.dev.SumTo(s.slot, float32(1/(float64(l.count)*float64(s.n))), i > 0, l.losses)
		} else if i == 0 {
			s.dev.Zero(s.slot)
		}
		return nil
	}
	if err := checkLoss(l.l); err != nil {
		return err
	}
	s.mean += l.l / float64(s.n)
	return nil
}

// forwardBackward draws the step's micro-batches and runs them forward
// and backward through this rank's stage in the order of its schedule,
// each backward scaled by 1/micro-batches. It returns their mean loss
// when it is read as it is made (0 on a pipeline's other stages; 0 when
// the loss is summed on the device, in the norm's loss slot).
func (t *trainer) forwardBackward() (float64, error) {
	n := len(t.batches)
	for i := range t.batches {
		t.nextBatch(&t.batches[i])
	}
	loss := stepLoss{n: n, dev: t.dev}
	if t.lm != nil {
		loss.slot = t.optim.gradNorm().loss()
	}
	ops := t.stage.schedule(n)
	for k, op := range ops {
		if op.Backward {
			if err := t.stage.backward(ops, k, 1/float32(n)); err != nil {
				return 0, err
			}
			continue
		}
		l, err := t.stage.forward(ops, k, &t.batches[op.Micro])
		if err != nil {
			return 0, err
		}
		if err := loss.add(op.Micro, l); err != nil {
			return 0, err
		}
	}
	return loss.mean, nil
}

// update averages the gradients over the data-parallel group, clips them
// to the global norm and updates the parameters at lr. A pipeline's tied
// embedding, whose gradient the first and the last stage each hold half
// of, is summed over the two: with ZeRO-1 before the reduce-scatter cuts
// it into ranges (and the last stage takes the first's copy after), else
// after the all-reduce, each stage averaging its half over dp in its own
// buckets so that both add the same two tensors and hold the same sum to
// the bit.
func (t *trainer) update(lr float64) error {
	tiedFirst := t.pipe != nil && t.zero != nil
	if tiedFirst {
		if err := t.pipe.reduceTied(); err != nil {
			return err
		}
	}
	if err := t.optim.reduce(); err != nil {
		return err
	}
	if t.pipe != nil && !tiedFirst {
		if err := t.pipe.reduceTied(); err != nil {
			return err
		}
	}
	if err := t.optim.update(lr); err != nil {
		return err
	}
	if tiedFirst {
		if err := t.pipe.alignTied(t.mesh.DP.Size()); err != nil {
			return err
		}
	}
	if t.zero != nil {
		// ZeRO's AdamW updated ranges, which the all-gather (and a
		// pipeline's tied table) spread: the products' bf16 copies of the
		// gathered values. A replicated AdamW wrote them as it updated.
		t.model.ParamSet().SyncCopies()
	}
	return nil
}

// readScalars waits for the step and returns the gradient norm and the
// loss averaged over the data-parallel group (a pipeline's last stage's):
// loss as read, or the one summed on the device.
func (t *trainer) readScalars(loss float64) (norm, mean float64, err error) {
	g := t.optim.gradNorm()
	if t.lm != nil {
		if err := t.dpGroup.AllReduce(g.loss(), nccl.Avg); err != nil {
			return 0, 0, err
		}
		var buf [4]float32
		if err := t.dev.Fetch(buf[:], g.out); err != nil {
			return 0, 0, err
		}
		return tensor.Float64At(buf[:], 0), float64(buf[3]), nil
	}
	if norm, err = g.read(); err != nil {
		return 0, 0, err
	}
	if t.pipe != nil {
		if loss, err = t.pipe.fromLast(loss); err != nil {
			return 0, 0, fmt.Errorf("pipeline loss: %w", err)
		}
	}
	mean, err = t.dpMean(loss)
	return norm, mean, err
}
