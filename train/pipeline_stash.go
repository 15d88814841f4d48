package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// slot is where one micro-batch in flight on a pipeline stage lives from
// its forward to its backward: the copy of the stage's layers that keeps
// its activations, and the stage input they ran on (nil on the first
// stage, which starts from the batch's tokens).
type slot struct {
	t  *transformer
	in *tensor.Tensor
}

// newSlots makes a stage's n slots: the first runs the model itself, the
// others stage copies of it (stageCopy).
func newSlots(t *transformer, n int) ([]slot, error) {
	slots := make([]slot, n)
	for i := range slots {
		slots[i].t = t
		if i > 0 {
			slots[i].t = t.stageCopy()
		}
		if t.first {
			continue
		}
		x, err := t.dev.AllocAs(t.stageAct.DType, t.stageAct.Shape...)
		if err != nil {
			closeSlots(t, slots)
			return nil, fmt.Errorf("pipeline stage inputs: %w", err)
		}
		slots[i].in = x
	}
	return slots, nil
}

// closeSlots frees the slots' inputs and the stage copies' activations;
// the model itself (the first slot's) is closed with the trainer.
func closeSlots(t *transformer, slots []slot) {
	for _, s := range slots {
		if s.in != nil {
			t.dev.Free(s.in)
		}
		if s.t != nil && s.t != t {
			s.t.releaseLayers()
		}
	}
}

// stageCopy is a copy of a stage's model for one more micro-batch in
// flight, on a stage that is not the last (the last runs each forward
// right before its backward and needs none): shadows of the embeddings and
// the blocks (parallel's Shadow: the parameters and their gradients
// shared, the saved activations its own), and its own copy of what a
// forward keeps for the backward (the ids, targets, labels and key mask).
// The backward's scratch (the residual-stream gradients, the
// sequence-parallel buffers) is shared: a stage runs one backward at a
// time. Release its layers with releaseLayers, never Close it: the
// parameters are the model's.
func (t *transformer) stageCopy() *transformer {
	c := *t
	if t.wte != nil {
		c.wte = t.wte.Shadow()
	}
	if t.wpe != nil {
		c.wpe = t.wpe.Shadow()
	}
	c.blocks = nil
	for _, b := range t.blocks {
		switch b := b.(type) {
		case *parallel.Block:
			c.blocks = append(c.blocks, b.Shadow())
		case *parallel.LlamaBlock:
			c.blocks = append(c.blocks, b.Shadow())
		}
	}
	c.ids, c.targets, c.labels, c.forwardedTrain = nil, nil, nil, false
	if t.keyValid != nil {
		c.keyValid = make([]int32, len(t.keyValid))
	}
	c.allocated = nil
	return &c
}
