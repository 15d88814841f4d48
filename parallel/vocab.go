package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// VocabParallelEmbedding is a token embedding whose table (Padded, C) is
// split along the vocabulary: rank r holds rows [r*Padded/tp,
// (r+1)*Padded/tp), looks up the tokens that fall in its slice (zeros for
// the others), and the all-reduce g sums the slices into the full
// embedding. Rows past Vocab (padding) start at zero and are never looked
// up. Its weight can be tied to the LM head (see NewLMHead).
type VocabParallelEmbedding struct {
	Name   string
	Vocab  int    // real vocabulary
	Padded int    // PadVocab(Vocab, tp)
	Dim    int    // C
	Weight *Param // (Padded/tp, C)
	// Out is what the output is stored as: the residual stream's dtype
	// where it is the first block's input (a bfloat16 output gets the
	// rows rounded, which the all-reduce sums exactly: one rank's row and
	// zeros), Float32 (the zero value) where a position table adds to it
	// first. Set it before the first Forward.
	Out tensor.DType

	g    *Group
	gRed *Region
	sp   *SequenceParallel
	embSaved
}

// embSaved is what the embedding's Forward keeps for its Backward: a
// Shadow has its own.
type embSaved struct {
	ids  []int32
	bufs buffers
	out  *tensor.Tensor
}

// SetSequenceParallel makes the embedding's output this rank's (B,T/tp,C)
// positions: the slices are reduce-scattered (ḡ) instead of all-reduced,
// and Backward all-gathers the output gradient. sp must wrap the
// embedding's group; nil turns it off. The LM head made by NewLMHead
// afterwards follows.
func (e *VocabParallelEmbedding) SetSequenceParallel(sp *SequenceParallel) error {
	if err := checkSP(e.Name, sp, e.g); err != nil {
		return err
	}
	e.sp = sp
	e.bufs.release()
	return nil
}

// NewVocabParallelEmbedding makes this rank's slice of a (vocab, dim)
// embedding over the group tp (nil: unsharded); the vocabulary is padded to
// PadVocab(vocab, tp). Only rows below vocab are random, so every tp starts
// from the same real rows. The table is taken from from (nil: a new one).
func NewVocabParallelEmbedding(dev tensor.Device, tp nccl.Comm, name string, vocab, dim int, seed uint64, std float32, from *ParamSet) (*VocabParallelEmbedding, error) {
	g := NewGroup(tp)
	padded, err := PadVocab(vocab, g.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return newVocabEmbedding(dev, tp, name, vocab, padded, dim, seed, std, from)
}

// newVocabEmbedding is NewVocabParallelEmbedding with an explicit padded
// size, for the checks (an unsharded reference padded as the sharded one).
func newVocabEmbedding(dev tensor.Device, tp nccl.Comm, name string, vocab, padded, dim int, seed uint64, std float32, from *ParamSet) (*VocabParallelEmbedding, error) {
	g := NewGroup(tp)
	if dim < 1 {
		return nil, fmt.Errorf("%s: dim %d: must be at least 1", name, dim)
	}
	if padded < vocab || padded%g.Size() != 0 {
		return nil, fmt.Errorf("%s: padded vocab %d does not hold %d or split over tp %d", name, padded, vocab, g.Size())
	}
	if std == 0 {
		std = DefaultStd
	}
	sh := Shard{Dim: 0, Parts: g.Size(), Index: g.Rank()}
	if g.Size() == 1 {
		sh = Shard{Parts: 1}
	}
	w, err := from.param(dev, ParamSpec{Name: name + ".weight", Full: []int{padded, dim}, Shard: sh, Decay: true, Std: std, ValidRows: vocab}, seed)
	if err != nil {
		return nil, err
	}
	return &VocabParallelEmbedding{Name: name, Vocab: vocab, Padded: padded, Dim: dim, Weight: w, g: g, gRed: ReduceFromRegion(tp)}, nil
}

// Params lists the embedding table.
func (e *VocabParallelEmbedding) Params() []*Param { return []*Param{e.Weight} }

// VocabStart is the first vocabulary id of this rank's slice.
func (e *VocabParallelEmbedding) VocabStart() int { return e.g.Rank() * e.Padded / e.g.Size() }

// Forward looks up ids (B*T token ids in [0, Vocab)) into the layer's
// (B,T,C) output, the same on every rank (with sequence parallelism,
// this rank's (B,T/tp,C) positions). ids must stay unchanged until
// Backward.
func (e *VocabParallelEmbedding) Forward(ids []int32, b, t int) (*tensor.Tensor, error) {
	if b < 1 || t < 1 || len(ids) != b*t {
		return nil, shapeErr(e.Name, "%d ids for a batch of %dx%d tokens", len(ids), b, t)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= e.Vocab {
			return nil, shapeErr(e.Name, "token %d at position %d is outside the vocabulary [0,%d)", id, i, e.Vocab)
		}
	}
	dev := e.Weight.Data.Device()
	if e.sp != nil {
		return e.forwardSP(ids, b, t)
	}
	if err := e.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return EmbeddingSizes(b, t, e.Dim, e.Out).Saved }, func(get func(string) *tensor.Tensor) {
		e.out = get("out")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	e.ids = ids
	dev.EmbeddingForward(e.out, ids, e.Weight.Data, e.VocabStart())
	if err := e.gRed.Forward(e.out); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	return e.out, nil
}

// Backward accumulates dout (B,T,C) into the rows of this rank's slice.
func (e *VocabParallelEmbedding) Backward(dout *tensor.Tensor) error {
	if e.ids == nil {
		return fmt.Errorf("%s: Backward before Forward", e.Name)
	}
	if dout.Len() != e.out.Len() {
		return shapeErr(e.Name, "Backward with dout %v after a Forward to %v", dout, e.out)
	}
	if e.sp != nil {
		full, err := e.sp.Gather(dout.Reshape(e.out.Shape()...))
		if err != nil {
			return fmt.Errorf("%s: %w", e.Name, err)
		}
		dout = full
	}
	dout.Device().EmbeddingBackward(e.Weight.grad(), dout.Reshape(len(e.ids), e.Dim), e.ids, e.VocabStart())
	return nil
}

// forwardSP looks the tokens up into the shared full-sequence buffer and
// reduce-scatters it into this rank's positions (rounded once into a
// bfloat16 Out).
func (e *VocabParallelEmbedding) forwardSP(ids []int32, b, t int) (*tensor.Tensor, error) {
	dev := e.Weight.Data.Device()
	tl, err := e.sp.LocalSeq(e.Name, t)
	if err != nil {
		return nil, err
	}
	if err := e.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return EmbeddingSizes(b, tl, e.Dim, e.Out).Saved }, func(get func(string) *tensor.Tensor) {
		e.out = get("out")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	e.ids = ids
	full, err := e.sp.Full(dev, b, t, e.Dim)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	dev.EmbeddingForward(full, ids, e.Weight.Data, e.VocabStart())
	if err := e.sp.ReduceScatter(e.out, full, false); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	return e.out, nil
}

// NewLMHead is the output layer of a GPT tied to its token embedding: a
// ColumnParallelLinear (C -> Padded) sharing emb's weight, each rank
// producing the logits of its vocabulary slice (B,T,Padded/tp), stored as
// logits (BFloat16 under bf16 compute), with padded entries masked, ready
// for VocabParallelCrossEntropy. With the embedding's sequence parallelism
// (set before), the head takes this rank's (B,T/tp,C) positions and
// all-gathers them.
func NewLMHead(tp nccl.Comm, name string, emb *VocabParallelEmbedding, logits tensor.DType) (*ColumnParallelLinear, error) {
	return NewColumnParallelLinear(emb.Weight.Data.Device(), tp, name, emb.Dim, emb.Padded, LinearOptions{Tied: emb.Weight, ValidOut: emb.Vocab, SequenceParallel: emb.sp, OutDType: logits})
}

// VocabParallelCrossEntropy is the mean cross-entropy of logits split along
// the vocabulary (each rank holds (N, Padded/tp)) without gathering them:
// an all-reduce MAX of the row maxima, then one all-reduce SUM of the
// exp-sums and the target logits. The backward is local: each rank's
// softmax slice minus the one-hot of the targets it holds.
type VocabParallelCrossEntropy struct {
	Name   string
	Padded int // columns of the full logits

	g                 *Group
	logits            *tensor.Tensor
	targets           []int32
	count             int
	bufs              buffers
	rowMax, sums, los *tensor.Tensor // sums is (2N): sumExp then targetLogit
	host              []float32
}

// NewVocabParallelCrossEntropy makes the loss for logits of padded columns
// split over the group tp (nil: unsharded).
func NewVocabParallelCrossEntropy(tp nccl.Comm, name string, padded int) (*VocabParallelCrossEntropy, error) {
	g := NewGroup(tp)
	if padded < 1 || padded%g.Size() != 0 {
		return nil, fmt.Errorf("%s: vocab %d does not split over tp %d", name, padded, g.Size())
	}
	return &VocabParallelCrossEntropy{Name: name, Padded: padded, g: g}, nil
}

// Forward returns the mean loss over the targets that are not negative
// (negative targets are ignored). logits is this rank's (N, Padded/tp) or
// (B,T,Padded/tp) slice; targets (N) are global ids. logits and targets
// must stay unchanged until Backward.
func (c *VocabParallelCrossEntropy) Forward(logits *tensor.Tensor, targets []int32) (float64, error) {
	if err := c.ForwardDevice(logits, targets); err != nil {
		return 0, err
	}
	n := c.logits.Rows()
	if cap(c.host) < n {
		c.host = make([]float32, n)
	}
	h := c.host[:n]
	c.logits.Device().CopyToHost(h, c.los)
	if c.count == 0 {
		return 0, nil
	}
	var s float64
	for _, v := range h {
		s += float64(v)
	}
	return s / float64(c.count), nil
}

// ForwardDevice is Forward without reading the loss back to the host
// (which waits for the device): the per-row losses stay in Losses() and
// the mean loss is their sum over Count().
func (c *VocabParallelCrossEntropy) ForwardDevice(logits *tensor.Tensor, targets []int32) error {
	vl := c.Padded / c.g.Size()
	if logits == nil || logits.Cols() != vl {
		return shapeErr(c.Name, "logits %v: want (N,%d), this rank's slice of %d", logits, vl, c.Padded)
	}
	n := logits.Rows()
	if len(targets) != n || n == 0 {
		return shapeErr(c.Name, "%d targets for %d rows of logits", len(targets), n)
	}
	c.count = 0
	for i, t := range targets {
		if int(t) >= c.Padded {
			return shapeErr(c.Name, "target %d at row %d is outside the vocabulary [0,%d)", t, i, c.Padded)
		}
		if t >= 0 {
			c.count++
		}
	}
	dev := logits.Device()
	if err := c.bufs.ensure(dev, [2]int{n, vl}, func() Buffers { return CrossEntropySizes(n).Saved }, func(get func(string) *tensor.Tensor) {
		c.rowMax, c.sums, c.los = get("row_max"), get("sums"), get("losses")
	}); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	c.logits, c.targets = logits.Reshape(n, vl), targets
	sumExp, target := c.sums.View(0, n), c.sums.View(n, n)
	if c.g.Size() == 1 {
		// The fused classifier's forward: one pass a row, the same bits.
		dev.CrossEntropyForward(c.los, c.rowMax, sumExp, c.logits, targets)
		return nil
	}
	start := c.g.Rank() * vl
	dev.CrossEntropyRowMax(c.rowMax, c.logits)
	if err := c.g.AllReduce(c.rowMax, nccl.Max); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	dev.CrossEntropySumExp(sumExp, c.logits, c.rowMax)
	dev.CrossEntropyTargetLogit(target, c.logits, targets, start)
	if err := c.g.AllReduce(c.sums, nccl.Sum); err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	dev.CrossEntropyLoss(c.los, c.rowMax, sumExp, target, targets)
	return nil
}

// Count is the number of targets the last Forward counted (not negative).
func (c *VocabParallelCrossEntropy) Count() int { return c.count }

// Backward accumulates into dlogits (shaped as Forward's logits) the
// gradient of dloss times the mean loss.
func (c *VocabParallelCrossEntropy) Backward(dlogits *tensor.Tensor, dloss float32) error {
	if c.logits == nil {
		return fmt.Errorf("%s: Backward before Forward", c.Name)
	}
	if dlogits.Len() != c.logits.Len() {
		return shapeErr(c.Name, "dlogits %v for logits %v", dlogits, c.logits)
	}
	if c.count == 0 {
		return nil
	}
	n := c.logits.Rows()
	dev := dlogits.Device()
	dev.CrossEntropyBackward(dlogits.Reshape(c.logits.Shape()...), c.logits, c.rowMax, c.sums.View(0, n), c.targets, c.g.Rank()*c.logits.Cols(), dloss/float32(c.count))
	return nil
}

// BackwardInPlace is the fused classifier's backward: it writes the
// gradient of dloss times the mean loss over the first cols columns of the
// logits the last Forward read (the columns a padded head computes,
// ColumnParallelLinear.ProductOut; the rest keep their masked logits) and
// returns that tensor, which holds the gradient from then on: no (N,V)
// gradient buffer, and one pass over the logits instead of a zeroing and
// an accumulating one. The logits' values are gone, so a second Backward
// needs another Forward.
func (c *VocabParallelCrossEntropy) BackwardInPlace(dloss float32, cols int) (*tensor.Tensor, error) {
	if c.logits == nil {
		return nil, fmt.Errorf("%s: Backward before Forward", c.Name)
	}
	if cols < 0 || cols > c.logits.Cols() {
		return nil, shapeErr(c.Name, "gradient over %d columns of logits %v", cols, c.logits)
	}
	logits := c.logits
	c.logits = nil
	if c.count > 0 { // with no target counted every row is ignored: zeros
		dloss /= float32(c.count)
	}
	n := logits.Rows()
	logits.Device().CrossEntropyBackwardInPlace(logits, c.rowMax, c.sums.View(0, n), c.targets, c.g.Rank()*logits.Cols(), cols, dloss)
	return logits, nil
}

// Losses is the per-row loss of the last Forward (N), 0 at ignored targets.
func (c *VocabParallelCrossEntropy) Losses() *tensor.Tensor { return c.los }
