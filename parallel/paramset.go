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
type ParamSet struct {
	specs  []ParamSpec
	params []*Param
	index  map[string]int
	taken  []bool
	seed   uint64
}

// NewParamSet allocates the parameters of specs on dev and fills them from
// seed (InitFull). Free them with FreeParams when the set fails to become
// a model's.
func NewParamSet(dev tensor.Device, specs []ParamSpec, seed uint64) (*ParamSet, error) {
	s := &ParamSet{specs: specs, index: make(map[string]int, len(specs)), taken: make([]bool, len(specs)), seed: seed}
	for i, sp := range specs {
		if _, dup := s.index[sp.Name]; dup {
			FreeParams(s.params)
			return nil, fmt.Errorf("parameter %s is listed twice", sp.Name)
		}
		s.index[sp.Name] = i
		p, err := newParam(dev, sp, seed)
		if err != nil {
			FreeParams(s.params)
			return nil, err
		}
		s.params = append(s.params, p)
	}
	return s, nil
}

// Params lists the set's parameters in its specs' order.
func (s *ParamSet) Params() []*Param { return s.params }

// FreeParams frees the values and gradients of params.
func FreeParams(params []*Param) {
	for _, p := range params {
		dev := p.Data.Device()
		dev.Free(p.Data)
		dev.Free(p.Grad)
	}
}

// param is the parameter a layer making want (from seed) uses: the set's,
// which must be made the same way, or a new one when s is nil.
func (s *ParamSet) param(dev tensor.Device, want ParamSpec, seed uint64) (*Param, error) {
	if s == nil {
		return newParam(dev, want, seed)
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
// and keeps this rank's piece.
func newParam(dev tensor.Device, sp ParamSpec, seed uint64) (*Param, error) {
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
	grad, err := dev.Alloc(shape...)
	if err != nil {
		dev.Free(data)
		return nil, fmt.Errorf("%s: %w", sp.Name, err)
	}
	dev.CopyFromHost(data, local)
	return &Param{Name: sp.Name, Data: data, Grad: grad, Full: slices.Clone(sp.Full), Shard: sp.Shard, Decay: sp.Decay, SeqReduce: sp.SeqReduce}, nil
}
