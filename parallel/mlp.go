package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// ParallelMLP is GPT-2's feed-forward block split as in Megatron-LM fig. 3a:
// fc (C -> Hidden) column-parallel, GELU on each rank's slice, proj
// (Hidden -> C) row-parallel. One all-reduce forward (g after proj), one
// backward (f before fc).
type ParallelMLP struct {
	Name string
	FC   *ColumnParallelLinear
	Proj *RowParallelLinear

	hiddn int
	act   tensor.DType // what h and its gradient dh are stored as
	*mlpSaved
	*mlpScratch
}

// mlpSaved is what the MLP's Forward keeps for its Backward: a Shadow has
// its own.
type mlpSaved struct {
	bufs buffers
	h    *tensor.Tensor // (B,T,Hidden/tp) after GELU, stored as ParallelMLP.act (as is fc's output)
}

// mlpScratch is what the MLP's Backward uses and leaves nothing in: the
// layer and its shadows share it.
type mlpScratch struct {
	grads buffers
	dh    *tensor.Tensor // (B,T,Hidden/tp): h's gradient, then (in place) fc's output's; stored as ParallelMLP.act
}

// NewParallelMLP makes this rank's shard of a (dim -> hidden -> dim) MLP
// over the group tp (nil: unsharded); tp must divide hidden. projStd is the
// init std of the output projection (0: std). The parameters are taken
// from from (nil: new ones). act is what fc's output and GELU's are
// stored as (BFloat16 under bf16 compute): only GELU's kernels read the
// first, only the output projection's products the second; and the
// gradient of GELU's output, which GELU's backward turns in place into
// fc's output's, read by fc's products and bias gradient.
func NewParallelMLP(dev tensor.Device, tp nccl.Comm, name string, dim, hidden int, seed uint64, std, projStd float32, from *ParamSet, act tensor.DType) (*ParallelMLP, error) {
	return newParallelMLP(dev, tp, nil, name, dim, hidden, seed, std, projStd, from, act, tensor.Float32)
}

// NewSequenceParallelMLP is NewParallelMLP in the sequence-parallel region
// sp of tp: its input and output are this rank's (B,T/tp,C) positions (fc
// all-gathers, proj reduce-scatters).
func NewSequenceParallelMLP(dev tensor.Device, tp nccl.Comm, sp *SequenceParallel, name string, dim, hidden int, seed uint64, std, projStd float32, from *ParamSet, act tensor.DType) (*ParallelMLP, error) {
	return newParallelMLP(dev, tp, sp, name, dim, hidden, seed, std, projStd, from, act, tensor.Float32)
}

// newParallelMLP is the MLP whose output gradient arrives as outGrad
// (AttentionConfig.OutGrad): NewParallelMLP's and
// NewSequenceParallelMLP's as float32, a pre-norm block's as act.
func newParallelMLP(dev tensor.Device, tp nccl.Comm, sp *SequenceParallel, name string, dim, hidden int, seed uint64, std, projStd float32, from *ParamSet, act, outGrad tensor.DType) (*ParallelMLP, error) {
	if projStd == 0 {
		projStd = std
	}
	fc, err := NewColumnParallelLinear(dev, tp, name+".c_fc", dim, hidden, LinearOptions{Bias: true, DeferBias: true, Seed: seed, Std: std, SequenceParallel: sp, From: from, OutDType: act})
	if err != nil {
		return nil, err
	}
	proj, err := NewRowParallelLinear(dev, tp, name+".c_proj", hidden, dim, LinearOptions{Bias: true, InputIsParallel: true, TransientOut: true, Seed: seed, Std: projStd, SequenceParallel: sp, From: from, GradDType: ProjGradDType(act, outGrad)})
	if err != nil {
		return nil, err
	}
	return &ParallelMLP{Name: name, FC: fc, Proj: proj, hiddn: hidden, act: act, mlpSaved: new(mlpSaved), mlpScratch: new(mlpScratch)}, nil
}

// Params lists the layer's parameters.
func (m *ParallelMLP) Params() []*Param { return append(m.FC.Params(), m.Proj.Params()...) }

// ShareScratch is ParallelSelfAttention.ShareScratch for MLPs.
func (m *ParallelMLP) ShareScratch(with *ParallelMLP) {
	m.grads.release()
	m.mlpScratch = with.mlpScratch
	shareProjections(m.FC, with.FC, m.Proj, with.Proj)
}

// Forward maps inp (B,T,C) to (B,T,C), both the same on every rank, the
// output in c_proj's buffer, which the next Forward of an MLP sharing its
// scratch writes over (as the attention's).
func (m *ParallelMLP) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	pre, err := m.FC.Forward(inp)
	if err != nil {
		return nil, err
	}
	dev := pre.Device()
	b, t := pre.Dim(0), pre.Dim(1)
	if err := m.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return mlpCoreSizes(b, t, pre.Dim(2), m.act).Saved }, func(get func(string) *tensor.Tensor) {
		m.h = get("h")
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", m.Name, err)
	}
	// fc's bias and GELU in one kernel (fc defers its bias).
	dev.BiasActivationForward(tensor.GELU, m.h, pre, m.FC.Bias.Data)
	return m.Proj.Forward(m.h)
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient (B,T,C) from dout (B,T,C).
func (m *ParallelMLP) Backward(dout, dinp *tensor.Tensor) error {
	if m.h == nil {
		return fmt.Errorf("%s: Backward before Forward", m.Name)
	}
	dev := dout.Device()
	b, t := m.h.Dim(0), m.h.Dim(1)
	if err := m.grads.ensure(dev, [2]int{b, t}, func() Buffers { return mlpCoreSizes(b, t, m.h.Dim(2), m.act).Scratch }, func(get func(string) *tensor.Tensor) {
		m.dh = get("dh")
	}); err != nil {
		return fmt.Errorf("%s: %w", m.Name, err)
	}
	dev.Zero(m.dh)
	if err := m.Proj.Backward(dout, m.dh); err != nil {
		return err
	}
	dev.ActivationBackwardInPlace(tensor.GELU, m.dh, m.FC.outLocal)
	return m.FC.Backward(m.dh, dinp)
}
