package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// paramSpec describes one parameter of the full (unsharded) model and this
// rank's piece of it.
type paramSpec struct {
	name  string
	full  []int          // shape of the whole tensor
	shard parallel.Shard // this rank's piece
	init  parallel.Init
	std   float32
	decay bool
}

// paramSet is every parameter of this rank in one flat weight tensor and one
// flat gradient tensor, carved into named views (llm.c style): zeroing the
// gradients is one call, and the DP all-reduce walks one buffer.
type paramSet struct {
	W, G   *tensor.Tensor
	params []*Param
	byName map[string]*Param
}

// newParamSet allocates the parameters and fills each with this rank's
// piece of a full tensor initialised from (seed, name), so that every
// tensor-parallel degree starts from the same model.
func newParamSet(dev tensor.Device, seed uint64, specs []paramSpec) (*paramSet, error) {
	total := 0
	for _, s := range specs {
		total += prod(s.shard.LocalShape(s.full))
	}
	W, err := dev.Alloc(total)
	if err != nil {
		return nil, fmt.Errorf("parameters (%d floats): %w", total, err)
	}
	G, err := dev.Alloc(total)
	if err != nil {
		dev.Free(W)
		return nil, fmt.Errorf("gradients (%d floats): %w", total, err)
	}
	ps := &paramSet{W: W, G: G, byName: map[string]*Param{}}
	off := 0
	for _, s := range specs {
		local := s.shard.LocalShape(s.full)
		n := prod(local)
		full := parallel.InitFull(s.name, seed, prod(s.full), s.init, s.std)
		piece, err := s.shard.Take(full, s.full)
		if err != nil {
			return nil, fmt.Errorf("parameter %s: %w", s.name, err)
		}
		p := &Param{Name: s.name, W: W.View(off, local...), G: G.View(off, local...), Replicated: s.shard.Replicated(), Decay: s.decay}
		dev.CopyFromHost(p.W, piece)
		ps.params = append(ps.params, p)
		ps.byName[s.name] = p
		off += n
	}
	return ps, nil
}

// get returns the parameter called name; the model's own table makes a
// missing name a programming error.
func (ps *paramSet) get(name string) *Param {
	p, ok := ps.byName[name]
	if !ok {
		panic("train: no parameter " + name)
	}
	return p
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
