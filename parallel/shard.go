package parallel

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
)

// VocabMultiple is the granularity, per tensor-parallel rank, of the padded
// vocabulary: PadVocab rounds up to a multiple of VocabMultiple*tp so that
// every rank holds the same number of rows and GEMMs stay aligned.
const VocabMultiple = 128

// PadVocab returns vocab rounded up to a multiple of 128*tp, the number of
// rows of the (sharded) embedding table and LM head.
func PadVocab(vocab, tp int) (int, error) {
	if vocab <= 0 {
		return 0, fmt.Errorf("vocab %d: must be at least 1", vocab)
	}
	if tp <= 0 {
		return 0, fmt.Errorf("tp %d: must be at least 1", tp)
	}
	m := VocabMultiple * tp
	return (vocab + m - 1) / m * m, nil
}

// Shard says how a parameter is laid out across the tensor-parallel group.
//
// A replicated parameter (Parts == 1) holds the full tensor on every rank.
// A sharded one splits dimension Dim of the full tensor: that dimension is
// viewed as Blocks consecutive blocks (3 for a fused Q,K,V weight, else 1),
// and every block is cut into Parts equal pieces; rank Index holds piece Index
// of every block, concatenated in block order. Merging the shards of a
// checkpoint is the inverse: for each block, concatenate the ranks' pieces.
//
// With Replicas > 1 (one block) the split dimension is Parts/Replicas
// groups, each held by Replicas consecutive ranks: the last Shared indices
// of a group are held whole by all of them, the rest cut into Replicas
// pieces, so that rank Index holds its piece of group Index/Replicas
// followed by the group's shared indices (grouped-query attention's fused
// Q,K,V weight when tp exceeds the key/value heads: each rank its query
// heads and the key and value head it serves them from).
type Shard struct {
	Dim      int // split dimension of the full tensor; ignored when replicated
	Parts    int // tensor-parallel degree the parameter is split over; 1 = replicated
	Index    int // this rank's piece, in [0, Parts)
	Blocks   int // blocks the split dimension is made of (0 or 1 = one block)
	Replicas int // ranks that share each group's Shared indices (0 or 1 = none)
	Shared   int // indices at the end of each group its Replicas ranks all hold
}

// shares reports whether groups of ranks share indices (Replicas).
func (s Shard) shares() bool { return !s.Replicated() && s.Replicas > 1 }

// CountedLen is how many leading elements of this rank's piece of a tensor
// of shape full a sum over the ranks counts: all of them, except on a rank
// that shares indices with lower ranks (Replicas), whose copy of the
// shared ones (its piece's tail, Dim 0) another rank counts.
func (s Shard) CountedLen(full []int) int {
	ls := s.LocalShape(full)
	n := 1
	for _, d := range ls {
		n *= d
	}
	if !s.shares() || s.Index%s.Replicas == 0 {
		return n
	}
	return n / ls[0] * (ls[0] - s.Shared)
}

// SharedRange is where the shared indices (Replicas) lie in this rank's
// piece of a tensor of shape full: elements [off, off+n) (n 0 when none).
func (s Shard) SharedRange(full []int) (off, n int) {
	if !s.shares() {
		return 0, 0
	}
	ls := s.LocalShape(full)
	row := 1
	for _, d := range ls[1:] {
		row *= d
	}
	return (ls[0] - s.Shared) * row, s.Shared * row
}

// Replicated reports whether every tensor-parallel rank holds the whole
// parameter. Grad-norm clipping counts a replicated parameter once per TP
// group, a sharded one on every rank.
func (s Shard) Replicated() bool { return s.Parts <= 1 }

// String describes the layout, e.g. "replicated" or "dim 0 in 2 (rank 1)".
func (s Shard) String() string {
	if s.Replicated() {
		return "replicated"
	}
	if s.Blocks > 1 {
		return fmt.Sprintf("dim %d in %d (rank %d, %d blocks)", s.Dim, s.Parts, s.Index, s.Blocks)
	}
	if s.shares() {
		return fmt.Sprintf("dim %d in %d (rank %d, groups of %d ranks sharing %d)", s.Dim, s.Parts, s.Index, s.Replicas, s.Shared)
	}
	return fmt.Sprintf("dim %d in %d (rank %d)", s.Dim, s.Parts, s.Index)
}

// LocalShape returns the shape of this rank's piece of a tensor whose full
// shape is full.
func (s Shard) LocalShape(full []int) []int {
	out := append([]int(nil), full...)
	switch {
	case s.Dim < 0 || s.Dim >= len(out), s.shares() && s.Parts%s.Replicas != 0:
	case s.shares():
		group := out[s.Dim] / (s.Parts / s.Replicas)
		out[s.Dim] = (group-s.Shared)/s.Replicas + s.Shared
	case !s.Replicated():
		out[s.Dim] /= s.Parts
	}
	return out
}

// Take returns this rank's piece of full, a row-major tensor of shape shape,
// as a new slice. It errors when the split dimension does not divide.
func (s Shard) Take(full []float32, shape []int) ([]float32, error) {
	out := make([]float32, 0, len(full)/max(s.Parts, 1))
	err := s.runs(len(full), shape, func(fullStart, n int) {
		out = append(out, full[fullStart:fullStart+n]...)
	})
	return out, err
}

// Put is the inverse of Take: it writes this rank's piece local into full.
func (s Shard) Put(full []float32, shape []int, local []float32) error {
	if want := numelOf(s.LocalShape(shape)); len(local) != want {
		return fmt.Errorf("shard: %d local values, want %d", len(local), want)
	}
	off := 0
	return s.runs(len(full), shape, func(fullStart, n int) {
		copy(full[fullStart:fullStart+n], local[off:off+n])
		off += n
	})
}

// runs calls fn for each contiguous run of the full tensor that this rank's
// piece holds, in the piece's order.
func (s Shard) runs(n int, shape []int, fn func(fullStart, n int)) error {
	size := 1
	for _, d := range shape {
		size *= d
	}
	if n != size {
		return fmt.Errorf("shard: %d values for shape %v", n, shape)
	}
	if s.Replicated() {
		fn(0, n)
		return nil
	}
	if s.Dim < 0 || s.Dim >= len(shape) {
		return fmt.Errorf("shard: dim %d out of range for shape %v", s.Dim, shape)
	}
	if s.Index < 0 || s.Index >= s.Parts {
		return fmt.Errorf("shard: index %d out of range for %d parts", s.Index, s.Parts)
	}
	blocks := max(s.Blocks, 1)
	d := shape[s.Dim]
	if d%(blocks*s.Parts) != 0 {
		return fmt.Errorf("shard: dimension %d of shape %v (%d) is not a multiple of %d blocks x %d parts", s.Dim, shape, d, blocks, s.Parts)
	}
	outer, inner := 1, 1
	for _, x := range shape[:s.Dim] {
		outer *= x
	}
	for _, x := range shape[s.Dim+1:] {
		inner *= x
	}
	if s.shares() {
		return s.sharedRuns(shape, outer, inner, fn)
	}
	piece := d / (blocks * s.Parts) // indices of the split dim per block per rank
	for o := 0; o < outer; o++ {
		for b := 0; b < blocks; b++ {
			fn((o*d+b*(d/blocks)+s.Index*piece)*inner, piece*inner)
		}
	}
	return nil
}

// sharedRuns is runs for a layout with Replicas: of each outer index, this
// rank's piece of its group, then the group's shared indices.
func (s Shard) sharedRuns(shape []int, outer, inner int, fn func(fullStart, n int)) error {
	d := shape[s.Dim]
	if s.Blocks > 1 || s.Parts%s.Replicas != 0 || d%(s.Parts/s.Replicas) != 0 {
		return fmt.Errorf("shard: dimension %d of shape %v (%d) does not split into groups of %d of %d parts", s.Dim, shape, d, s.Replicas, s.Parts)
	}
	group := d / (s.Parts / s.Replicas)
	if s.Shared < 0 || s.Shared > group || (group-s.Shared)%s.Replicas != 0 {
		return fmt.Errorf("shard: groups of %d indices with %d shared do not split over %d replicas", group, s.Shared, s.Replicas)
	}
	piece, g, r := (group-s.Shared)/s.Replicas, s.Index/s.Replicas, s.Index%s.Replicas
	for o := 0; o < outer; o++ {
		base := o*d + g*group
		fn((base+r*piece)*inner, piece*inner)
		fn((base+group-s.Shared)*inner, s.Shared*inner)
	}
	return nil
}

func numelOf(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// ShardRows returns rank's piece of the row-major (rows, cols) matrix full,
// split along rows into parts: the layout of a column-parallel weight stored
// (out, in).
func ShardRows(full []float32, rows, cols, parts, rank int) ([]float32, error) {
	return Shard{Dim: 0, Parts: parts, Index: rank}.Take(full, []int{rows, cols})
}

// ShardCols returns rank's piece of the row-major (rows, cols) matrix full,
// split along columns into parts: the layout of a row-parallel weight stored
// (out, in).
func ShardCols(full []float32, rows, cols, parts, rank int) ([]float32, error) {
	return Shard{Dim: 1, Parts: parts, Index: rank}.Take(full, []int{rows, cols})
}

// Init says how a parameter's full tensor starts.
type Init int

const (
	InitNormal Init = iota // N(0, std^2), std from the initialiser
	InitZeros              // all zeros (biases)
	InitOnes               // all ones (layernorm gains)
)

// InitFull fills a new full (unsharded) tensor of n values for the parameter
// called name. Normal values come from a generator keyed by seed and name
// only, so every rank, at any tensor-parallel degree, builds the same full
// tensor and then takes its own shard: tp=1 and tp=N start from the same
// weights.
func InitFull(name string, seed uint64, n int, kind Init, std float32) []float32 {
	out := make([]float32, n)
	switch kind {
	case InitZeros:
	case InitOnes:
		for i := range out {
			out[i] = 1
		}
	default:
		h := fnv.New64a()
		h.Write([]byte(name))
		r := rand.New(rand.NewPCG(seed, h.Sum64()))
		for i := range out {
			out[i] = float32(r.NormFloat64()) * std
		}
	}
	return out
}

// Runs calls fn(start, n) for each contiguous run of the full row-major
// tensor of shape shape that this rank's piece holds, in the piece's order
// (offsets in elements): a reader can fetch just its piece from a file.
func (s Shard) Runs(shape []int, fn func(start, n int)) error {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return s.runs(n, shape, fn)
}
