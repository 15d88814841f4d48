package train

import (
	"fmt"
	"math"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// The training step, one for every device and layout: a micro-batch
// schedule (plain or accumulated micro-batches, or a pipeline stage's
// 1F1B), the gradients reduced over tp (ReduceGrads), then the optimizer
// (replicated or ZeRO-1) on the device, with the gradient norm and the
// clip coefficient made in device memory (gradNorm), and one read of the
// step's scalars at its end. Collectives go through parallel.Group, which
// alone decides between device memory (NCCL on the compute stream) and
// the host.
//
// The loss is the one thing read where it is made: on the CPU, and for a
// model that reads its predictions (the classifier) or a pipeline's last
// stage, each micro-batch's loss comes back as a float64 (the precision
// of the reference curves); a language model elsewhere leaves it on the
// device (deviceLM), summed there and read with the norm, so that a GPU
// step waits for the device once.

// deviceLM is a model whose training Forward can leave the loss on the
// device (the GPT language model).
type deviceLM interface {
	DeviceLoss() bool
	ForwardOnDevice(b *Batch) (losses *tensor.Tensor, count int, err error)
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
		s.BubbleTheory = parallel.BubbleFraction(t.pipe.stages, t.pipe.micro)
	}
	return s, nil
}

// forwardBackward runs the step's micro-batches forward and backward,
// each backward scaled by 1/micro-batches, and returns their mean loss
// when it is read as it is made (0 on a pipeline's other stages; 0 when
// the loss is summed on the device, in the norm's loss slot).
func (t *trainer) forwardBackward() (float64, error) {
	if t.pipe != nil {
		return t.pipe.step(t.nextBatchInto, 1/float32(t.pipe.micro))
	}
	accum := t.cfg.GradAccum
	loss := 0.0
	for a := range accum {
		b := t.nextBatch()
		if t.lm != nil {
			losses, count, err := t.lm.ForwardOnDevice(b)
			if err != nil {
				return 0, err
			}
			slot := t.optim.gradNorm().loss()
			if count > 0 {
				t.dev.SumTo(slot, float32(1/(float64(count)*float64(accum))), a > 0, losses)
			} else if a == 0 {
				t.dev.Zero(slot)
			}
		} else {
			l, err := t.model.Forward(b, true)
			if err != nil {
				return 0, err
			}
			if err := checkLoss(l); err != nil {
				return 0, err
			}
			loss += l / float64(accum)
		}
		if err := t.model.Backward(1 / float32(accum)); err != nil {
			return 0, err
		}
	}
	return loss, nil
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
		return t.pipe.alignTied(t.mesh.DP.Size())
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
