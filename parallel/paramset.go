package parallel

import (
	"fmt"
	"slices"

	"github.com/hpcrun/hpcrun/tensor"
)

// ParamSpec says what one parameter of a rank is and how it starts: the
// entry of a model's layout (train/spec) that the model is made from.
type ParamSpec struct {
	Name  string // e.g. "h.0.attn.c_attn.weight": the checkpoint's and the init seed's key
	Full  []int  // the unsharded shape (the padded vocabulary included)
	Shard Shard  // this rank's piece
	Decay bool   // AdamW decays it (weights and embeddings, not biases or norms)
	// SeqReduce: a replicated parameter used in a sequence-parallel
	// region, whose gradient sequence parallelism sums over tp.
	SeqReduce bool
	Init      Init    // how the full tensor starts
	Std       float32 // InitNormal's standard deviation
	// ValidRows, when in (0, Full[0]), makes only the first ValidRows rows
	// random and the rest (the padded vocabulary) zero.
	ValidRows int
	// Block is the transformer block that holds the parameter (its index
	// in the model), -1 for the others (embeddings, final norm, head).
	Block int
}

// Elems is the unsharded parameter's element count.
func (p ParamSpec) Elems() int64 {
	n := int64(1)
	for _, d := range p.Full {
		n *= int64(d)
	}
	return n
}

// LocalElems is the element count of this rank's piece.
func (p ParamSpec) LocalElems() int64 {
	n := int64(1)
	for _, d := range p.Shard.LocalShape(p.Full) {
		n *= int64(d)
	}
	return n
}

// randomRows is the number of leading rows InitNormal fills: all of them
// unless ValidRows cuts the padding off.
func (p ParamSpec) randomRows() int {
	if p.ValidRows > 0 && p.ValidRows < p.Full[0] {
		return p.ValidRows
	}
	return p.Full[0]
}

// sameMaking says whether a and b make the same tensor: name, shape,
// piece, decay and initial values (SeqReduce is the layer's to set when
// it joins a sequence-parallel region).
func sameMaking(a, b ParamSpec) bool {
	if a.Name != b.Name || !slices.Equal(a.Full, b.Full) || a.Shard != b.Shard || a.Decay != b.Decay || a.Init != b.Init {
		return false
	}
	return a.Init != InitNormal || (a.Std == b.Std && a.randomRows() == b.randomRows())
}

func (p ParamSpec) String() string {
	s := fmt.Sprintf("%s %v %#v decay %v", p.Name, p.Full, p.Shard, p.Decay)
	switch p.Init {
	case InitZeros:
		return s + " zeros"
	case InitOnes:
		return s + " ones"
	}
	return s + fmt.Sprintf(" N(0, %g^2) over %d rows", p.Std, p.randomRows())
}

// ParamSet is a model's parameters made from its specs, in the specs'
// order, before any layer: each layer takes its own by name, and a
// parameter no layer takes is still the model's (trained, counted and
// saved). A nil *ParamSet makes a new parameter for each layer that asks.
//
// With shared block gradients (ZeRO-2) the gradients of every block's
// parameters are views of one buffer, BlockGrads, each block's laid out in
// its order from the start: the blocks run their backward one at a time,
// and each block's gradients are taken out (reduce-scattered) before the
// next block's backward writes its own.
type ParamSet struct {
	dev        tensor.Device
	specs      []ParamSpec
	params     []*Param
	index      map[string]int
	taken      []bool
	seed       uint64
	blocks     [][]*Param     // each block's parameters, in order (Block >= 0)
	blockGrads *tensor.Tensor // the blocks' shared gradients (nil: each its own)
}

// NewParamSet allocates the parameters of specs on dev and fills them from
// seed (InitFull). When blockPad > 0 the blocks' gradients share one
// buffer, the size of the largest block's rounded up to a multiple of
// blockPad (ZeRO-2's padding to dp), zero past the gradients. Free the set
// with Free.
func NewParamSet(dev tensor.Device, specs []ParamSpec, seed uint64, blockPad int) (*ParamSet, error) {
	s := &ParamSet{dev: dev, specs: specs, index: make(map[string]int, len(specs)), taken: make([]bool, len(specs)), seed: seed}
	sizes := map[int]int{}
	for i, sp := range specs {
		if _, dup := s.index[sp.Name]; dup {
			return nil, fmt.Errorf("parameter %s is listed twice", sp.Name)
		}
		s.index[sp.Name] = i
		if sp.Block >= 0 {
			sizes[sp.Block] += int(sp.LocalElems())
		}
	}
	shared := 0
	if blockPad > 0 {
		for _, n := range sizes {
			shared = max(shared, (n+blockPad-1)/blockPad*blockPad)
		}
	}
	if shared > 0 {
		g, err := dev.Alloc(shared)
		if err != nil {
			return nil, fmt.Errorf("the blocks' shared gradients: %w", err)
		}
		dev.Zero(g)
		s.blockGrads = g
	}
	off, block := 0, -1 // where the next gradient goes in the shared buffer, and whose
	for _, sp := range specs {
		if sp.Block >= 0 && sp.Block != block {
			off, block = 0, sp.Block
			s.blocks = append(s.blocks, nil)
		}
		var grad *tensor.Tensor
		if s.blockGrads != nil && sp.Block >= 0 {
			grad = s.blockGrads.View(off, sp.Shard.LocalShape(sp.Full)...)
			off += int(sp.LocalElems())
		}
		p, err := newParam(dev, sp, seed, grad)
		if err != nil {
			s.Free()
			return nil, err
		}
		s.params = append(s.params, p)
		if sp.Block >= 0 {
			s.blocks[len(s.blocks)-1] = append(s.blocks[len(s.blocks)-1], p)
		}
	}
	return s, nil
}

// Params lists the set's parameters in its specs' order.
func (s *ParamSet) Params() []*Param { return s.params }

// Blocks lists each block's parameters, the blocks and their parameters
// in order.
func (s *ParamSet) Blocks() [][]*Param { return s.blocks }

// BlockGrads is the blocks' shared gradient buffer (nil when each
// parameter has its own).
func (s *ParamSet) BlockGrads() *tensor.Tensor { return s.blockGrads }

// Free frees the parameters' values and gradients.
func (s *ParamSet) Free() {
	for _, p := range s.params {
		s.dev.Free(p.Data)
		if s.blockGrads == nil || s.specs[s.index[p.Name]].Block < 0 {
			s.dev.Free(p.Grad)
		}
	}
	if s.blockGrads != nil {
		s.dev.Free(s.blockGrads)
	}
	s.params, s.blocks, s.blockGrads = nil, nil, nil
}

// param is the parameter a layer making want (from seed) uses: the set's,
// which must be made the same way, or a new one when s is nil.
func (s *ParamSet) param(dev tensor.Device, want ParamSpec, seed uint64) (*Param, error) {
	if s == nil {
		return newParam(dev, want, seed, nil)
	}
	i, ok := s.index[want.Name]
	switch {
	case !ok:
		return nil, fmt.Errorf("%s: the layer makes a parameter the model's spec (train/spec) does not list", want.Name)
	case s.taken[i]:
		return nil, fmt.Errorf("%s: two layers take the parameter", want.Name)
	case !sameMaking(s.specs[i], want) || (want.Init == InitNormal && seed != s.seed):
		return nil, fmt.Errorf("%s: the layer makes %v from seed %d, the model's spec (train/spec) %v from seed %d", want.Name, want, seed, s.specs[i], s.seed)
	}
	s.taken[i] = true
	return s.params[i], nil
}

// newParam allocates a parameter on dev, fills its full tensor as sp says
// and keeps this rank's piece; its gradient is grad, or when nil a tensor
// of its own.
func newParam(dev tensor.Device, sp ParamSpec, seed uint64, grad *tensor.Tensor) (*Param, error) {
	n := int(sp.Elems())
	var values []float32
	if rows := sp.randomRows(); sp.Init == InitNormal && rows < sp.Full[0] {
		values = make([]float32, n)
		copy(values, InitFull(sp.Name, seed, rows*(n/sp.Full[0]), sp.Init, sp.Std))
	} else {
		values = InitFull(sp.Name, seed, n, sp.Init, sp.Std)
	}
	local, err := sp.Shard.Take(values, sp.Full)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sp.Name, err)
	}
	shape := sp.Shard.LocalShape(sp.Full)
	data, err := dev.Alloc(shape...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sp.Name, err)
	}
	if grad == nil {
		if grad, err = dev.Alloc(shape...); err != nil {
			dev.Free(data)
			return nil, fmt.Errorf("%s: %w", sp.Name, err)
		}
	}
	dev.CopyFromHost(data, local)
	return &Param{Name: sp.Name, Data: data, Grad: grad, Full: slices.Clone(sp.Full), Shard: sp.Shard, Decay: sp.Decay, SeqReduce: sp.SeqReduce}, nil
}
