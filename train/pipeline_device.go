package train

import (
	"fmt"
	"math"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// deviceLinks moves a pipeline stage's activations and gradients in device
// memory: NCCL point-to-point on the device's stream, over one 2-rank
// communicator per neighbour (the first of the link's two groups: the
// previous stage's toNext is this stage's fromPrev) for both directions.
//
// An NCCL send holds the stream until the peer's receive runs, so the
// order of the transfers matters where host-staged sends (on their own
// goroutine) let it be. The stage follows Megatron-LM's 1F1B: a send
// followed by a receive from the same neighbour (an activation out to the
// next stage and a gradient in from it, or a gradient out to the previous
// stage and the next activation in) is one exchange (SendRecvDevice, one
// NCCL group), every other transfer goes alone. Two neighbours then issue
// matching calls in the same order, and none waits on the other forever.
type deviceLinks struct {
	stream     uintptr
	prev, next nccl.DeviceComm // nil at the ends
	// act is the activation being sent, copied out of the layers' memory
	// into the pipeline's own (allocated on the stage's device, as what
	// NCCL receives into): one is enough, a send holding the stream.
	act *tensor.Tensor
	// busy is the time spent in transfers since the pipeline was made
	// (launch to completion, waits included).
	busy time.Duration
}

// newDeviceLinks returns the device-resident links of a stage whose device
// runs on a stream and whose links (prev: to the previous stage, next: to
// the next; nil at the ends) are NCCL communicators; nil otherwise. act
// is the shape of an activation.
func newDeviceLinks(dev tensor.Device, prev, next nccl.Comm, act ...int) (*deviceLinks, error) {
	s, ok := dev.(parallel.Streamer)
	if !ok || (prev == nil && next == nil) {
		return nil, nil
	}
	l := &deviceLinks{stream: s.Stream()}
	for _, c := range []struct {
		comm nccl.Comm
		dst  *nccl.DeviceComm
	}{{prev, &l.prev}, {next, &l.next}} {
		if c.comm == nil {
			continue
		}
		dc, ok := c.comm.(nccl.DeviceComm)
		if !ok {
			return nil, nil
		}
		*c.dst = dc
	}
	if next != nil {
		var err error
		if l.act, err = dev.Alloc(act...); err != nil {
			return nil, fmt.Errorf("pipeline send buffer: %w", err)
		}
	}
	return l, nil
}

// close frees the send buffer.
func (l *deviceLinks) close(dev tensor.Device) {
	if l != nil && l.act != nil {
		dev.Free(l.act)
		l.act = nil
	}
}

// transfer is one end of a point-to-point transfer of a stage: the link,
// the tensor sent or received into, and what it is, for errors.
type transfer struct {
	link nccl.DeviceComm
	x    *tensor.Tensor
	what string
}

// incoming is what op must receive before it runs: the activations of
// its micro-batch (a forward off the first stage) or the gradient of its
// output (a backward off the last); ok is false when it needs nothing.
func (p *pipeline) incoming(op parallel.PipeOp) (transfer, bool) {
	if op.Backward {
		if p.dl.next == nil {
			return transfer{}, false
		}
		return transfer{p.dl.next, p.t.stageGradient(), fmt.Sprintf("the gradient of micro-batch %d", op.Micro)}, true
	}
	if p.dl.prev == nil {
		return transfer{}, false
	}
	return transfer{p.dl.prev, p.slots[op.Micro%len(p.slots)].in, fmt.Sprintf("the activations of micro-batch %d", op.Micro)}, true
}

// timed runs f, a transfer that may wait on a neighbour, and counts its
// time as waiting: the stream is drained before (the compute is not
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
	p.dl.busy += d
	return err
}

// receive runs in alone.
func (p *pipeline) receive(in transfer) error {
	err := p.timed(func() error {
		return in.link.RecvDevice(in.x.Ptr(), in.x.Len(), nccl.Float32, 1-in.link.Rank(), p.dl.stream)
	})
	if err != nil {
		return fmt.Errorf("pipeline stage %d: receiving %s: %w", p.stage, in.what, err)
	}
	return nil
}

// send sends x over link alone, or as one exchange with in when in comes
// over the same link (then in has been received when it returns).
func (p *pipeline) sendDevice(link nccl.DeviceComm, x *tensor.Tensor, what string, in *transfer) error {
	peer := 1 - link.Rank()
	if in != nil {
		err := p.timed(func() error {
			return link.SendRecvDevice(x.Ptr(), in.x.Ptr(), x.Len(), nccl.Float32, peer, p.dl.stream)
		})
		if err != nil {
			return fmt.Errorf("pipeline stage %d: exchanging %s for %s: %w", p.stage, what, in.what, err)
		}
		return nil
	}
	if err := p.timed(func() error { return link.SendDevice(x.Ptr(), x.Len(), nccl.Float32, peer, p.dl.stream) }); err != nil {
		return fmt.Errorf("pipeline stage %d: sending %s: %w", p.stage, what, err)
	}
	return nil
}

// stepDevice is step with device-resident transfers, in the order
// deviceLinks describes.
func (p *pipeline) stepDevice(scale float32) (float64, error) {
	ops := parallel.OneFOneB(p.stages, p.stage, p.micro)
	received := -1 // the op whose input an exchange brought
	loss := 0.0
	for k, op := range ops {
		if in, ok := p.incoming(op); ok && k != received {
			if err := p.receive(in); err != nil {
				return 0, err
			}
		}
		s := p.slots[op.Micro%len(p.slots)]
		var out *tensor.Tensor
		var link nccl.DeviceComm
		var what string
		if op.Backward {
			var dout *tensor.Tensor
			if p.dl.next != nil {
				dout = p.t.stageGradient()
			}
			dx, err := s.t.backwardStage(scale, dout)
			if err != nil {
				return 0, err
			}
			out, link, what = dx, p.dl.prev, fmt.Sprintf("the gradient of micro-batch %d", op.Micro)
		} else {
			x, l, err := s.t.forwardStage(&p.batches[op.Micro], s.in, true)
			if err != nil {
				return 0, err
			}
			if math.IsNaN(l) || math.IsInf(l, 0) {
				return 0, fmt.Errorf("loss is %v: lower --lr", l)
			}
			loss += l / float64(p.micro)
			if p.dl.next != nil {
				p.t.dev.Copy(p.dl.act, x)
			}
			out, link, what = p.dl.act, p.dl.next, fmt.Sprintf("the activations of micro-batch %d", op.Micro)
		}
		if link == nil {
			continue
		}
		var with *transfer
		if k+1 < len(ops) {
			if in, ok := p.incoming(ops[k+1]); ok && in.link == link {
				with, received = &in, k+1
			}
		}
		if err := p.sendDevice(link, out, what, with); err != nil {
			return 0, err
		}
	}
	return loss, nil
}

// forwardDevice is forward with device-resident transfers: receive (off
// the first stage), the stage, send (off the last), each alone.
func (p *pipeline) forwardDevice(b *Batch, i int, train bool) (float64, error) {
	s := p.slots[i%len(p.slots)]
	if in, ok := p.incoming(parallel.PipeOp{Micro: i}); ok {
		if err := p.receive(in); err != nil {
			return 0, err
		}
	}
	out, loss, err := s.t.forwardStage(b, s.in, train)
	if err != nil {
		return 0, err
	}
	if p.dl.next != nil {
		p.t.dev.Copy(p.dl.act, out)
		if err := p.sendDevice(p.dl.next, p.dl.act, fmt.Sprintf("the activations of micro-batch %d", i), nil); err != nil {
			return 0, err
		}
	}
	return loss, nil
}
