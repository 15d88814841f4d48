package train

import (
	"fmt"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// pipeline is this rank's stage of a pipeline-parallel model (pp > 1): the
// step's loop (forwardBackward) walks its 1F1B schedule (parallel.OneFOneB)
// and the stage runs each op, activations going to the next stage and
// gradients to the previous one point-to-point, over one 2-rank group per
// neighbour for both directions (parallel.Group: NCCL on the device's
// stream, or host memory).
//
// A send may wait until the peer receives (NCCL's rule), so the order of
// the transfers matters. The stage follows Megatron-LM's 1F1B: a send
// followed by a receive from the same neighbour (an activation out to the
// next stage and a gradient in from it, or a gradient out to the previous
// stage and the next activation in) is one exchange (Group.SendRecv),
// every other transfer goes alone. Two neighbours then issue matching
// calls in the same order, and none waits on the other forever.
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
	pp            nccl.Comm // the stages of this rank's pipeline
	embed         nccl.Comm // first and last stage (mesh.Embed)

	prev, next *parallel.Group // the links to stage-1 and stage+1 (nil at the ends)
	links      []nccl.Comm

	slots []slot // the micro-batches in flight, micro-batch i in slot i % len
	// brought says that the last send was an exchange that received the
	// next op's input.
	brought bool
	// act is the activation being sent, copied out of the layers' memory
	// into the pipeline's own: one is enough, a send holding the stream.
	act *tensor.Tensor

	wait time.Duration // blocked in transfers this step
	busy time.Duration // in transfers since the pipeline was made
}

func newPipeline(t *transformer, mesh *parallel.Mesh) (*pipeline, error) {
	p := &pipeline{t: t, stage: mesh.PPRank(), stages: mesh.PPSize(), pp: mesh.PP, embed: mesh.Embed}
	link := func(peer int) (*parallel.Group, error) {
		lo := min(p.stage, peer)
		c, err := mesh.PP.Group([]int{lo, lo + 1})
		if err != nil {
			return nil, fmt.Errorf("pipeline link to stage %d: %w", peer, err)
		}
		p.links = append(p.links, c)
		return parallel.NewDeviceGroup(c, t.dev), nil
	}
	var err error
	if p.stage > 0 {
		if p.prev, err = link(p.stage - 1); err != nil {
			p.close()
			return nil, err
		}
	}
	if p.slots, err = newSlots(t, p.stages-p.stage); err != nil {
		p.close()
		return nil, err
	}
	if p.stage < p.stages-1 {
		if p.next, err = link(p.stage + 1); err != nil {
			p.close()
			return nil, err
		}
		if p.act, err = t.dev.AllocAs(t.stageAct.DType, t.stageAct.Shape...); err != nil {
			p.close()
			return nil, fmt.Errorf("pipeline send buffer: %w", err)
		}
	}
	return p, nil
}

// transfer is one end of a point-to-point transfer of a stage: the link,
// the tensor sent or received into, and what it is, for errors.
type transfer struct {
	link *parallel.Group
	x    *tensor.Tensor
	what string
}

// incoming is what op must receive before it runs: the activations of
// its micro-batch (a forward off the first stage) or the gradient of its
// output (a backward off the last); ok is false when it needs nothing.
func (p *pipeline) incoming(op parallel.PipeOp) (transfer, bool) {
	if op.Backward {
		if p.next == nil {
			return transfer{}, false
		}
		return transfer{p.next, p.t.stageGradient(), fmt.Sprintf("the gradient of micro-batch %d", op.Micro)}, true
	}
	if p.prev == nil {
		return transfer{}, false
	}
	return transfer{p.prev, p.slots[op.Micro%len(p.slots)].in, fmt.Sprintf("the activations of micro-batch %d", op.Micro)}, true
}

// timed runs f, a transfer that may wait on a neighbour, and counts its
// time as waiting: the device is drained before (the compute is not
// waiting) and after (the transfer done).
func (p *pipeline) timed(f func() error) error {
	if err := p.t.dev.Sync(); err != nil {
		return err
	}
	start := time.Now()
	err := f()
	if err == nil {
		err = p.t.dev.Sync()
	}
	d := time.Since(start)
	p.wait += d
	p.busy += d
	return err
}

// receive runs in alone.
func (p *pipeline) receive(in transfer) error {
	if err := p.timed(func() error { return in.link.Recv(in.x, 1-in.link.Rank()) }); err != nil {
		return fmt.Errorf("pipeline stage %d: receiving %s: %w", p.stage, in.what, err)
	}
	return nil
}

// send sends x over link alone, or as one exchange with in when in comes
// over the same link (then in has been received when it returns).
func (p *pipeline) send(link *parallel.Group, x *tensor.Tensor, what string, in *transfer) error {
	peer := 1 - link.Rank()
	if in != nil {
		if err := p.timed(func() error { return link.SendRecv(x, in.x, peer) }); err != nil {
			return fmt.Errorf("pipeline stage %d: exchanging %s for %s: %w", p.stage, what, in.what, err)
		}
		return nil
	}
	if err := p.timed(func() error { return link.Send(x, peer) }); err != nil {
		return fmt.Errorf("pipeline stage %d: sending %s: %w", p.stage, what, err)
	}
	return nil
}

// schedule starts a step of n micro-batches on the stage: its 1F1B ops.
func (p *pipeline) schedule(n int) []parallel.PipeOp {
	p.wait, p.brought = 0, false
	return parallel.OneFOneB(p.stages, p.stage, n)
}

// forward implements stage: ops[k] in its micro-batch's slot, a training
// forward.
func (p *pipeline) forward(ops []parallel.PipeOp, k int, b *data.Batch) (microLoss, error) {
	l, err := p.runForward(ops, k, b, true)
	return microLoss{l: l}, err
}

// evalForward implements stage: b in the first slot, alone.
func (p *pipeline) evalForward(b *data.Batch) (float64, error) {
	return p.runForward([]parallel.PipeOp{{}}, 0, b, false)
}

// runForward receives the input of ops[k], a forward, from the previous
// stage (unless first), runs the stage on b in the micro-batch's slot and
// sends its output on (unless last), with the transfers in the order
// pipeline describes. It returns the loss (0 but on the last stage).
func (p *pipeline) runForward(ops []parallel.PipeOp, k int, b *data.Batch, train bool) (float64, error) {
	if err := p.receiveFor(ops[k]); err != nil {
		return 0, err
	}
	s := p.slots[ops[k].Micro%len(p.slots)]
	x, l, err := s.t.forwardStage(b, s.in, train)
	if err != nil {
		return 0, err
	}
	if p.next != nil {
		p.t.dev.Copy(p.act, x)
		if err := p.sendFor(ops, k, p.next, p.act, fmt.Sprintf("the activations of micro-batch %d", ops[k].Micro)); err != nil {
			return 0, err
		}
	}
	return l, nil
}

// backward implements stage: it receives the gradient of the output of
// ops[k]'s micro-batch from the next stage (unless last), runs the stage
// backward in the micro-batch's slot and sends the gradient of its input
// to the previous stage (unless first).
func (p *pipeline) backward(ops []parallel.PipeOp, k int, scale float32) error {
	if err := p.receiveFor(ops[k]); err != nil {
		return err
	}
	var dout *tensor.Tensor
	if p.next != nil {
		dout = p.t.stageGradient()
	}
	dx, err := p.slots[ops[k].Micro%len(p.slots)].t.backwardStage(scale, dout)
	if err != nil {
		return err
	}
	if p.prev == nil {
		return nil
	}
	return p.sendFor(ops, k, p.prev, dx, fmt.Sprintf("the gradient of micro-batch %d", ops[k].Micro))
}

// receiveFor receives what op needs, unless it needs nothing or the last
// send's exchange brought it.
func (p *pipeline) receiveFor(op parallel.PipeOp) error {
	if p.brought {
		p.brought = false
		return nil
	}
	if in, ok := p.incoming(op); ok {
		return p.receive(in)
	}
	return nil
}

// sendFor sends x, the output of ops[k], over link: as one exchange with
// the input of ops[k+1] when that comes over the same link, else alone.
func (p *pipeline) sendFor(ops []parallel.PipeOp, k int, link *parallel.Group, x *tensor.Tensor, what string) error {
	var with *transfer
	if k+1 < len(ops) {
		if in, ok := p.incoming(ops[k+1]); ok && in.link == link {
			with, p.brought = &in, true
		}
	}
	return p.send(link, x, what, with)
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
	buf := make([]float32, 2)
	tensor.SetFloat64At(buf, 0, v)
	if err := p.pp.Broadcast(buf, p.stages-1); err != nil {
		return 0, err
	}
	return tensor.Float64At(buf, 0), nil
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

// commTime is the time the step's goroutine spent in the pipeline's
// communicators: the stages' and the tied embedding's collectives, and
// the transfers (launch to completion, waits included).
func (p *pipeline) commTime() time.Duration {
	d := p.busy
	for _, c := range []nccl.Comm{p.pp, p.embed} {
		if c != nil {
			d += c.Stats().Total().Time
		}
	}
	return d
}

func (p *pipeline) close() {
	closeSlots(p.t, p.slots)
	p.slots = nil
	if p.act != nil {
		p.t.dev.Free(p.act)
		p.act = nil
	}
	for i := len(p.links) - 1; i >= 0; i-- {
		p.links[i].Close()
	}
	p.links = nil
}

// pipeNote describes the pipeline for the start line ("" without one).
func pipeNote(cfg config.Config) string {
	if cfg.Stages() == 1 {
		return ""
	}
	return fmt.Sprintf("pp %d (%d micro-batches, 1F1B, bubble %.2f) x ", cfg.Stages(), cfg.Micro(), parallel.BubbleFraction(cfg.Stages(), cfg.Micro()))
}
