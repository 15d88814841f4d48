package parallel

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
)

// maskedLogit is written into output columns past LinearOptions.ValidOut
// (padded vocabulary): exp of it underflows to 0, so padding never counts.
const maskedLogit = -1e30

// LinearOptions are the options of the column- and row-parallel linear layers.
type LinearOptions struct {
	Bias bool      // add a bias (sharded for column-parallel, replicated for row-parallel)
	Seed uint64    // initialisation seed; weights are N(0, Std^2) keyed by name
	Std  float32   // 0 means DefaultStd
	From *ParamSet // the model's parameters, where the layer takes its own; nil: new ones

	// SequenceParallel, when not nil, puts the layer's replicated side in
	// the sequence-parallel region: a column-parallel layer takes this
	// rank's (B,T/tp,In) positions and all-gathers them (backward: a
	// reduce-scatter of the input gradient instead of the all-reduce f); a
	// row-parallel layer (InputIsParallel) reduce-scatters its output to
	// (B,T/tp,Out) instead of the all-reduce g (backward: an all-gather of
	// the output gradient). It must wrap the same group as tp.
	SequenceParallel *SequenceParallel

	// Column-parallel only.
	// OutDType is what this rank's output is stored as: BFloat16 for an
	// activation that only kernels reading bfloat16 read (the MLP's
	// pre-activation under bf16 compute: the product's float32 sums
	// rounded, then the bias added and rounded again; an LM head's logits,
	// whose gradient the fused classifier writes over them, so that
	// Backward reads a bfloat16 dout); not with GatherOutput.
	OutDType tensor.DType
	// DeferBias leaves the bias out of Forward's output: the caller adds
	// it, fused into the kernel after the product (ParallelMLP's
	// BiasActivationForward); its gradient is Backward's as ever. Not with
	// GatherOutput.
	DeferBias    bool
	GatherOutput bool   // all-gather the output so every rank holds (B,T,Out)
	Blocks       int    // the output is Blocks fused blocks each split over the ranks (3 for Q,K,V)
	ValidOut     int    // outputs >= ValidOut are padding (padded vocab): their logits are masked; 0 = none
	Tied         *Param // use this (Out, In) weight, e.g. the vocab-parallel embedding's, instead of a new one
	ValidRows    int    // only the first ValidRows rows of a new weight are random, the rest zero (padded vocab)
	// Replicas > 1 cuts the output as Shard.Replicas does: tp/Replicas
	// groups of outputs, the last Shared of each held by all the Replicas
	// ranks of the group (grouped-query attention's key/value heads
	// replicated over tp). The shared rows' gradients are partial: each
	// rank's from its own outputs (ReduceReplicas sums them).
	Replicas, Shared int

	// Row-parallel only.
	InputIsParallel bool // the input is already split along its last dimension (from a column-parallel layer)
	// TransientOut says the caller reads the output before the layer, or
	// a layer sharing its scratch (Block.ShareBuffers, a Shadow), runs
	// Forward again, and Backward never reads it (a block's projections,
	// whose outputs go straight into the residual add): the output lives
	// in the scratch instead of the layer's saved buffers, one for all the
	// blocks instead of one a block.
	TransientOut bool
	// GradDType is what Backward's products and bias gradient read the
	// output gradient as: BFloat16 (under bf16 compute) rounds a float32
	// one once into the layer's scratch, which both products read in
	// place (and sequence parallelism all-gathers as bf16), where each
	// GPU product would convert it again; 0 or Float32 reads it as it is.
	GradDType tensor.DType
}

func (o LinearOptions) std() float32 {
	if o.Std == 0 {
		return DefaultStd
	}
	return o.Std
}

// ColumnParallelLinear is out = inp @ W^T + b with W (Out, In) split along
// its output dimension: rank r holds rows [r*Out/tp, (r+1)*Out/tp) of W and
// of b and computes those output columns. Its input must be the same on
// every rank; the operator f before it all-reduces the input gradient in
// Backward. With GatherOutput the output columns of all ranks are gathered
// (B,T,Out); without, each rank keeps its (B,T,Out/tp) slice, ready for a
// RowParallelLinear with InputIsParallel.
type ColumnParallelLinear struct {
	Name         string
	In, Out      int    // full sizes
	Weight, Bias *Param // Weight is (Out/tp, In), Bias (Out/tp) or nil

	opt    LinearOptions
	g      *Group
	f      *Region
	gather *GatherFromRegion
	sp     *SequenceParallel
	tied   bool
	local  int // output columns on this rank

	*colSaved
	*colScratch
}

// colSaved is what a column-parallel layer's Forward keeps for its
// Backward: a Shadow has its own.
type colSaved struct {
	inp           *tensor.Tensor
	bufs          buffers
	out, outLocal *tensor.Tensor
	masked        *tensor.Tensor // the outLocal whose padded columns hold maskedLogit
}

// colScratch is what a column-parallel layer's Backward uses and leaves
// nothing in: the layer and its shadows share it.
type colScratch struct {
	grads         buffers
	dx, doutLocal *tensor.Tensor
}

// NewColumnParallelLinear makes the rank's shard of a linear layer from In
// to Out features split over the group tp (nil: unsharded).
func NewColumnParallelLinear(dev tensor.Device, tp nccl.Comm, name string, in, out int, opt LinearOptions) (*ColumnParallelLinear, error) {
	g := NewGroup(tp)
	blocks := max(opt.Blocks, 1)
	if in < 1 || out < 1 {
		return nil, fmt.Errorf("%s: in %d, out %d: must be at least 1", name, in, out)
	}
	shares := opt.Replicas > 1 && g.Size() > 1
	if out%(blocks*g.Size()) != 0 && !shares {
		return nil, fmt.Errorf("%s: %d outputs do not split into %d blocks over tp %d", name, out, blocks, g.Size())
	}
	if shares && (opt.Bias || opt.GatherOutput || blocks > 1 || opt.Tied != nil || opt.ValidOut > 0) {
		return nil, fmt.Errorf("%s: outputs shared by replicas go without bias, gather, blocks, a tied weight or padding", name)
	}
	if opt.ValidOut < 0 || opt.ValidOut > out {
		return nil, fmt.Errorf("%s: ValidOut %d outside [0,%d]", name, opt.ValidOut, out)
	}
	if opt.ValidOut > 0 && (opt.Bias || opt.GatherOutput || blocks > 1) {
		return nil, fmt.Errorf("%s: ValidOut (padded vocab) goes without bias, gather or blocks", name)
	}
	if err := checkSP(name, opt.SequenceParallel, g); err != nil {
		return nil, err
	}
	if opt.OutDType != tensor.Float32 && opt.GatherOutput {
		return nil, fmt.Errorf("%s: a %v output goes without GatherOutput", name, opt.OutDType)
	}
	if opt.DeferBias && (!opt.Bias || opt.GatherOutput) {
		return nil, fmt.Errorf("%s: DeferBias goes with a bias and without GatherOutput", name)
	}
	if opt.SequenceParallel != nil && opt.GatherOutput {
		return nil, fmt.Errorf("%s: GatherOutput goes without sequence parallelism", name)
	}
	l := &ColumnParallelLinear{Name: name, In: in, Out: out, opt: opt, g: g, f: CopyToRegion(tp), gather: NewGatherFromRegion(tp), sp: opt.SequenceParallel, colSaved: new(colSaved), colScratch: new(colScratch)}
	sh := Shard{Dim: 0, Parts: g.Size(), Index: g.Rank(), Blocks: blocks}
	if shares {
		sh = Shard{Dim: 0, Parts: g.Size(), Index: g.Rank(), Replicas: opt.Replicas, Shared: opt.Shared}
		if err := sh.Runs([]int{out, 1}, func(int, int) {}); err != nil {
			return nil, fmt.Errorf("%s: %d outputs over tp %d: %w", name, out, g.Size(), err)
		}
	}
	if g.Size() == 1 {
		sh = Shard{Parts: 1}
	}
	l.local = sh.LocalShape([]int{out, in})[0]
	var err error
	if opt.Tied != nil {
		w := opt.Tied
		if len(w.Full) != 2 || w.Full[0] != out || w.Full[1] != in || w.Shard.Parts != sh.Parts || (!sh.Replicated() && w.Shard.Dim != 0) {
			return nil, fmt.Errorf("%s: tied weight %s is %v split %v, want (%d,%d) split %v", name, w.Name, w.Full, w.Shard, out, in, sh)
		}
		if opt.Bias {
			return nil, fmt.Errorf("%s: a tied weight goes without bias", name)
		}
		l.Weight, l.tied = w, true
	} else if l.Weight, err = opt.From.param(dev, ParamSpec{Name: name + ".weight", Full: []int{out, in}, Shard: sh, Decay: true, Std: opt.std(), ValidRows: opt.ValidRows}, opt.Seed); err != nil {
		return nil, err
	}
	if opt.Bias {
		if l.Bias, err = opt.From.param(dev, ParamSpec{Name: name + ".bias", Full: []int{out}, Shard: sh, Init: InitZeros}, opt.Seed); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Params lists the layer's own parameters (not a tied weight).
func (l *ColumnParallelLinear) Params() []*Param {
	var ps []*Param
	if !l.tied {
		ps = append(ps, l.Weight)
	}
	if l.Bias != nil {
		ps = append(ps, l.Bias)
	}
	return ps
}

// shape is what decides the layer's buffers (ColumnSizes).
func (l *ColumnParallelLinear) shape() LinearShape {
	return LinearShape{In: l.In, Out: l.local * l.g.Size(), TP: l.g.Size(), SP: l.sp != nil, GatherOutput: l.opt.GatherOutput, OutDType: l.opt.OutDType}
}

// LocalOut is the number of output columns this rank computes.
func (l *ColumnParallelLinear) LocalOut() int { return l.local }

// productWidth is how many of ol output columns a padded layer's product
// computes when v of them are not padding: v rounded up to a multiple of
// 8, so that a GPU's GEMM runs its aligned kernels (GPT-2's 50,257 odd
// columns take cuBLAS's align-1 ones, several times slower), where the
// padding it does not compute holds as many masked columns as it does
// (ColumnParallelLinear.Forward copies them over); else v.
func productWidth(v, ol int) int {
	n := min((v+7)/8*8, ol)
	if ol-n < n-v {
		return v
	}
	return n
}

// ProductOut is how many of this rank's output columns its product
// computes: LocalOut, or for a padded vocabulary the columns that are not
// padding rounded up to 8 (productWidth); the rest of the output holds
// masked padding, and Backward reads only these columns of its dout, so a
// gradient written over the logits (VocabParallelCrossEntropy's
// BackwardInPlace) may leave the masked columns as they are.
func (l *ColumnParallelLinear) ProductOut() int {
	if v := l.validLocal(); v < l.LocalOut() {
		return productWidth(v, l.LocalOut())
	}
	return l.LocalOut()
}

// validLocal is how many of this rank's output columns are not padding.
func (l *ColumnParallelLinear) validLocal() int {
	if l.opt.ValidOut == 0 {
		return l.LocalOut()
	}
	return min(max(l.opt.ValidOut-l.g.Rank()*l.LocalOut(), 0), l.LocalOut())
}

// Forward computes the layer's output for inp (B,T,In): (B,T,Out) with
// GatherOutput, else this rank's (B,T,Out/tp). With sequence parallelism
// inp is this rank's (B,T/tp,In) positions, gathered first. The output
// belongs to the layer and is overwritten by the next Forward; inp must
// stay unchanged until Backward.
func (l *ColumnParallelLinear) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	b, t, err := batchShape(l.Name, inp, l.In)
	if err != nil {
		return nil, err
	}
	dev := l.Weight.Data.Device()
	x := inp
	if l.sp != nil {
		// g: all-gather of the sequence.
		if x, err = l.sp.Gather(inp); err != nil {
			return nil, fmt.Errorf("%s: %w", l.Name, err)
		}
		t = x.Dim(1)
	}
	ol := l.LocalOut()
	if err := l.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return ColumnSizes(l.shape(), b, t).Saved }, func(get func(string) *tensor.Tensor) {
		l.outLocal, l.out = get("out_local"), get("out")
		if l.out == nil {
			l.out = l.outLocal
		}
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	l.inp = inp
	// f: identity forward.
	if v := l.validLocal(); v < ol {
		if l.masked != l.outLocal { // the padded columns are written once per buffer
			dev.Fill(l.outLocal, maskedLogit)
			l.masked = l.outLocal
		}
		if v > 0 {
			n := l.ProductOut()
			dev.Gemm(false, true, b*t, n, l.In, 1, x, 0, l.In, l.Weight.Operand(), 0, l.In, 0, l.outLocal, 0, ol)
			if n > v { // padding the product wrote: masked again from padding it did not
				dev.Copy2D(l.outLocal, v, ol, l.outLocal, n, ol, b*t, n-v)
			}
		}
	} else {
		var bias *tensor.Tensor
		if l.Bias != nil && !l.opt.DeferBias {
			bias = l.Bias.Data
		}
		tensor.LinearForward(l.outLocal, x, l.Weight.Operand(), bias)
	}
	if l.out != l.outLocal {
		if err := l.gather.Forward(l.out, l.outLocal); err != nil {
			return nil, fmt.Errorf("%s: %w", l.Name, err)
		}
	}
	return l.out, nil
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient (B,T,In) from dout, shaped as Forward's output.
func (l *ColumnParallelLinear) Backward(dout, dinp *tensor.Tensor) error {
	if l.inp == nil {
		return fmt.Errorf("%s: Backward before Forward", l.Name)
	}
	if dout.Len() != l.out.Len() || (dinp != nil && dinp.Len() != l.inp.Len()) {
		return shapeErr(l.Name, "Backward with dout %v, dinp %v after a Forward of %v to %v", dout, dinp, l.inp, l.out)
	}
	dev := dout.Device()
	b, t := l.outLocal.Dim(0), l.outLocal.Dim(1)
	if err := l.grads.ensure(dev, [2]int{b, t}, func() Buffers { return ColumnSizes(l.shape(), b, t).Scratch }, func(get func(string) *tensor.Tensor) {
		l.dx, l.doutLocal = get("dx"), get("dout_local")
	}); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	dl := dout
	if l.out != l.outLocal {
		dev.Zero(l.doutLocal)
		if err := l.gather.Backward(l.doutLocal, dout); err != nil {
			return fmt.Errorf("%s: %w", l.Name, err)
		}
		dl = l.doutLocal
	}
	dl = dl.Reshape(l.outLocal.Shape()...)
	if l.sp != nil {
		return l.backwardSP(dl, dinp)
	}
	l.weightGrad(dl, l.inp)
	if dinp == nil {
		return nil
	}
	if l.g.Size() == 1 {
		l.inputGrad(dinp, dl, 1)
		return nil
	}
	l.inputGrad(l.dx, dl, 0)
	if err := l.f.Backward(l.dx); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	dev.Axpy(dinp, 1, l.dx)
	return nil
}

// backwardSP is Backward under sequence parallelism: the input is gathered
// again for the weight gradient, and the full input gradient is
// reduce-scattered (the g's backward) and added to this rank's positions.
func (l *ColumnParallelLinear) backwardSP(dl, dinp *tensor.Tensor) error {
	x, err := l.sp.Gather(l.inp)
	if err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	l.weightGrad(dl, x)
	if dinp == nil {
		return nil
	}
	dx, err := l.sp.Full(dl.Device(), x.Dim(0), x.Dim(1), l.In)
	if err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	l.inputGrad(dx, dl, 0)
	if err := l.sp.ReduceScatter(dinp.Reshape(l.inp.Shape()...), dx, true); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	return nil
}

// weightGrad is the parameters' gradient from dl (B,T,LocalOut) and the
// input x: over the ProductOut columns only, the weight rows of the
// padding getting none (zeros, when the gradient starts afresh).
func (l *ColumnParallelLinear) weightGrad(dl, x *tensor.Tensor) {
	n, ol := l.ProductOut(), l.LocalOut()
	if n == ol {
		weightGrad(l.Weight, l.Bias, dl, x)
		return
	}
	w, dev := l.Weight, dl.Device()
	beta := w.gradBeta()
	if beta == 0 {
		dev.Zero(w.Grad.View(n*l.In, ol-n, l.In))
	}
	if n > 0 {
		dev.Gemm(true, false, n, l.In, dl.Len()/ol, 1, dl, 0, ol, x, 0, l.In, beta, w.Grad, 0, l.In)
	}
}

// inputGrad is dx = dl @ W + beta*dx over the ProductOut columns of dl.
func (l *ColumnParallelLinear) inputGrad(dx, dl *tensor.Tensor, beta float32) {
	n, ol := l.ProductOut(), l.LocalOut()
	if n == ol {
		tensor.MatMul(dx, dl, l.Weight.Operand(), false, false, 1, beta)
		return
	}
	dev := dl.Device()
	if n == 0 {
		if beta == 0 {
			dev.Zero(dx)
		}
		return
	}
	dev.Gemm(false, false, dl.Len()/ol, l.In, n, 1, dl, 0, ol, l.Weight.Operand(), 0, l.In, beta, dx, 0, l.In)
}

// shareProjections makes a sublayer's column- and row-parallel layers c
// and r use the scratch of cw and rw, the same layers of a sublayer of the
// same shape that never runs at the same time, their own released.
func shareProjections(c, cw *ColumnParallelLinear, r, rw *RowParallelLinear) {
	c.grads.release()
	r.grads.release()
	c.colScratch, r.rowScratch = cw.colScratch, rw.rowScratch
}

// checkSP checks that sp (when not nil) splits over the layer's group.
func checkSP(name string, sp *SequenceParallel, g *Group) error {
	if sp != nil && (sp.Size() != g.Size() || sp.Rank() != g.Rank()) {
		return fmt.Errorf("%s: the sequence-parallel group (rank %d of %d) is not the layer's tensor-parallel group (rank %d of %d)", name, sp.Rank(), sp.Size(), g.Rank(), g.Size())
	}
	return nil
}

// RowParallelLinear is out = inp @ W^T + b with W (Out, In) split along its
// input dimension: rank r holds columns [r*In/tp, (r+1)*In/tp) of W, takes
// the matching slice of the input features, and the partial products are
// summed by the operator g (an all-reduce) before the replicated bias is
// added. With InputIsParallel the input is already this rank's (B,T,In/tp)
// slice (the output of a ColumnParallelLinear); without, it is the full
// (B,T,In) and the layer keeps its slice.
type RowParallelLinear struct {
	Name         string
	In, Out      int    // full sizes
	Weight, Bias *Param // Weight is (Out, In/tp), Bias (Out) replicated, or nil

	opt     LinearOptions
	g       *Group
	gReduce *Region
	scatter *ScatterToRegion
	sp      *SequenceParallel

	*rowSaved
	*rowScratch
}

// rowSaved is what a row-parallel layer's Forward keeps for its Backward:
// a Shadow has its own.
type rowSaved struct {
	xl         *tensor.Tensor // the input slice of the last Forward
	bufs       buffers
	out, xlBuf *tensor.Tensor
}

// rowScratch is what a row-parallel layer's calls use and leave nothing
// in past their return (Backward's input gradient slice; with
// TransientOut the output, which the caller reads at once): the layer and
// its shadows share it.
type rowScratch struct {
	grads     buffers
	dxl       *tensor.Tensor
	transient *tensor.Tensor // the output with LinearOptions.TransientOut
	doutHalf  *tensor.Tensor // the output gradient rounded, with LinearOptions.GradDType BFloat16
}

// NewRowParallelLinear makes the rank's shard of a linear layer from In to
// Out features, the inputs split over the group tp (nil: unsharded).
func NewRowParallelLinear(dev tensor.Device, tp nccl.Comm, name string, in, out int, opt LinearOptions) (*RowParallelLinear, error) {
	g := NewGroup(tp)
	if in < 1 || out < 1 {
		return nil, fmt.Errorf("%s: in %d, out %d: must be at least 1", name, in, out)
	}
	if in%g.Size() != 0 {
		return nil, fmt.Errorf("%s: %d inputs do not split over tp %d", name, in, g.Size())
	}
	if opt.GatherOutput || opt.Blocks > 1 || opt.ValidOut != 0 || opt.Tied != nil {
		return nil, fmt.Errorf("%s: GatherOutput, Blocks, ValidOut and Tied are column-parallel options", name)
	}
	if err := checkSP(name, opt.SequenceParallel, g); err != nil {
		return nil, err
	}
	if opt.SequenceParallel != nil && !opt.InputIsParallel {
		return nil, fmt.Errorf("%s: sequence parallelism needs InputIsParallel (the output of a column-parallel layer)", name)
	}
	l := &RowParallelLinear{Name: name, In: in, Out: out, opt: opt, g: g, gReduce: ReduceFromRegion(tp), scatter: NewScatterToRegion(tp), sp: opt.SequenceParallel, rowSaved: new(rowSaved), rowScratch: new(rowScratch)}
	sh := Shard{Dim: 1, Parts: g.Size(), Index: g.Rank()}
	if g.Size() == 1 {
		sh = Shard{Parts: 1}
	}
	var err error
	if l.Weight, err = opt.From.param(dev, ParamSpec{Name: name + ".weight", Full: []int{out, in}, Shard: sh, Decay: true, Std: opt.std()}, opt.Seed); err != nil {
		return nil, err
	}
	if opt.Bias {
		if l.Bias, err = opt.From.param(dev, ParamSpec{Name: name + ".bias", Full: []int{out}, Shard: Shard{Parts: 1}, Init: InitZeros}, opt.Seed); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Params lists the layer's parameters.
func (l *RowParallelLinear) Params() []*Param {
	if l.Bias != nil {
		return []*Param{l.Weight, l.Bias}
	}
	return []*Param{l.Weight}
}

// shape is what decides the layer's buffers (RowSizes).
func (l *RowParallelLinear) shape() LinearShape {
	return LinearShape{In: l.In, Out: l.Out, TP: l.g.Size(), SP: l.sp != nil, InputIsParallel: l.opt.InputIsParallel, TransientOut: l.opt.TransientOut, GradDType: l.opt.GradDType}
}

// ensure makes the layer's buffers for b x t input tokens: its own and,
// with TransientOut, the scratch that holds the output.
func (l *RowParallelLinear) ensure(dev tensor.Device, b, t int) error {
	if err := l.bufs.ensure(dev, [2]int{b, t}, func() Buffers { return RowSizes(l.shape(), b, t).Saved }, func(get func(string) *tensor.Tensor) {
		l.out, l.xlBuf = get("out"), get("x_local")
	}); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	if l.opt.TransientOut {
		return l.ensureScratch(dev, b, t)
	}
	return nil
}

// ensureScratch makes the layer's scratch for b x t input tokens.
func (l *RowParallelLinear) ensureScratch(dev tensor.Device, b, t int) error {
	if err := l.grads.ensure(dev, [2]int{b, t}, func() Buffers { return RowSizes(l.shape(), b, t).Scratch }, func(get func(string) *tensor.Tensor) {
		l.dxl, l.transient, l.doutHalf = get("dx_local"), get("out"), get("dout_half")
	}); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	return nil
}

// output is the layer's output buffer: its own, or with TransientOut the
// scratch's.
func (l *RowParallelLinear) output() *tensor.Tensor {
	if l.opt.TransientOut {
		return l.transient
	}
	return l.out
}

// LocalIn is the number of input features this rank multiplies.
func (l *RowParallelLinear) LocalIn() int { return l.In / l.g.Size() }

// Forward computes the (B,T,Out) output, the same on every rank, from inp:
// (B,T,In/tp) with InputIsParallel, else (B,T,In). The output belongs to the
// layer (with TransientOut to the scratch it shares: read it before the
// next Forward of a layer sharing it); inp must stay unchanged until
// Backward.
func (l *RowParallelLinear) Forward(inp *tensor.Tensor) (*tensor.Tensor, error) {
	want := l.In
	if l.opt.InputIsParallel {
		want = l.LocalIn()
	}
	b, t, err := batchShape(l.Name, inp, want)
	if err != nil {
		return nil, err
	}
	dev := l.Weight.Data.Device()
	if l.sp != nil {
		return l.forwardSP(inp, b, t)
	}
	scatter := !l.opt.InputIsParallel && l.g.Size() > 1
	if err := l.ensure(dev, b, t); err != nil {
		return nil, err
	}
	out := l.output()
	l.xl = inp
	if scatter {
		if err := l.scatter.Forward(l.xlBuf, inp); err != nil {
			return nil, fmt.Errorf("%s: %w", l.Name, err)
		}
		l.xl = l.xlBuf
	}
	tensor.LinearForward(out, l.xl, l.Weight.Operand(), nil)
	if err := l.gReduce.Forward(out); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	if l.Bias != nil {
		dev.AddBias(out, l.Bias.Data)
	}
	return out, nil
}

// Backward accumulates the parameter gradients and, when dinp is not nil,
// the input gradient (shaped as Forward's input) from dout (B,T,Out). g is
// the identity backward: no communication unless the input was scattered.
func (l *RowParallelLinear) Backward(dout, dinp *tensor.Tensor) error {
	if l.xl == nil {
		return fmt.Errorf("%s: Backward before Forward", l.Name)
	}
	out := l.output()
	if dout.Len() != out.Len() {
		return shapeErr(l.Name, "Backward with dout %v after a Forward to %v", dout, out)
	}
	dout = dout.Reshape(out.Shape()...)
	if l.opt.GradDType == tensor.BFloat16 && dout.DType() == tensor.Float32 {
		dev := dout.Device()
		if err := l.ensureScratch(dev, l.xl.Dim(0), l.xl.Dim(1)); err != nil {
			return err
		}
		dev.Copy(l.doutHalf, dout)
		dout = l.doutHalf
	}
	if l.sp != nil {
		return l.backwardSP(dout, dinp)
	}
	weightGrad(l.Weight, l.Bias, dout, l.xl)
	if dinp == nil {
		return nil
	}
	if l.xlBuf == nil {
		if dinp.Len() != l.xl.Len() {
			return shapeErr(l.Name, "dinp %v for an input %v", dinp, l.xl)
		}
		tensor.MatMul(dinp.Reshape(l.xl.Shape()...), dout, l.Weight.Operand(), false, false, 1, 1)
		return nil
	}
	if err := l.ensureScratch(dinp.Device(), l.xl.Dim(0), l.xl.Dim(1)); err != nil {
		return err
	}
	tensor.MatMul(l.dxl, dout, l.Weight.Operand(), false, false, 1, 0)
	if err := l.scatter.Backward(dinp, l.dxl); err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	return nil
}

// forwardSP is Forward under sequence parallelism: the partial products
// of the full sequence are reduce-scattered (ḡ) into this rank's
// (B,T/tp,Out) positions, then the bias is added.
func (l *RowParallelLinear) forwardSP(inp *tensor.Tensor, b, t int) (*tensor.Tensor, error) {
	dev := l.Weight.Data.Device()
	if _, err := l.sp.LocalSeq(l.Name, t); err != nil {
		return nil, err
	}
	if err := l.ensure(dev, b, t); err != nil {
		return nil, err
	}
	out := l.output()
	l.xl = inp
	full, err := l.sp.Full(dev, b, t, l.Out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	tensor.LinearForward(full, inp, l.Weight.Operand(), nil)
	if err := l.sp.ReduceScatter(out, full, false); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Name, err)
	}
	if l.Bias != nil {
		dev.AddBias(out, l.Bias.Data)
	}
	return out, nil
}

// backwardSP is Backward under sequence parallelism: the output gradient
// of this rank's positions is all-gathered (ḡ's backward), then the
// gradients are those of the full sequence (the bias's included, so it
// needs no reduction).
func (l *RowParallelLinear) backwardSP(dout, dinp *tensor.Tensor) error {
	full, err := l.sp.Gather(dout)
	if err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	weightGrad(l.Weight, l.Bias, full, l.xl)
	if dinp == nil {
		return nil
	}
	if dinp.Len() != l.xl.Len() {
		return shapeErr(l.Name, "dinp %v for an input %v", dinp, l.xl)
	}
	tensor.MatMul(dinp.Reshape(l.xl.Shape()...), full, l.Weight.Operand(), false, false, 1, 1)
	return nil
}

// weightGrad accumulates the parameter gradients of out = inp @ w^T + b:
// dw += dout^T @ inp, db += column sums of dout. dout is (N,Out), inp is
// (N,In). The GEMM overwrites a gradient MarkGradsStale left stale.
func weightGrad(w, b *Param, dout, inp *tensor.Tensor) {
	tensor.MatMul(w.Grad, dout, inp, true, false, 1, w.gradBeta())
	if b != nil {
		dout.Device().BiasBackward(b.grad(), dout)
	}
}
