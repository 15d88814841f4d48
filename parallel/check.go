package parallel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// Tolerance is the largest norm-relative error, ||got-want|| / ||want||,
// that an equivalence check accepts (fp32).
const Tolerance = 1e-5

// Check is one equivalence check, the library form of the DLO-JZ notebook's
// test(classname): every rank of a tensor-parallel group builds the sharded
// layer and, locally, the unsharded one from the same seed, runs both on the
// same random batch, and compares this rank's piece of the forward output,
// the input gradient, every weight gradient, and every weight after one
// AdamW step. The same code runs in go test (in-process ranks) and in
// `hpcrun check` (one process per rank).
type Check struct {
	Name string // the layer, as `hpcrun check NAME` takes it
	Doc  string // one line

	run func(dev tensor.Device, tp nccl.Comm) (*Result, error)
}

// Measure is one compared quantity and its error (norm-relative, maxed over
// the ranks of the group).
type Measure struct {
	What  string // "forward output", "input gradient", "weight gradients", "weights after AdamW", ...
	Param string // the parameter, for weight measures
	Err   float64
}

// Result is the outcome of a check on one group.
type Result struct {
	Check    string
	TP       int
	Measures []Measure
	Fail     string // why it failed other than by tolerance; "" otherwise
}

// MaxErr is the largest error of the result.
func (r *Result) MaxErr() float64 {
	var m float64
	for _, x := range r.Measures {
		if math.IsNaN(x.Err) {
			return math.Inf(1)
		}
		m = max(m, x.Err)
	}
	return m
}

// Max is the largest error of the measures called what (over all
// parameters), and whether there is one.
func (r *Result) Max(what string) (float64, bool) {
	var m float64
	found := false
	for _, x := range r.Measures {
		if x.What == what {
			m, found = max(m, x.Err), true
			if math.IsNaN(x.Err) {
				m = math.Inf(1)
			}
		}
	}
	return m, found
}

// Pass reports whether every error is within Tolerance and nothing else failed.
func (r *Result) Pass() bool { return r.Fail == "" && r.MaxErr() <= Tolerance }

// Run runs the check on dev with the tensor-parallel group tp; every rank of
// tp must run it (tp may be nil: one unsharded rank). Every rank returns
// the same Result.
func (c Check) Run(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	if n := NewGroup(tp).Size(); ckHeads%n != 0 {
		return nil, fmt.Errorf("check %s: the checks are sized for tp 1, 2 or 4 (%d heads), not %d", c.Name, ckHeads, n)
	}
	res, err := c.run(dev, tp)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", c.Name, err)
	}
	res.Check, res.TP = c.Name, NewGroup(tp).Size()
	// Every rank compared its own piece: report the worst over the group.
	if g := NewGroup(tp); g.Size() > 1 {
		errs := make([]float32, len(res.Measures)+1)
		for i, m := range res.Measures {
			errs[i] = float32(m.Err)
		}
		if res.Fail != "" {
			errs[len(res.Measures)] = 1
		}
		if err := tp.AllReduce(errs, nccl.Max); err != nil {
			return nil, fmt.Errorf("check %s: %w", c.Name, err)
		}
		for i := range res.Measures {
			res.Measures[i].Err = float64(errs[i])
		}
		if errs[len(res.Measures)] != 0 && res.Fail == "" {
			res.Fail = "failed on another rank"
		}
	}
	return res, nil
}

// Checks lists every equivalence check, in the order `hpcrun check all` runs
// them.
func Checks() []Check {
	return []Check{
		{Name: "ColumnParallelLinear", Doc: "output columns split, f before (all-reduce of the input gradient)", run: checkColumn(false)},
		{Name: "ColumnParallelLinearGather", Doc: "ColumnParallelLinear with gather_output", run: checkColumn(true)},
		{Name: "RowParallelLinear", Doc: "input features split (input_is_parallel), g after (all-reduce of the output)", run: checkRow(true)},
		{Name: "RowParallelLinearScatter", Doc: "RowParallelLinear taking the full input and scattering it", run: checkRow(false)},
		{Name: "VocabParallelEmbedding", Doc: "vocabulary rows split, masked lookup, all-reduce", run: checkEmbedding},
		{Name: "VocabParallelCrossEntropy", Doc: "vocab-split logits, MAX and SUM all-reduces, local backward", run: checkCrossEntropy},
		{Name: "LMHead", Doc: "embedding tied to a column-parallel LM head and the vocab-parallel loss, padded vocab", run: checkLMHead},
		{Name: "LayerNorm", Doc: "replicated layernorm", run: checkLayerNorm},
		{Name: "ParallelSelfAttention", Doc: "heads split: QKV column-parallel, causal mask, output row-parallel", run: checkAttention(true)},
		{Name: "ParallelSelfAttentionPadding", Doc: "ParallelSelfAttention with a key padding mask (BERT)", run: checkAttention(false)},
		{Name: "ParallelMLP", Doc: "fc column-parallel, GELU, proj row-parallel", run: checkMLP},
		{Name: "Block", Doc: "pre-LN transformer block, causal and padded", run: checkBlock},
		{Name: "BlockComm", Doc: "a block does exactly 2 all-reduces forward and 2 backward, nothing else", run: checkBlockComm},
		{Name: "ColumnParallelLinearSP", Doc: "ColumnParallelLinear with sequence parallelism: input split along the sequence, all-gather forward, reduce-scatter of the input gradient", run: checkColumnSP},
		{Name: "RowParallelLinearSP", Doc: "RowParallelLinear with sequence parallelism: reduce-scatter of the output along the sequence, all-gather of its gradient", run: checkRowSP},
		{Name: "VocabParallelEmbeddingSP", Doc: "VocabParallelEmbedding reduce-scattered along the sequence", run: checkEmbeddingSP},
		{Name: "BlockSP", Doc: "Block with sequence parallelism: layer norms and residuals on T/tp positions, layer-norm gradients summed over tp", run: checkBlockSP},
		{Name: "LlamaBlock", Doc: "Llama block: RMSNorm, grouped-query attention with rotary embeddings (whole kv groups per rank), SwiGLU MLP (gate/up column-parallel, down row-parallel)", run: checkLlamaBlock(false)},
		{Name: "LlamaBlockSP", Doc: "LlamaBlock with sequence parallelism", run: checkLlamaBlock(true)},
		{Name: "LlamaBlockComm", Doc: "a Llama block does exactly 2 all-reduces forward and 2 backward, nothing else", run: checkLlamaBlockComm},
		{Name: "BlockCommSP", Doc: "a sequence-parallel block does 2 all-gathers and 2 reduce-scatters forward, 4 all-gathers and 2 reduce-scatters backward, nothing else", run: checkBlockCommSP},
	}
}

// FindChecks returns the checks named name (case-insensitive), or all of
// them for "all".
func FindChecks(name string) ([]Check, error) {
	all := Checks()
	if strings.EqualFold(name, "all") {
		return all, nil
	}
	var names []string
	for _, c := range all {
		if strings.EqualFold(c.Name, name) {
			return []Check{c}, nil
		}
		names = append(names, c.Name)
	}
	return nil, fmt.Errorf("no check %q: use all or one of %s", name, strings.Join(names, ", "))
}

// Sizes of the checks: small enough to run in seconds, with every split
// degree up to 4 (4 heads, widths divisible by 4*3).
const (
	ckB, ckT    = 2, 8
	ckDim       = 32
	ckHeads     = 4
	ckHidden    = 4 * ckDim
	ckOut       = 48
	ckVocab     = 200 // padded to 256 at tp=1,2 and 512 at tp=4: some ranks hold only padding
	ckSeed      = 7
	ckAdamLR    = 1e-3
	ckAdamDecay = 0.01
	ckAdamEps   = 0.2
)

// harness holds what every check needs: the device, the group, a generator
// that draws the same values on every rank, and the measures so far.
type harness struct {
	dev  tensor.Device
	g    *Group
	rng  *rand.Rand
	res  *Result
	err  error
	free []*tensor.Tensor
}

func newHarness(dev tensor.Device, tp nccl.Comm) *harness {
	return &harness{dev: dev, g: NewGroup(tp), rng: rand.New(rand.NewPCG(ckSeed, 99)), res: &Result{}}
}

// done releases the harness's tensors and returns its result.
func (h *harness) done() (*Result, error) {
	for _, t := range h.free {
		h.dev.Free(t)
	}
	return h.res, h.err
}

// fail records the first error.
func (h *harness) fail(err error) bool {
	if err != nil && h.err == nil {
		h.err = err
	}
	return h.err != nil
}

// random is a new device tensor of uniform values in [-1,1), the same on
// every rank, and its host copy.
func (h *harness) random(shape ...int) (*tensor.Tensor, []float32) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = h.rng.Float32()*2 - 1
	}
	return h.upload(v, shape...), v
}

// upload copies v to a new device tensor of the given shape.
func (h *harness) upload(v []float32, shape ...int) *tensor.Tensor {
	t := h.zeros(shape...)
	if t != nil {
		h.dev.CopyFromHost(t, v)
	}
	return t
}

// zeros is a new zeroed device tensor.
func (h *harness) zeros(shape ...int) *tensor.Tensor {
	t, err := h.dev.Alloc(shape...)
	if h.fail(err) {
		return nil
	}
	h.free = append(h.free, t)
	return t
}

// lastDim is this rank's shard along the last dimension of shape, in blocks.
func (h *harness) lastDim(shape []int, blocks int) Shard {
	if h.g.Size() == 1 {
		return Shard{Parts: 1}
	}
	return Shard{Dim: len(shape) - 1, Parts: h.g.Size(), Index: h.g.Rank(), Blocks: blocks}
}

// piece is this rank's piece of the host tensor full of the given shape.
func (h *harness) piece(full []float32, shape []int, sh Shard) []float32 {
	p, err := sh.Take(full, shape)
	h.fail(err)
	return p
}

// compare records the norm-relative error of this rank's tensor got
// against its piece (sh) of the reference tensor want (full shape).
func (h *harness) compare(what string, got, want *tensor.Tensor, sh Shard) {
	h.compareParam(what, "", got, want, sh)
}

func (h *harness) compareParam(what, param string, got, want *tensor.Tensor, sh Shard) {
	if h.err != nil {
		return
	}
	w := download(want)
	if !sh.Replicated() {
		w = h.piece(w, want.Shape(), sh)
	}
	h.res.Measures = append(h.res.Measures, Measure{What: what, Param: param, Err: relErr(download(got), w)})
}

func (h *harness) compareHost(what string, got, want []float32) {
	h.res.Measures = append(h.res.Measures, Measure{What: what, Err: relErr(got, want)})
}

// compareParams compares gradients (and, after step, weights) of the
// sharded layer's params with the reference's, in the same order.
func (h *harness) compareParams(what string, got, want []*Param, grads bool) {
	if len(got) != len(want) && h.fail(fmt.Errorf("%d parameters, reference has %d", len(got), len(want))) {
		return
	}
	for i, p := range got {
		r := want[i]
		if p.Name != r.Name && h.fail(fmt.Errorf("parameter %d is %s, reference %s", i, p.Name, r.Name)) {
			return
		}
		if grads {
			h.compareParam(what, p.Name, p.Grad, r.Grad, p.Shard)
		} else {
			h.compareParam(what, p.Name, p.Data, r.Data, p.Shard)
		}
	}
}

// step runs one AdamW step over the sharded and the reference parameters
// and compares the weights. Eps is ckAdamEps, not the usual 1e-8: some
// gradients are zero in exact arithmetic (the key bias: softmax ignores a
// constant added to every key) and Adam's first step would otherwise turn
// their rounding noise (~1e-7 against O(1) gradients) into full +-LR
// steps that differ in sign between the sharded and the reference layer.
func (h *harness) step(got, want []*Param) {
	for _, ps := range [][]*Param{got, want} {
		for _, p := range ps {
			m, v := h.zeros(p.Data.Shape()...), h.zeros(p.Data.Shape()...)
			if h.err != nil {
				return
			}
			wd := float32(0)
			if p.Decay {
				wd = ckAdamDecay
			}
			h.dev.AdamW(p.Data, p.Grad, m, v, nil, tensor.AdamWParams{LR: ckAdamLR, Beta1: 0.9, Beta2: 0.999, Eps: ckAdamEps, WeightDecay: wd, Step: 1}, nil)
		}
	}
	h.compareParams("weights after AdamW", got, want, false)
}

// download copies t to a new host slice.
func download(t *tensor.Tensor) []float32 {
	out := make([]float32, t.Len())
	t.Device().CopyToHost(out, t)
	return out
}

// relErr is ||got-want|| / ||want|| in float64 (||got-want|| when want is 0,
// +Inf on a length mismatch or a NaN).
func relErr(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var d, n float64
	for i, g := range got {
		x := float64(g) - float64(want[i])
		d += x * x
		n += float64(want[i]) * float64(want[i])
	}
	if math.IsNaN(d) {
		return math.Inf(1)
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

// layerPair is a check's sharded layer and its unsharded reference behind
// one forward/backward signature on (B,T,*) tensors.
type layerPair struct {
	fwd    func(sharded bool, x *tensor.Tensor) (*tensor.Tensor, error)
	bwd    func(sharded bool, dout, dx *tensor.Tensor) error
	params func(sharded bool) []*Param
	// reduce, when not nil, completes the sharded layer's gradients after
	// its backward (SequenceParallel.ReduceGrads).
	reduce func() error
}

// runPair is the common check: forward a random x (this rank's inShard of
// it for the sharded layer), compare outputs (outShard), backward a random
// dout, compare input and weight gradients, step, compare weights.
func (h *harness) runPair(lp layerPair, inShape []int, inShard Shard, outShard Shard) {
	if h.err != nil {
		return
	}
	x, xh := h.random(inShape...)
	xl := x
	if !inShard.Replicated() {
		xl = h.upload(h.piece(xh, inShape, inShard), inShard.LocalShape(inShape)...)
	}
	if h.err != nil {
		return
	}
	want, err := lp.fwd(false, x)
	if h.fail(err) {
		return
	}
	got, err := lp.fwd(true, xl)
	if h.fail(err) {
		return
	}
	h.compare("forward output", got, want, outShard)
	dout, dh := h.random(want.Shape()...)
	doutl := dout
	if !outShard.Replicated() {
		doutl = h.upload(h.piece(dh, want.Shape(), outShard), got.Shape()...)
	}
	dx, dxl := h.zeros(x.Shape()...), h.zeros(xl.Shape()...)
	if h.err != nil {
		return
	}
	if h.fail(lp.bwd(false, dout, dx)) || h.fail(lp.bwd(true, doutl, dxl)) {
		return
	}
	if lp.reduce != nil && h.fail(lp.reduce()) {
		return
	}
	h.compare("input gradient", dxl, dx, inShard)
	h.compareParams("weight gradients", lp.params(true), lp.params(false), true)
	h.step(lp.params(true), lp.params(false))
}

func checkColumn(gather bool) func(tensor.Device, nccl.Comm) (*Result, error) {
	return func(dev tensor.Device, tp nccl.Comm) (*Result, error) {
		h := newHarness(dev, tp)
		opt := LinearOptions{Bias: true, Seed: ckSeed, GatherOutput: gather}
		ref, err := NewColumnParallelLinear(dev, nil, "fc", ckDim, ckOut, opt)
		if err != nil {
			return nil, err
		}
		sh, err := NewColumnParallelLinear(dev, tp, "fc", ckDim, ckOut, opt)
		if err != nil {
			return nil, err
		}
		outShard := h.lastDim([]int{ckB, ckT, ckOut}, 1)
		if gather {
			outShard = Shard{Parts: 1}
		}
		h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, Shard{Parts: 1}, outShard)
		return h.done()
	}
}

func checkRow(inputIsParallel bool) func(tensor.Device, nccl.Comm) (*Result, error) {
	return func(dev tensor.Device, tp nccl.Comm) (*Result, error) {
		h := newHarness(dev, tp)
		opt := LinearOptions{Bias: true, Seed: ckSeed, InputIsParallel: inputIsParallel}
		ref, err := NewRowParallelLinear(dev, nil, "proj", ckOut, ckDim, LinearOptions{Bias: true, Seed: ckSeed})
		if err != nil {
			return nil, err
		}
		sh, err := NewRowParallelLinear(dev, tp, "proj", ckOut, ckDim, opt)
		if err != nil {
			return nil, err
		}
		in := []int{ckB, ckT, ckOut}
		inShard := Shard{Parts: 1}
		if inputIsParallel {
			inShard = h.lastDim(in, 1)
		}
		h.runPair(linearPair(ref, sh), in, inShard, Shard{Parts: 1})
		return h.done()
	}
}

// forwardBackward is the shape of the (B,T,*) -> (B,T,*) layers.
type forwardBackward interface {
	Layer
	Forward(*tensor.Tensor) (*tensor.Tensor, error)
	Backward(dout, dinp *tensor.Tensor) error
}

func linearPair(ref, sh forwardBackward) layerPair {
	pick := func(sharded bool) forwardBackward {
		if sharded {
			return sh
		}
		return ref
	}
	return layerPair{
		fwd:    func(s bool, x *tensor.Tensor) (*tensor.Tensor, error) { return pick(s).Forward(x) },
		bwd:    func(s bool, dout, dx *tensor.Tensor) error { return pick(s).Backward(dout, dx) },
		params: func(s bool) []*Param { return pick(s).Params() },
	}
}

func checkLayerNorm(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	ref, err := NewLayerNorm(dev, "ln", ckDim, nil)
	if err != nil {
		return nil, err
	}
	sh, err := NewLayerNorm(dev, "ln", ckDim, nil)
	if err != nil {
		return nil, err
	}
	// Perturb the weight so that its gradient path is not the identity.
	w, _ := h.random(ckDim)
	dev.Copy(ref.Weight.Data, w)
	dev.Copy(sh.Weight.Data, w)
	h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, Shard{Parts: 1}, Shard{Parts: 1})
	return h.done()
}

func checkMLP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	ref, err := NewParallelMLP(dev, nil, "mlp", ckDim, ckHidden, ckSeed, 0, 0, nil, tensor.Float32)
	if err != nil {
		return nil, err
	}
	sh, err := NewParallelMLP(dev, tp, "mlp", ckDim, ckHidden, ckSeed, 0, 0, nil, tensor.Float32)
	if err != nil {
		return nil, err
	}
	h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, Shard{Parts: 1}, Shard{Parts: 1})
	return h.done()
}

// keyMask is a (B*T) padding mask: item b has its last b+1 tokens padded.
func keyMask(b, t int) []int32 {
	m := make([]int32, b*t)
	for i := 0; i < b; i++ {
		for j := 0; j < t; j++ {
			if j < t-1-i {
				m[i*t+j] = 1
			}
		}
	}
	return m
}

func checkAttention(causal bool) func(tensor.Device, nccl.Comm) (*Result, error) {
	return func(dev tensor.Device, tp nccl.Comm) (*Result, error) {
		h := newHarness(dev, tp)
		cfg := AttentionConfig{Dim: ckDim, Heads: ckHeads, Causal: causal, Seed: ckSeed, Std: 0.2}
		ref, err := NewParallelSelfAttention(dev, nil, "attn", cfg)
		if err != nil {
			return nil, err
		}
		sh, err := NewParallelSelfAttention(dev, tp, "attn", cfg)
		if err != nil {
			return nil, err
		}
		var mask []int32
		if !causal {
			mask = keyMask(ckB, ckT)
		}
		pick := func(s bool) *ParallelSelfAttention {
			if s {
				return sh
			}
			return ref
		}
		h.runPair(layerPair{
			fwd:    func(s bool, x *tensor.Tensor) (*tensor.Tensor, error) { return pick(s).Forward(x, mask) },
			bwd:    func(s bool, dout, dx *tensor.Tensor) error { return pick(s).Backward(dout, dx) },
			params: func(s bool) []*Param { return pick(s).Params() },
		}, []int{ckB, ckT, ckDim}, Shard{Parts: 1}, Shard{Parts: 1})
		return h.done()
	}
}

func newCheckBlocks(dev tensor.Device, tp nccl.Comm) (ref, sh *Block, err error) {
	cfg := BlockConfig{Dim: ckDim, Heads: ckHeads, Causal: true, Seed: ckSeed, Std: 0.2}
	if ref, err = NewBlock(dev, nil, "h.0", cfg); err != nil {
		return nil, nil, err
	}
	sh, err = NewBlock(dev, tp, "h.0", cfg)
	return ref, sh, err
}

func checkBlock(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	ref, sh, err := newCheckBlocks(dev, tp)
	if err != nil {
		return nil, err
	}
	mask := keyMask(ckB, ckT)
	pick := func(s bool) *Block {
		if s {
			return sh
		}
		return ref
	}
	h.runPair(layerPair{
		fwd:    func(s bool, x *tensor.Tensor) (*tensor.Tensor, error) { return pick(s).Forward(x, mask) },
		bwd:    func(s bool, dout, dx *tensor.Tensor) error { return pick(s).Backward(dout, dx) },
		params: func(s bool) []*Param { return pick(s).Params() },
	}, []int{ckB, ckT, ckDim}, Shard{Parts: 1}, Shard{Parts: 1})
	return h.done()
}

// countPhases runs block sh forward and backward on random (B, rows, C)
// data and returns tp's counters before, between and after. At tp 1 it
// records that nothing is sent and returns ok false; so does a data error,
// recorded in h.
func (h *harness) countPhases(tp nccl.Comm, sh checkedBlock, rows int) (s0, s1, s2 nccl.Stats, ok bool, err error) {
	x, _ := h.random(ckB, rows, ckDim)
	dout, _ := h.random(ckB, rows, ckDim)
	dx := h.zeros(ckB, rows, ckDim)
	if h.err != nil {
		return
	}
	if h.g.Size() == 1 {
		h.res.Measures = []Measure{{What: "no communication at tp=1", Err: 0}}
		_, err = sh.Forward(x, nil)
		return
	}
	s0 = tp.Stats()
	if _, err = sh.Forward(x, nil); err != nil {
		return
	}
	s1 = tp.Stats()
	if err = sh.Backward(dout, dx); err != nil {
		return
	}
	return s0, s1, tp.Stats(), true, nil
}

// orDone is h's result, or err when there is one.
func (h *harness) orDone(err error) (*Result, error) {
	if err != nil {
		return nil, err
	}
	return h.done()
}

// checkedBlock is a GPT or a Llama block under a check.
type checkedBlock interface {
	Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
	Backward(dout, dx *tensor.Tensor) error
}

// checkBlockComm counts the collectives of one block's forward and
// backward on the group: 2 all-reduces each, of B*T*C floats, nothing else.
func checkBlockComm(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	_, sh, err := newCheckBlocks(dev, tp)
	if err != nil {
		return nil, err
	}
	return h.countBlockComm(tp, sh)
}

// checkLlamaBlockComm is checkBlockComm for the Llama block.
func checkLlamaBlockComm(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	_, sh, err := newCheckLlamaBlocks(h, tp, nil)
	if err != nil {
		return nil, err
	}
	return h.countBlockComm(tp, sh)
}

// countBlockComm is checkBlockComm's count on block sh.
func (h *harness) countBlockComm(tp nccl.Comm, sh checkedBlock) (*Result, error) {
	s0, s1, s2, ok, err := h.countPhases(tp, sh, ckT)
	if !ok || err != nil {
		return h.orDone(err)
	}
	want := int64(ckB * ckT * ckDim * 4)
	for _, ph := range []struct {
		name string
		d    nccl.Stats
	}{{"forward", s1.Sub(s0)}, {"backward", s2.Sub(s1)}} {
		tot := ph.d.Total()
		ar := ph.d.AllReduce
		h.res.Measures = append(h.res.Measures, Measure{What: fmt.Sprintf("%s: %d all-reduces, %d bytes, %d calls", ph.name, ar.Calls, ar.Bytes, tot.Calls)})
		if ar.Calls != 2 || tot.Calls != 2 || ar.Bytes != 2*want {
			h.res.Fail = fmt.Sprintf("%s made %d all-reduces of %d bytes and %d collectives in all; want 2 all-reduces of %d bytes and nothing else", ph.name, ar.Calls, ar.Bytes, tot.Calls, 2*want)
		}
	}
	return h.done()
}

// newCheckEmbeddings makes the unsharded reference embedding (padded as
// the sharded one is) and the vocab-parallel one, from the same seed.
func newCheckEmbeddings(dev tensor.Device, tp nccl.Comm) (ref, sh *VocabParallelEmbedding, err error) {
	padded, err := PadVocab(ckVocab, NewGroup(tp).Size())
	if err != nil {
		return nil, nil, err
	}
	if ref, err = newVocabEmbedding(dev, nil, "wte", ckVocab, padded, ckDim, ckSeed, 0, nil); err != nil {
		return nil, nil, err
	}
	sh, err = NewVocabParallelEmbedding(dev, tp, "wte", ckVocab, ckDim, ckSeed, 0, nil)
	return ref, sh, err
}

func checkEmbedding(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	ref, sh, err := newCheckEmbeddings(dev, tp)
	if err != nil {
		return nil, err
	}
	ids := h.ids(ckB*ckT, ckVocab)
	want, err := ref.Forward(ids, ckB, ckT)
	if err != nil {
		return nil, err
	}
	got, err := sh.Forward(ids, ckB, ckT)
	if err != nil {
		return nil, err
	}
	h.compare("forward output", got, want, Shard{Parts: 1})
	dout, _ := h.random(ckB, ckT, ckDim)
	if h.err == nil && (h.fail(ref.Backward(dout)) || h.fail(sh.Backward(dout))) {
		return h.done()
	}
	h.compareParams("weight gradients", sh.Params(), ref.Params(), true)
	h.step(sh.Params(), ref.Params())
	return h.done()
}

// ids draws n token ids in [0, vocab), the same on every rank; it repeats
// some so that the scatter-add meets duplicates.
func (h *harness) ids(n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(h.rng.IntN(vocab))
	}
	ids[n-1] = ids[0]
	return ids
}

func checkCrossEntropy(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	padded, err := PadVocab(ckVocab, h.g.Size())
	if err != nil {
		return nil, err
	}
	ref, err := NewVocabParallelCrossEntropy(nil, "loss", padded)
	if err != nil {
		return nil, err
	}
	sh, err := NewVocabParallelCrossEntropy(tp, "loss", padded)
	if err != nil {
		return nil, err
	}
	n := ckB * ckT
	logits, lh := h.random(n, padded)
	dev.Scale(logits, 4) // peaked enough that the max matters
	lh = download(logits)
	sd := h.lastDim([]int{n, padded}, 1)
	local := h.upload(h.piece(lh, []int{n, padded}, sd), sd.LocalShape([]int{n, padded})...)
	targets := h.ids(n, padded)
	targets[1] = -1 // ignored
	if h.err != nil {
		return h.done()
	}
	want, err := ref.Forward(logits, targets)
	if err != nil {
		return nil, err
	}
	got, err := sh.Forward(local, targets)
	if err != nil {
		return nil, err
	}
	h.compareHost("forward output", []float32{float32(got)}, []float32{float32(want)})
	h.compare("per-row losses", sh.Losses(), ref.Losses(), Shard{Parts: 1})
	dl, dll := h.zeros(n, padded), h.zeros(local.Shape()...)
	if h.err != nil {
		return h.done()
	}
	if h.fail(ref.Backward(dl, 1)) || h.fail(sh.Backward(dll, 1)) {
		return h.done()
	}
	h.compare("input gradient", dll, dl, sd)
	return h.done()
}

// checkLMHead runs embedding -> tied LM head -> vocab-parallel loss and back:
// the padded vocabulary is masked, and the tied weight gets both gradients.
func checkLMHead(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	padded, err := PadVocab(ckVocab, h.g.Size())
	if err != nil {
		return nil, err
	}
	type model struct {
		emb  *VocabParallelEmbedding
		head *ColumnParallelLinear
		loss *VocabParallelCrossEntropy
	}
	build := func(c nccl.Comm) (m model, err error) {
		if m.emb, err = newVocabEmbedding(dev, c, "wte", ckVocab, padded, ckDim, ckSeed, 0.5, nil); err != nil {
			return m, err
		}
		if m.head, err = NewLMHead(c, "lm_head", m.emb, tensor.Float32); err != nil {
			return m, err
		}
		m.loss, err = NewVocabParallelCrossEntropy(c, "loss", padded)
		return m, err
	}
	ref, err := build(nil)
	if err != nil {
		return nil, err
	}
	sh, err := build(tp)
	if err != nil {
		return nil, err
	}
	ids := h.ids(ckB*ckT, ckVocab)
	targets := h.ids(ckB*ckT, ckVocab)
	// The loss must not see the padded vocabulary: the reference is also
	// checked against a float64 softmax over the real vocabulary only.
	host := hostLMLoss(download(ref.emb.Weight.Data), ids, targets, ckVocab, ckDim)
	var losses [2]float64
	for i, m := range []model{ref, sh} {
		x, err := m.emb.Forward(ids, ckB, ckT)
		if err != nil {
			return nil, err
		}
		logits, err := m.head.Forward(x)
		if err != nil {
			return nil, err
		}
		if losses[i], err = m.loss.Forward(logits, targets); err != nil {
			return nil, err
		}
		dx := h.zeros(x.Shape()...)
		if h.err != nil {
			return h.done()
		}
		// The reference accumulates into a gradient buffer; the sharded
		// model writes it over its logits (the fused classifier), which
		// must leave the padding its head masked once.
		dlogits := h.zeros(logits.Shape()...)
		if m == sh {
			dlogits, err = m.loss.BackwardInPlace(1, m.head.ProductOut())
		} else {
			err = m.loss.Backward(dlogits, 1)
		}
		if h.fail(err) || h.fail(m.head.Backward(dlogits, dx)) || h.fail(m.emb.Backward(dx)) {
			return h.done()
		}
	}
	h.compareHost("forward output", []float32{float32(losses[1])}, []float32{float32(losses[0])})
	h.compareHost("loss vs float64, real vocab", []float32{float32(losses[0])}, []float32{float32(host)})
	h.compareParams("weight gradients", sh.emb.Params(), ref.emb.Params(), true)
	h.step(sh.emb.Params(), ref.emb.Params())
	for i, m := range []model{ref, sh} {
		x, err := m.emb.Forward(ids, ckB, ckT)
		if h.fail(err) {
			return h.done()
		}
		logits, err := m.head.Forward(x)
		if h.fail(err) {
			return h.done()
		}
		if losses[i], err = m.loss.Forward(logits, targets); h.fail(err) {
			return h.done()
		}
	}
	h.compareHost("forward output after the step", []float32{float32(losses[1])}, []float32{float32(losses[0])})
	return h.done()
}

// hostLMLoss is the tied-embedding LM loss in float64 over the real vocabulary.
func hostLMLoss(table []float32, ids, targets []int32, vocab, dim int) float64 {
	var total float64
	for i, id := range ids {
		x := table[int(id)*dim : (int(id)+1)*dim]
		logits := make([]float64, vocab)
		mx := math.Inf(-1)
		for v := 0; v < vocab; v++ {
			var s float64
			for c := 0; c < dim; c++ {
				s += float64(x[c]) * float64(table[v*dim+c])
			}
			logits[v] = s
			mx = max(mx, s)
		}
		var se float64
		for _, l := range logits {
			se += math.Exp(l - mx)
		}
		total += math.Log(se) + mx - logits[targets[i]]
	}
	return total / float64(len(ids))
}

// seqShard is this rank's positions of a (B,T,*) activation under
// sequence parallelism.
func (h *harness) seqShard() Shard {
	if h.g.Size() == 1 {
		return Shard{Parts: 1}
	}
	return Shard{Dim: 1, Parts: h.g.Size(), Index: h.g.Rank()}
}

func checkColumnSP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	sp := NewSequenceParallel(tp)
	defer sp.Release()
	ref, err := NewColumnParallelLinear(dev, nil, "fc", ckDim, ckOut, LinearOptions{Bias: true, Seed: ckSeed})
	if err != nil {
		return nil, err
	}
	sh, err := NewColumnParallelLinear(dev, tp, "fc", ckDim, ckOut, LinearOptions{Bias: true, Seed: ckSeed, SequenceParallel: sp})
	if err != nil {
		return nil, err
	}
	h.runPair(linearPair(ref, sh), []int{ckB, ckT, ckDim}, h.seqShard(), h.lastDim([]int{ckB, ckT, ckOut}, 1))
	return h.done()
}

func checkRowSP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	sp := NewSequenceParallel(tp)
	defer sp.Release()
	ref, err := NewRowParallelLinear(dev, nil, "proj", ckOut, ckDim, LinearOptions{Bias: true, Seed: ckSeed})
	if err != nil {
		return nil, err
	}
	sh, err := NewRowParallelLinear(dev, tp, "proj", ckOut, ckDim, LinearOptions{Bias: true, Seed: ckSeed, InputIsParallel: true, SequenceParallel: sp})
	if err != nil {
		return nil, err
	}
	in := []int{ckB, ckT, ckOut}
	h.runPair(linearPair(ref, sh), in, h.lastDim(in, 1), h.seqShard())
	return h.done()
}

func checkEmbeddingSP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	sp := NewSequenceParallel(tp)
	defer sp.Release()
	ref, sh, err := newCheckEmbeddings(dev, tp)
	if err != nil {
		return nil, err
	}
	if err := sh.SetSequenceParallel(sp); err != nil {
		return nil, err
	}
	ids := h.ids(ckB*ckT, ckVocab)
	want, err := ref.Forward(ids, ckB, ckT)
	if err != nil {
		return nil, err
	}
	got, err := sh.Forward(ids, ckB, ckT)
	if err != nil {
		return nil, err
	}
	h.compare("forward output", got, want, h.seqShard())
	dout, dh := h.random(ckB, ckT, ckDim)
	doutl := h.upload(h.piece(dh, dout.Shape(), h.seqShard()), got.Shape()...)
	if h.err == nil && (h.fail(ref.Backward(dout)) || h.fail(sh.Backward(doutl))) {
		return h.done()
	}
	h.compareParams("weight gradients", sh.Params(), ref.Params(), true)
	h.step(sh.Params(), ref.Params())
	return h.done()
}

func newCheckBlocksSP(dev tensor.Device, tp nccl.Comm, sp *SequenceParallel) (ref, sh *Block, err error) {
	cfg := BlockConfig{Dim: ckDim, Heads: ckHeads, Causal: true, Seed: ckSeed, Std: 0.2}
	if ref, err = NewBlock(dev, nil, "h.0", cfg); err != nil {
		return nil, nil, err
	}
	cfg.SP = sp
	sh, err = NewBlock(dev, tp, "h.0", cfg)
	return ref, sh, err
}

func checkBlockSP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	sp := NewSequenceParallel(tp)
	defer sp.Release()
	ref, sh, err := newCheckBlocksSP(dev, tp, sp)
	if err != nil {
		return nil, err
	}
	// Perturb the layer norms so that their gradient paths are not the
	// identity.
	for _, ln := range [][2]*LayerNorm{{ref.LN1, sh.LN1}, {ref.LN2, sh.LN2}} {
		w, _ := h.random(ckDim)
		if h.err != nil {
			return h.done()
		}
		dev.Copy(ln[0].Weight.Data, w)
		dev.Copy(ln[1].Weight.Data, w)
	}
	mask := keyMask(ckB, ckT)
	pick := func(s bool) *Block {
		if s {
			return sh
		}
		return ref
	}
	h.runPair(layerPair{
		fwd:    func(s bool, x *tensor.Tensor) (*tensor.Tensor, error) { return pick(s).Forward(x, mask) },
		bwd:    func(s bool, dout, dx *tensor.Tensor) error { return pick(s).Backward(dout, dx) },
		params: func(s bool) []*Param { return pick(s).Params() },
		reduce: func() error { return sp.ReduceGrads(sh.Params()) },
	}, []int{ckB, ckT, ckDim}, h.seqShard(), h.seqShard())
	return h.done()
}

// checkBlockCommSP counts the collectives of a sequence-parallel block:
// forward 2 all-gathers (into QKV and fc) and 2 reduce-scatters (out of
// the two projections) of B*T*C floats; backward 4 all-gathers (QKV's and
// fc's input again, the projections' output gradients) and 2
// reduce-scatters (QKV's and fc's input gradients); then one all-reduce of
// the layer-norm gradients (4*C floats).
func checkBlockCommSP(dev tensor.Device, tp nccl.Comm) (*Result, error) {
	h := newHarness(dev, tp)
	sp := NewSequenceParallel(tp)
	defer sp.Release()
	_, sh, err := newCheckBlocksSP(dev, tp, sp)
	if err != nil {
		return nil, err
	}
	n := h.g.Size()
	s0, s1, s2, ok, err := h.countPhases(tp, sh, ckT/n)
	if !ok || err != nil {
		return h.orDone(err)
	}
	if err := sp.ReduceGrads(sh.Params()); err != nil {
		return nil, err
	}
	s3 := tp.Stats()
	full := int64(ckB * ckT * ckDim * 4) // bytes of a gathered (B,T,C)
	local := full / int64(n)             // bytes of a reduce-scattered (B,T/tp,C)
	for _, ph := range []struct {
		name       string
		d          nccl.Stats
		ag, rs, ar int64
		agB, rsB   int64
		arB        int64
	}{
		{"forward", s1.Sub(s0), 2, 2, 0, 2 * full, 2 * local, 0},
		{"backward", s2.Sub(s1), 4, 2, 0, 4 * full, 2 * local, 0},
		{"layer-norm gradients", s3.Sub(s2), 0, 0, 1, 0, 0, 4 * ckDim * 4},
	} {
		d := ph.d
		h.res.Measures = append(h.res.Measures, Measure{What: fmt.Sprintf("%s: %d all-gathers (%d bytes), %d reduce-scatters (%d bytes), %d all-reduces (%d bytes), %d calls",
			ph.name, d.AllGather.Calls, d.AllGather.Bytes, d.ReduceScatter.Calls, d.ReduceScatter.Bytes, d.AllReduce.Calls, d.AllReduce.Bytes, d.Total().Calls)})
		if d.AllGather.Calls != ph.ag || d.ReduceScatter.Calls != ph.rs || d.AllReduce.Calls != ph.ar || d.Total().Calls != ph.ag+ph.rs+ph.ar ||
			d.AllGather.Bytes != ph.agB || d.ReduceScatter.Bytes != ph.rsB || d.AllReduce.Bytes != ph.arB {
			h.res.Fail = fmt.Sprintf("%s made %d all-gathers of %d bytes, %d reduce-scatters of %d bytes, %d all-reduces of %d bytes (%d calls); want %d of %d, %d of %d, %d of %d and nothing else",
				ph.name, d.AllGather.Calls, d.AllGather.Bytes, d.ReduceScatter.Calls, d.ReduceScatter.Bytes, d.AllReduce.Calls, d.AllReduce.Bytes, d.Total().Calls,
				ph.ag, ph.agB, ph.rs, ph.rsB, ph.ar, ph.arB)
		}
	}
	return h.done()
}

// newCheckLlamaBlocks makes the unsharded and the sharded Llama block of
// the checks: 8 query heads in 4 groups (whole groups at tp 1, 2, 4),
// rotary embeddings with Llama 3's scaling, norm weights perturbed so that
// their gradient paths are not the identity.
func newCheckLlamaBlocks(h *harness, tp nccl.Comm, sp *SequenceParallel) (ref, sh *LlamaBlock, err error) {
	cfg := LlamaBlockConfig{Dim: ckDim, Heads: 2 * ckHeads, KVHeads: ckHeads, Hidden: 3 * ckDim / 2, Eps: 1e-5, Seed: ckSeed, Std: 0.2,
		RoPE: RoPE{Theta: 500, Scaling: &RoPEScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 16}}}
	if ref, err = NewLlamaBlock(h.dev, nil, "model.layers.0", cfg); err != nil {
		return nil, nil, err
	}
	cfg.SP = sp
	if sh, err = NewLlamaBlock(h.dev, tp, "model.layers.0", cfg); err != nil {
		return nil, nil, err
	}
	for _, n := range [][2]*RMSNorm{{ref.InputNorm, sh.InputNorm}, {ref.PostNorm, sh.PostNorm}} {
		w, _ := h.random(ckDim)
		if h.err != nil {
			return nil, nil, h.err
		}
		h.dev.Copy(n[0].Weight.Data, w)
		h.dev.Copy(n[1].Weight.Data, w)
	}
	return ref, sh, nil
}

// checkLlamaBlock runs the Llama block against the unsharded one, with
// sequence parallelism when sp is set.
func checkLlamaBlock(seqPar bool) func(tensor.Device, nccl.Comm) (*Result, error) {
	return func(dev tensor.Device, tp nccl.Comm) (*Result, error) {
		h := newHarness(dev, tp)
		var sp *SequenceParallel
		shard := Shard{Parts: 1}
		if seqPar {
			sp = NewSequenceParallel(tp)
			defer sp.Release()
			shard = h.seqShard()
		}
		ref, sh, err := newCheckLlamaBlocks(h, tp, sp)
		if err != nil {
			return nil, err
		}
		pick := func(s bool) *LlamaBlock {
			if s {
				return sh
			}
			return ref
		}
		lp := layerPair{
			fwd:    func(s bool, x *tensor.Tensor) (*tensor.Tensor, error) { return pick(s).Forward(x, nil) },
			bwd:    func(s bool, dout, dx *tensor.Tensor) error { return pick(s).Backward(dout, dx) },
			params: func(s bool) []*Param { return pick(s).Params() },
		}
		if seqPar {
			lp.reduce = func() error { return sp.ReduceGrads(sh.Params()) }
		}
		h.runPair(lp, []int{ckB, ckT, ckDim}, shard, shard)
		return h.done()
	}
}
