package train

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// pipeline runs one stage of a pipeline-parallel model (pp > 1) through
// the 1F1B schedule (parallel.OneFOneB): activations go to the next stage
// and gradients to the previous one point-to-point, device-resident where
// the links are NCCL communicators on a streamed device (deviceLinks),
// host-staged everywhere else.
//
// Host-staged, each neighbour link is two 2-rank groups, one per
// direction, so that a rank only sends on some communicators and only
// receives on the others: the sends run on a goroutine of their own (a
// stage never waits for its neighbour to take an activation, which with
// blocking sends both ways would deadlock), the receives on the caller's.
//
// A stage holds the activations of every micro-batch in flight, at most
// stages-stage of them (1F1B's bound), and runs each forward exactly once:
// micro-batch i lives in slot i % (stages-stage) from its forward to its
// backward, each slot a copy of the stage's layers (stageCopy) with its own
// activations and input, all sharing the parameters and gradients. The
// last stage has one slot: it runs each forward right before its backward.
type pipeline struct {
	t             *transformer
	stage, stages int
	micro         int
	pp            nccl.Comm // the stages of this rank's pipeline
	embed         nccl.Comm // first and last stage (mesh.Embed)

	fromPrev, toPrev nccl.Comm // links to stage-1: activations in, gradients out (nil on the first)
	toNext, fromNext nccl.Comm // links to stage+1: activations out, gradients in (nil on the last)
	links            []nccl.Comm

	slots   []slot       // the micro-batches in flight, micro-batch i in slot i % len
	batches []Batch      // the step's micro-batches
	buf     []float32    // host receive buffer (B*T/tp*C)
	dl      *deviceLinks // device-resident transfers (nil: host-staged)

	sends   chan pipeSend
	pending sync.WaitGroup
	sendMu  sync.Mutex
	sendErr error

	wait time.Duration // blocked receiving from a neighbour (or flushing sends) this step
}

type pipeSend struct {
	c   nccl.Comm
	to  int
	buf []float32
}

func newPipeline(t *transformer, mesh *parallel.Mesh, micro int) (*pipeline, error) {
	p := &pipeline{t: t, stage: mesh.PPRank(), stages: mesh.PPSize(), micro: micro, pp: mesh.PP, embed: mesh.Embed,
		batches: make([]Batch, micro), buf: make([]float32, t.B*t.Tl*t.C)}
	// Device-resident transfers run both directions of a link over one
	// NCCL communicator (deviceLinks); host-staged ones need two groups.
	_, streamed := t.dev.(parallel.Streamer)
	_, ncclLinks := mesh.PP.(nccl.DeviceComm)
	device := streamed && ncclLinks
	pair := func(lo int) (down, up nccl.Comm, err error) {
		if down, err = mesh.PP.Group([]int{lo, lo + 1}); err != nil {
			return nil, nil, err
		}
		p.links = append(p.links, down)
		if device {
			return down, down, nil
		}
		if up, err = mesh.PP.Group([]int{lo, lo + 1}); err != nil {
			return nil, nil, err
		}
		p.links = append(p.links, up)
		return down, up, nil
	}
	var err error
	if p.stage > 0 {
		if p.fromPrev, p.toPrev, err = pair(p.stage - 1); err != nil {
			p.close()
			return nil, fmt.Errorf("pipeline link to stage %d: %w", p.stage-1, err)
		}
	}
	if p.slots, err = newSlots(t, p.stages-p.stage); err != nil {
		p.close()
		return nil, err
	}
	if p.stage < p.stages-1 {
		if p.toNext, p.fromNext, err = pair(p.stage); err != nil {
			p.close()
			return nil, fmt.Errorf("pipeline link to stage %d: %w", p.stage+1, err)
		}
	}
	if device {
		if p.dl, err = newDeviceLinks(t.dev, p.fromPrev, p.toNext, t.B, t.Tl, t.C); err != nil {
			p.close()
			return nil, err
		}
	}
	p.sends = make(chan pipeSend, 2*micro+2)
	go p.sender()
	return p, nil
}

// sender sends the queued messages in order; after a failure it drops the
// rest and flush reports the first error.
func (p *pipeline) sender() {
	for m := range p.sends {
		p.sendMu.Lock()
		failed := p.sendErr != nil
		p.sendMu.Unlock()
		if !failed {
			if err := m.c.Send(m.buf, m.to); err != nil {
				p.sendMu.Lock()
				p.sendErr = err
				p.sendMu.Unlock()
			}
		}
		p.pending.Done()
	}
}

// send queues a copy of x for the peer of link c (the other rank of the
// 2-rank group).
func (p *pipeline) send(c nccl.Comm, x *tensor.Tensor) {
	buf := make([]float32, x.Len())
	p.t.dev.CopyToHost(buf, x)
	p.pending.Add(1)
	p.sends <- pipeSend{c: c, to: 1 - c.Rank(), buf: buf}
}

// recv fills p.buf from the peer of link c, counting the time as waiting.
// A send that failed fails it first: the stage stops instead of waiting
// for a neighbour that waits for the lost message.
func (p *pipeline) recv(c nccl.Comm, what string) error {
	p.sendMu.Lock()
	serr := p.sendErr
	p.sendMu.Unlock()
	if serr != nil {
		return fmt.Errorf("pipeline stage %d: sending: %w", p.stage, serr)
	}
	start := time.Now()
	err := c.Recv(p.buf, 1-c.Rank())
	p.wait += time.Since(start)
	if err != nil {
		return fmt.Errorf("pipeline stage %d: receiving %s: %w", p.stage, what, err)
	}
	return nil
}

// flush waits for the queued sends and returns the first send error.
func (p *pipeline) flush() error {
	start := time.Now()
	p.pending.Wait()
	p.wait += time.Since(start)
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.sendErr != nil {
		return fmt.Errorf("pipeline stage %d: sending: %w", p.stage, p.sendErr)
	}
	return nil
}

// step runs the step's micro-batches (drawn by next) through the stage in
// the 1F1B order, each backward scaled by scale. It returns the mean loss
// over the micro-batches on the last stage, 0 on the others.
func (p *pipeline) step(next func(*Batch), scale float32) (float64, error) {
	for i := range p.batches {
		next(&p.batches[i])
	}
	p.wait = 0
	if p.dl != nil {
		return p.stepDevice(scale)
	}
	loss := 0.0
	for _, op := range parallel.OneFOneB(p.stages, p.stage, p.micro) {
		if op.Backward {
			if err := p.backward(op.Micro, scale); err != nil {
				return 0, err
			}
			continue
		}
		l, err := p.forward(&p.batches[op.Micro], op.Micro, true)
		if err != nil {
			return 0, err
		}
		if math.IsNaN(l) || math.IsInf(l, 0) {
			return 0, fmt.Errorf("loss is %v: lower --lr", l)
		}
		loss += l / float64(p.micro)
	}
	return loss, p.flush()
}

// forward receives micro-batch i's input from the previous stage (unless
// first), runs the stage in the micro-batch's slot and sends its output on
// (unless last).
func (p *pipeline) forward(b *Batch, i int, train bool) (float64, error) {
	if p.dl != nil {
		return p.forwardDevice(b, i, train)
	}
	s := p.slots[i%len(p.slots)]
	if p.fromPrev != nil {
		if err := p.recv(p.fromPrev, fmt.Sprintf("the activations of micro-batch %d", i)); err != nil {
			return 0, err
		}
		p.t.dev.CopyFromHost(s.in, p.buf)
	}
	out, loss, err := s.t.forwardStage(b, s.in, train)
	if err != nil {
		return 0, err
	}
	if p.toNext != nil {
		p.send(p.toNext, out)
	}
	return loss, nil
}

// backward runs micro-batch i's backward through the stage from the
// activations its slot kept: the gradient of its output from the next
// stage (unless last), and the gradient of its input to the previous stage
// (unless first).
func (p *pipeline) backward(i int, scale float32) error {
	var dout *tensor.Tensor
	if p.fromNext != nil {
		if err := p.recv(p.fromNext, fmt.Sprintf("the gradient of micro-batch %d", i)); err != nil {
			return err
		}
		dout = p.t.stageGradient()
		p.t.dev.CopyFromHost(dout, p.buf)
	}
	dx, err := p.slots[i%len(p.slots)].t.backwardStage(scale, dout)
	if err != nil {
		return err
	}
	if p.toPrev != nil {
		p.send(p.toPrev, dx)
	}
	return nil
}

// evalForward runs b forward through the pipeline: its loss on the last
// stage, 0 on the others.
func (p *pipeline) evalForward(b *Batch) (float64, error) {
	l, err := p.forward(b, 0, false)
	if err != nil {
		return 0, err
	}
	return l, p.flush()
}

// reduceTied sums the tied token embedding's gradient over the first and
// the last stage, which both hold it (the embedding's and the LM head's
// contributions), so that both apply the same update.
func (p *pipeline) reduceTied() error {
	w := p.t.tiedEmbedding()
	if w == nil || p.embed == nil {
		return nil
	}
	if err := parallel.ReduceFromRegion(p.embed).Forward(w.Grad); err != nil {
		return fmt.Errorf("tied embedding gradient: %w", err)
	}
	return nil
}

// alignTied gives the last stage's copy of the tied embedding the first
// stage's values, bit for bit, after a ZeRO-1 update at dp >= 3: each
// stage reduce-scatters its gradients in its own bucket layout, and a ring
// over three or more ranks adds an element's terms in an order that
// depends on where the element falls, so the two copies could drift apart
// by rounding (the sum of two terms is the same in either order).
func (p *pipeline) alignTied(dp int) error {
	w := p.t.tiedEmbedding()
	if w == nil || p.embed == nil || dp < 3 {
		return nil
	}
	if err := parallel.NewDeviceGroup(p.embed, p.t.dev).Broadcast(w.Data, 0); err != nil {
		return fmt.Errorf("tied embedding: %w", err)
	}
	return nil
}

// sumStages adds v over the stages (exact for values only one stage
// holds, the others giving 0).
func (p *pipeline) sumStages(v []float32) error {
	return p.pp.AllReduce(v, nccl.Sum)
}

// fromLast gives every stage the last stage's v, bit for bit (a float32
// sum would round the float64 the loop reports without a pipeline).
func (p *pipeline) fromLast(v float64) (float64, error) {
	buf := packFloat64s([]float64{v})
	if err := p.pp.Broadcast(buf, p.stages-1); err != nil {
		return 0, err
	}
	return unpackFloat64s(buf)[0], nil
}

// uncounted is the parameter this stage leaves out of the gradient norm
// and the checkpoint: the last stage's copy of the tied embedding (the
// first stage counts it); nil on the other stages.
func (p *pipeline) uncounted() *parallel.Param {
	if p.stage == 0 {
		return nil
	}
	return p.t.tiedEmbedding()
}

// normParams are the parameters this stage counts in the gradient norm:
// all of its own but uncounted.
func (p *pipeline) normParams() []*parallel.Param {
	w := p.uncounted()
	if w == nil {
		return p.t.params
	}
	var out []*parallel.Param
	for _, q := range p.t.params {
		if q != w {
			out = append(out, q)
		}
	}
	return out
}

// commTime is the time the step's goroutine spent in the pipeline's own
// communicators (the sends, on their own goroutine, overlap the compute
// and are left out).
func (p *pipeline) commTime() time.Duration {
	var d time.Duration
	cs := []nccl.Comm{p.pp, p.embed, p.fromPrev, p.fromNext}
	if p.dl != nil { // device calls return at launch: the transfers' time is timed's
		cs, d = cs[:2], p.dl.busy
	}
	for _, c := range cs {
		if c != nil {
			d += c.Stats().Total().Time
		}
	}
	return d
}

func (p *pipeline) close() {
	if p.sends != nil {
		close(p.sends)
		p.sends = nil
	}
	closeSlots(p.t, p.slots)
	p.slots = nil
	p.dl.close(p.t.dev)
	for i := len(p.links) - 1; i >= 0; i-- {
		p.links[i].Close()
	}
	p.links = nil
}

// trainStepPipeline is trainStep on a pipeline stage: the micro-batches
// through the 1F1B schedule, the tied embedding's gradient summed over the
// first and last stage, the gradient norm over every stage, and the loss
// (the last stage's) given to every rank.
func (t *trainer) trainStepPipeline(step int) (metrics.Step, error) {
	start, comm0 := time.Now(), t.commNow()
	p := t.pipe
	t.model.MarkGradsStale()
	loss, err := p.step(t.nextBatchInto, 1/float32(p.micro))
	if err != nil {
		return metrics.Step{}, err
	}
	span := time.Since(start)
	if err := t.model.ReduceGrads(); err != nil {
		return metrics.Step{}, err
	}
	lr := scheduleLR(t.cfg, step, t.total)
	var norm float64
	if t.zero != nil {
		// ZeRO-1 cuts the summed gradient into each stage's own ranges.
		if err := p.reduceTied(); err != nil {
			return metrics.Step{}, err
		}
		if norm, err = t.zero.Step(lr); err != nil {
			return metrics.Step{}, err
		}
		if err := p.alignTied(t.mesh.DP.Size()); err != nil {
			return metrics.Step{}, err
		}
	} else {
		// The tied embedding's two halves are averaged over dp first, each
		// in its own stage's buckets, then summed: both stages add the
		// same two tensors and so hold the same gradient to the bit.
		if err := t.sync.Sync(); err != nil {
			return metrics.Step{}, err
		}
		if err := p.reduceTied(); err != nil {
			return metrics.Step{}, err
		}
		if norm, err = gradNormOver(t.dev, p.normParams(), t.mesh.TP, t.mesh.PP); err != nil {
			return metrics.Step{}, err
		}
		t.opt.Step(lr, norm)
	}
	if loss, err = p.fromLast(loss); err != nil {
		return metrics.Step{}, fmt.Errorf("pipeline loss: %w", err)
	}
	if loss, err = t.dpMean(loss); err != nil {
		return metrics.Step{}, err
	}
	if err := t.dev.Sync(); err != nil {
		return metrics.Step{}, err
	}
	mem := t.dev.MemStats()
	b := t.cfg.BatchSize * p.micro
	return metrics.Step{
		Step: step + 1, Epoch: t.epoch, Loss: loss, LR: lr, GradNorm: norm,
		Tokens: int64(b * t.cfg.Seq), Samples: int64(b),
		StepS: time.Since(start).Seconds(), CommS: (t.commNow() - comm0).Seconds(),
		MemBytes: mem.Current, MemPeakBytes: mem.Peak,
		Bubble:       p.wait.Seconds() / span.Seconds(),
		BubbleTheory: parallel.BubbleFraction(p.stages, p.micro),
	}, nil
}

// pipeNote describes the pipeline for the start line ("" without one).
func pipeNote(cfg Config) string {
	if cfg.Stages() == 1 {
		return ""
	}
	return fmt.Sprintf("pp %d (%d micro-batches, 1F1B, bubble %.2f) x ", cfg.Stages(), cfg.Micro(), parallel.BubbleFraction(cfg.Stages(), cfg.Micro()))
}
