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
	// Product marks a weight that matrix products read (the linear
	// layers', a tied head's table): under bf16 compute the set keeps a
	// bfloat16 copy of it for them (ParamSet.SyncCopies).
	Product bool
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

// String says what the spec makes, for errors: name, shapes, decay and
// initial values.
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
// Sharded over a data-parallel group (BlockSharding), the blocks share
// their buffers: they run forward and backward one at a time. With
// Grads (ZeRO-2 and 3) the gradients of every block's parameters are views
// of one buffer, BlockGrads, each block's laid out in its order from the
// start, which each block's backward writes and its reduce-scatter then
// empties. With Params (ZeRO-3) so are their values (BlockData): each block
// keeps only this rank's range of its values (BlockShard: the range
// [rank*per, (rank+1)*per) of the block's values laid end to end and
// padded to per*ranks), and GatherBlock all-gathers them into the shared
// buffer before the block runs.
type ParamSet struct {
	dev        tensor.Device
	specs      []ParamSpec
	params     []*Param
	index      map[string]int
	taken      []bool
	seed       uint64
	blocks     [][]*Param     // each block's parameters, in order (Block >= 0)
	sharding   BlockSharding  // how the blocks are held
	blockGrads *tensor.Tensor // the blocks' shared gradients (nil: each its own)
	blockData  *tensor.Tensor // the blocks' shared values (nil: each its own)
	blockCopy  *tensor.Tensor // their bfloat16 copy (nil: none, or each its own)
	shards     []*tensor.Tensor
	at         map[*Param]blockPlace // where the blocks' parameters are
	resident   int                   // the block whose values BlockData holds, -1: none
}

// blockPlace is where a parameter is among the blocks: block l, from
// element off of the block's parameters laid end to end.
type blockPlace struct{ l, off int }

// BlockSharding says how a model's blocks hold their parameters: the zero
// value each whole and its own.
type BlockSharding struct {
	DP     *Group // the data-parallel group they are sharded over
	Grads  bool   // the gradients in one shared buffer (ZeRO-2 and 3)
	Params bool   // the values too, each block keeping its range (ZeRO-3)
}

// NewParamSet allocates the parameters of specs on dev, held as sharding
// says, and fills them from seed (InitFull). A shared buffer has the size
// of the largest block's, rounded up to a multiple of the data-parallel
// size. With copies BFloat16 every Product parameter has a bfloat16 Copy
// (shared as its values are under ZeRO-3); with Float32 none. Free the
// set with Free.
func NewParamSet(dev tensor.Device, specs []ParamSpec, seed uint64, sharding BlockSharding, copies tensor.DType) (*ParamSet, error) {
	s := &ParamSet{dev: dev, specs: specs, index: make(map[string]int, len(specs)), taken: make([]bool, len(specs)), seed: seed,
		sharding: sharding, at: map[*Param]blockPlace{}, resident: -1}
	if (sharding.Grads || sharding.Params) && sharding.DP == nil {
		return nil, fmt.Errorf("parameters sharded over no data-parallel group")
	}
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
	for _, n := range sizes {
		if (sharding.Grads || sharding.Params) && shared > 0 && s.padded(n) != shared {
			// A smaller block would reduce-scatter a larger one's
			// leftovers as its padding.
			return nil, fmt.Errorf("blocks of %d and %d parameters cannot share their buffers", n, shared)
		}
		shared = max(shared, s.padded(n))
	}
	var err error
	if sharding.Grads && shared > 0 {
		if s.blockGrads, err = dev.Alloc(shared); err != nil {
			return nil, fmt.Errorf("the blocks' shared gradients: %w", err)
		}
		dev.Zero(s.blockGrads)
	}
	if sharding.Params && shared > 0 {
		if s.blockData, err = dev.Alloc(shared); err != nil {
			s.Free()
			return nil, fmt.Errorf("the blocks' shared values: %w", err)
		}
		if copies == tensor.BFloat16 {
			if s.blockCopy, err = dev.AllocAs(tensor.BFloat16, shared); err != nil {
				s.Free()
				return nil, fmt.Errorf("the blocks' shared bfloat16 copy: %w", err)
			}
		}
	}
	off, block := 0, -1  // where the next parameter goes in its block, and whose
	var values []float32 // the block's values end to end (ZeRO-3)
	for i, sp := range specs {
		if sp.Block >= 0 && sp.Block != block {
			off, block = 0, sp.Block
			s.blocks = append(s.blocks, nil)
			values = values[:0]
		}
		var data, grad *tensor.Tensor
		if sp.Block >= 0 {
			shape := sp.Shard.LocalShape(sp.Full)
			if s.blockGrads != nil {
				grad = s.blockGrads.View(off, shape...)
			}
			if s.blockData != nil {
				data = s.blockData.View(off, shape...)
			}
		}
		p, local, err := newParam(dev, sp, seed, data, grad)
		if err != nil {
			s.Free()
			return nil, err
		}
		s.params = append(s.params, p)
		if copies == tensor.BFloat16 && sp.Product {
			if s.blockCopy != nil && sp.Block >= 0 {
				p.Copy = s.blockCopy.View(off, p.Data.Shape()...)
			} else if p.Copy, err = dev.AllocAs(tensor.BFloat16, p.Data.Shape()...); err != nil {
				s.Free()
				return nil, fmt.Errorf("%s: its bfloat16 copy: %w", sp.Name, err)
			}
		}
		if sp.Block < 0 {
			continue
		}
		s.blocks[len(s.blocks)-1] = append(s.blocks[len(s.blocks)-1], p)
		s.at[p] = blockPlace{len(s.blocks) - 1, off}
		off += len(local)
		if s.blockData == nil {
			continue
		}
		values = append(values, local...)
		if i+1 == len(specs) || specs[i+1].Block != block {
			if err := s.keepShard(values); err != nil {
				s.Free()
				return nil, err
			}
		}
	}
	s.SyncCopies()
	return s, nil
}

// SyncCopies rounds the parameters' values into their bfloat16 copies
// (Param.Copy): call it after anything but Load and GatherBlock writes
// values (the optimizer's step). Under ZeRO-3 the blocks' shared copy is
// GatherBlock's to fill as it gathers a block.
func (s *ParamSet) SyncCopies() {
	for _, p := range s.params {
		if _, shared := s.at[p]; p.Copy != nil && (s.blockCopy == nil || !shared) {
			s.dev.Copy(p.Copy, p.Data)
		}
	}
}

// padded is n rounded up to a multiple of the data-parallel size.
func (s *ParamSet) padded(n int) int {
	if s.sharding.DP == nil {
		return n
	}
	r := s.sharding.DP.Size()
	return (n + r - 1) / r * r
}

// keepShard keeps this rank's range of a block's values (all of them end
// to end) as the block's shard.
func (s *ParamSet) keepShard(values []float32) error {
	per := s.padded(len(values)) / s.sharding.DP.Size()
	lo := s.sharding.DP.Rank() * per
	piece := make([]float32, per)
	if lo < len(values) {
		copy(piece, values[lo:min(lo+per, len(values))])
	}
	t, err := s.dev.Alloc(per)
	if err != nil {
		return fmt.Errorf("a block's shard of %d values: %w", per, err)
	}
	s.dev.CopyFromHost(t, piece)
	s.shards = append(s.shards, t)
	return nil
}

// Params lists the set's parameters in its specs' order.
func (s *ParamSet) Params() []*Param { return s.params }

// Blocks lists each block's parameters, the blocks and their parameters
// in order.
func (s *ParamSet) Blocks() [][]*Param { return s.blocks }

// BlockGrads is the blocks' shared gradient buffer (nil when each
// parameter has its own).
func (s *ParamSet) BlockGrads() *tensor.Tensor { return s.blockGrads }

// ShardsValues says whether the blocks keep only their ranges of their
// values (ZeRO-3).
func (s *ParamSet) ShardsValues() bool { return s.blockData != nil }

// BlockShard is this rank's range of block l's values under ZeRO-3 (nil
// otherwise): what the optimizer updates.
func (s *ParamSet) BlockShard(l int) *tensor.Tensor {
	if s.blockData == nil {
		return nil
	}
	return s.shards[l]
}

// GatherBlock gives block l's parameters their values under ZeRO-3: every
// rank's range of them, all-gathered into the shared buffer (a collective
// of the data-parallel group). Nothing otherwise.
func (s *ParamSet) GatherBlock(l int) error {
	if s.blockData == nil {
		return nil
	}
	sh := s.shards[l]
	if err := s.sharding.DP.AllGather(s.blockData.View(0, sh.Len()*s.sharding.DP.Size()), sh); err != nil {
		return fmt.Errorf("zero 3: gathering block %d's parameters: %w", l, err)
	}
	if s.blockCopy != nil {
		s.dev.Copy(s.blockCopy, s.blockData)
	}
	s.resident = l
	return nil
}

// Updated says that the shards changed (the optimizer's step): the shared
// buffer no longer holds any block's values.
func (s *ParamSet) Updated() { s.resident = -1 }

// Load sets p's values (this rank's piece of it) from vals: under ZeRO-3
// the part of a block's parameter in this rank's range.
func (s *ParamSet) Load(p *Param, vals []float32) {
	at, ok := s.at[p]
	if s.blockData == nil || !ok {
		s.dev.CopyFromHost(p.Data, vals)
		if p.Copy != nil {
			s.dev.Copy(p.Copy, p.Data)
		}
		return
	}
	sh := s.shards[at.l]
	lo := s.sharding.DP.Rank() * sh.Len()
	off := at.off
	a, b := max(off, lo), min(off+len(vals), lo+sh.Len())
	if a < b {
		s.dev.CopyFromHost(sh.View(a-lo, b-a), vals[a-off:b-off])
	}
	s.resident = -1
}

// ToHost copies p's values (this rank's piece of it) into out: under
// ZeRO-3 a block's parameter is gathered first, so every rank of the
// data-parallel group must ask for the same parameters in the same order
// (a rank that needs no copy passes a nil out: it only takes part).
func (s *ParamSet) ToHost(p *Param, out []float32) error {
	if at, ok := s.at[p]; s.blockData != nil && ok && s.resident != at.l {
		if err := s.GatherBlock(at.l); err != nil {
			return err
		}
	}
	if out != nil {
		s.dev.CopyToHost(out, p.Data)
	}
	return nil
}

// Free frees the parameters' values and gradients.
func (s *ParamSet) Free() {
	for _, p := range s.params {
		_, shared := s.at[p]
		if s.blockData == nil || !shared {
			s.dev.Free(p.Data)
		}
		if s.blockGrads == nil || !shared {
			s.dev.Free(p.Grad)
		}
		if p.Copy != nil && (s.blockCopy == nil || !shared) {
			s.dev.Free(p.Copy)
		}
	}
	for _, t := range append(s.shards, s.blockGrads, s.blockData, s.blockCopy) {
		if t != nil {
			s.dev.Free(t)
		}
	}
	s.params, s.blocks, s.shards, s.blockGrads, s.blockData, s.blockCopy = nil, nil, nil, nil, nil, nil
}

// param is the parameter a layer making want (from seed) uses: the set's,
// which must be made the same way, or a new one when s is nil.
func (s *ParamSet) param(dev tensor.Device, want ParamSpec, seed uint64) (*Param, error) {
	if s == nil {
		p, _, err := newParam(dev, want, seed, nil, nil)
		return p, err
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

// newParam allocates a parameter on dev and fills its full tensor as sp
// says, keeping this rank's piece, which it also returns; its values and
// gradient are data and grad, or when nil tensors of its own (values
// given are not filled: their owner holds them).
func newParam(dev tensor.Device, sp ParamSpec, seed uint64, data, grad *tensor.Tensor) (*Param, []float32, error) {
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
		return nil, nil, fmt.Errorf("%s: %w", sp.Name, err)
	}
	shape := sp.Shard.LocalShape(sp.Full)
	own := data == nil
	if own {
		if data, err = dev.Alloc(shape...); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", sp.Name, err)
		}
		dev.CopyFromHost(data, local)
	}
	if grad == nil {
		if grad, err = dev.Alloc(shape...); err != nil {
			if own {
				dev.Free(data)
			}
			return nil, nil, fmt.Errorf("%s: %w", sp.Name, err)
		}
	}
	return &Param{Name: sp.Name, Data: data, Grad: grad, Full: slices.Clone(sp.Full), Shard: sp.Shard, Decay: sp.Decay, SeqReduce: sp.SeqReduce}, local, nil
}
