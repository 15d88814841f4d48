package train

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// model is what the training loop drives: one rank's shard of a network
// with an explicit forward and backward pass.
type model interface {
	// Params are this rank's trainable tensors.
	Params() []*Param
	// ZeroGrad starts a new accumulation: the next Backward overwrites the
	// gradients instead of adding to them.
	ZeroGrad()
	// Forward runs b (of the configured batch size) and returns its mean
	// loss. With train set it keeps what Backward needs.
	Forward(b *Batch, train bool) (float64, error)
	// Backward accumulates the gradients of scale * the last Forward's loss.
	Backward(scale float32) error
	// Predictions are the classes the last Forward chose (nil for an LM).
	Predictions() []int32
	// Close frees the model's device memory.
	Close()
}

// Constants of the architecture.
const (
	lnEps       = 1e-5
	initStd     = 0.02
	posInitStd  = 0.01
	maskedLogit = -1e30 // logit of a padding id: exp underflows to 0
	numClasses  = 2
)

// transformer is the network of both models, GPT-2's layout: token and
// learned position embeddings, pre-LN blocks (attention then MLP, each with a
// residual), a final layer norm, then either the LM head tied to the token
// embedding (gpt) or a two-layer classifier over the mean of the
// non-padding tokens (bert, bidirectional attention with a padding mask).
//
// Tensor parallelism is Megatron-LM's: the token embedding and LM head are
// split over the vocabulary; QKV and the first MLP layer are column-parallel
// (heads/tp heads per rank), the attention output and second MLP layer
// row-parallel and followed by an all-reduce; layer norms and the biases
// added after an all-reduce are replicated.
type transformer struct {
	dev  tensor.Device
	tp   nccl.Comm
	gpt  bool
	ps   *paramSet
	pred []int32

	B, T, C, L     int
	nh, hs         int // local heads, head size
	Cl, FFl, Hl    int // local attention width, MLP width, classifier hidden width
	V, Vp, Vl, v0  int // vocabulary: real, padded, local slice, slice start
	validLocal     int // ids of the local slice below V
	ids, targets   []int32
	labels         []int32
	keyValid       []int32
	stage          []float32 // host staging for all-reduces on non-CPU devices
	lossHost       []float32
	acts           *acts
	layers         []layerParams
	wte, wpe       *Param
	lnfw, lnfb     *Param
	cw1, cb1       *Param
	cw2, cb2       *Param
	allocated      []*tensor.Tensor
	lastLossCount  int
	forwardedTrain bool
	// fresh is set by ZeroGrad: the next Backward writes the GEMM-computed
	// weight gradients with beta 0 instead of accumulating into zeroed
	// ones, which saves a pass over most of the gradient memory. zeroed
	// lists the other gradients, which ZeroGrad clears.
	fresh  bool
	zeroed []*Param
}

// layerParams are the parameters of one block.
type layerParams struct {
	ln1w, ln1b, qkvw, qkvb, projw, projb   *Param
	ln2w, ln2b, fcw, fcb, fcprojw, fcprojb *Param
}

// layerActs are what one block keeps from its forward pass for the backward.
type layerActs struct {
	ln1, ln1Mean, ln1Rstd *tensor.Tensor // (N,C) (N) (N)
	qkv                   *tensor.Tensor // (N,3Cl)
	att                   *tensor.Tensor // (B,nh,T,T) after softmax
	atty                  *tensor.Tensor // (N,Cl)
	resid2                *tensor.Tensor // (N,C)
	ln2, ln2Mean, ln2Rstd *tensor.Tensor
	fch, fchGelu          *tensor.Tensor // (N,FFl)
	resid3                *tensor.Tensor // (N,C) the block's output
}

// acts are the activations and the backward pass's scratch.
type acts struct {
	x0      *tensor.Tensor // (N,C) embeddings
	layer   []layerActs
	lnf     *tensor.Tensor // (N,C)
	lnfMean *tensor.Tensor // (N)
	lnfRstd *tensor.Tensor // (N)
	logits  *tensor.Tensor // (N,Vl) gpt; (B,2) bert
	rowMax  *tensor.Tensor // rows of logits
	sumExp  *tensor.Tensor
	tlogit  *tensor.Tensor
	losses  *tensor.Tensor
	// bert head
	pool, pooled, h1, h1g *tensor.Tensor // (B,N) (B,C) (B,Hl) (B,Hl)
	// scratch for the backward pass
	dresid, dln, tmp   *tensor.Tensor // (N,C)
	dqkv               *tensor.Tensor // (N,3Cl)
	datt, dpreatt      *tensor.Tensor // (B,nh,T,T)
	datty              *tensor.Tensor // (N,Cl)
	dfch, dfchGelu     *tensor.Tensor // (N,FFl)
	dlogits            *tensor.Tensor
	dpooled, dh1, dh1g *tensor.Tensor
}

// newModel builds this rank's shard of the config's model, initialised from
// the full model of the config's seed.
func newModel(cfg Config, data *Data, m *mesh, dev tensor.Device) (model, error) {
	Vp, err := parallel.PadVocab(data.Vocab, cfg.TP)
	if err != nil {
		return nil, err
	}
	tp := m.tpSize
	t := &transformer{
		dev: dev, tp: m.tp, gpt: cfg.Model == "gpt",
		B: cfg.BatchSize, T: cfg.Seq, C: cfg.Dim, L: cfg.Layers,
		nh: cfg.Heads / tp, hs: cfg.Dim / cfg.Heads,
		Cl: cfg.Dim / tp, FFl: 4 * cfg.Dim / tp, Hl: cfg.Dim / tp,
		V: data.Vocab, Vp: Vp, Vl: Vp / tp,
	}
	t.v0 = m.tpRank * t.Vl
	t.validLocal = min(max(t.V-t.v0, 0), t.Vl)
	if t.ps, err = newParamSet(dev, uint64(cfg.Seed), modelSpecs(cfg, Vp, tp, m.tpRank)); err != nil {
		return nil, err
	}
	t.bindParams()
	if err := t.allocActs(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// modelSpecs is the parameter table of the model: full shapes, shards and
// initialisation (GPT-2's: N(0,0.02), residual projections scaled by
// 1/sqrt(2L), positions N(0,0.01), layer norms 1 and 0, biases 0).
func modelSpecs(cfg Config, Vp, tp, tpRank int) []paramSpec {
	C, L := cfg.Dim, cfg.Layers
	rep := parallel.Shard{Parts: 1}
	col := parallel.Shard{Dim: 0, Parts: tp, Index: tpRank}
	qkv := parallel.Shard{Dim: 0, Parts: tp, Index: tpRank, Blocks: 3}
	row := parallel.Shard{Dim: 1, Parts: tp, Index: tpRank}
	projStd := float32(initStd / math.Sqrt(2*float64(L)))
	specs := []paramSpec{
		{name: "wte", full: []int{Vp, C}, shard: col, init: parallel.InitNormal, std: initStd, decay: true},
		{name: "wpe", full: []int{cfg.Seq, C}, shard: rep, init: parallel.InitNormal, std: posInitStd, decay: true},
	}
	for l := 0; l < L; l++ {
		p := fmt.Sprintf("h.%d.", l)
		specs = append(specs,
			paramSpec{name: p + "ln_1.weight", full: []int{C}, shard: rep, init: parallel.InitOnes},
			paramSpec{name: p + "ln_1.bias", full: []int{C}, shard: rep, init: parallel.InitZeros},
			paramSpec{name: p + "attn.c_attn.weight", full: []int{3 * C, C}, shard: qkv, init: parallel.InitNormal, std: initStd, decay: true},
			paramSpec{name: p + "attn.c_attn.bias", full: []int{3 * C}, shard: qkv, init: parallel.InitZeros},
			paramSpec{name: p + "attn.c_proj.weight", full: []int{C, C}, shard: row, init: parallel.InitNormal, std: projStd, decay: true},
			paramSpec{name: p + "attn.c_proj.bias", full: []int{C}, shard: rep, init: parallel.InitZeros},
			paramSpec{name: p + "ln_2.weight", full: []int{C}, shard: rep, init: parallel.InitOnes},
			paramSpec{name: p + "ln_2.bias", full: []int{C}, shard: rep, init: parallel.InitZeros},
			paramSpec{name: p + "mlp.c_fc.weight", full: []int{4 * C, C}, shard: col, init: parallel.InitNormal, std: initStd, decay: true},
			paramSpec{name: p + "mlp.c_fc.bias", full: []int{4 * C}, shard: col, init: parallel.InitZeros},
			paramSpec{name: p + "mlp.c_proj.weight", full: []int{C, 4 * C}, shard: row, init: parallel.InitNormal, std: projStd, decay: true},
			paramSpec{name: p + "mlp.c_proj.bias", full: []int{C}, shard: rep, init: parallel.InitZeros},
		)
	}
	specs = append(specs,
		paramSpec{name: "ln_f.weight", full: []int{C}, shard: rep, init: parallel.InitOnes},
		paramSpec{name: "ln_f.bias", full: []int{C}, shard: rep, init: parallel.InitZeros},
	)
	if cfg.Model == "bert" {
		specs = append(specs,
			paramSpec{name: "cls.fc1.weight", full: []int{C, C}, shard: col, init: parallel.InitNormal, std: initStd, decay: true},
			paramSpec{name: "cls.fc1.bias", full: []int{C}, shard: col, init: parallel.InitZeros},
			paramSpec{name: "cls.fc2.weight", full: []int{numClasses, C}, shard: row, init: parallel.InitNormal, std: initStd, decay: true},
			paramSpec{name: "cls.fc2.bias", full: []int{numClasses}, shard: rep, init: parallel.InitZeros},
		)
	}
	return specs
}

// ParamCount is the number of parameters of the whole model (all shards),
// with the vocabulary padded for the config's tp.
func ParamCount(cfg Config, vocab int) int64 {
	Vp, err := parallel.PadVocab(vocab, max(cfg.TP, 1))
	if err != nil {
		return 0
	}
	var n int64
	for _, s := range modelSpecs(cfg, Vp, 1, 0) {
		n += int64(prod(s.full))
	}
	return n
}

// FlopsPerToken is the training FLOPs per token of the whole model, forward
// and backward: 6 per parameter plus attention's 12*layers*seq*dim.
func FlopsPerToken(cfg Config, vocab int) float64 {
	return 6*float64(ParamCount(cfg, vocab)) + 12*float64(cfg.Layers*cfg.Seq*cfg.Dim)
}

func (t *transformer) bindParams() {
	ps := t.ps
	t.wte, t.wpe = ps.get("wte"), ps.get("wpe")
	t.lnfw, t.lnfb = ps.get("ln_f.weight"), ps.get("ln_f.bias")
	for l := 0; l < t.L; l++ {
		p := fmt.Sprintf("h.%d.", l)
		t.layers = append(t.layers, layerParams{
			ln1w: ps.get(p + "ln_1.weight"), ln1b: ps.get(p + "ln_1.bias"),
			qkvw: ps.get(p + "attn.c_attn.weight"), qkvb: ps.get(p + "attn.c_attn.bias"),
			projw: ps.get(p + "attn.c_proj.weight"), projb: ps.get(p + "attn.c_proj.bias"),
			ln2w: ps.get(p + "ln_2.weight"), ln2b: ps.get(p + "ln_2.bias"),
			fcw: ps.get(p + "mlp.c_fc.weight"), fcb: ps.get(p + "mlp.c_fc.bias"),
			fcprojw: ps.get(p + "mlp.c_proj.weight"), fcprojb: ps.get(p + "mlp.c_proj.bias"),
		})
	}
	if !t.gpt {
		t.cw1, t.cb1 = ps.get("cls.fc1.weight"), ps.get("cls.fc1.bias")
		t.cw2, t.cb2 = ps.get("cls.fc2.weight"), ps.get("cls.fc2.bias")
	}
	gemmWritten := map[*Param]bool{t.cw1: true, t.cw2: true}
	if t.gpt {
		gemmWritten[t.wte] = true // the tied head's GEMM runs first in the backward
	}
	for _, lp := range t.layers {
		for _, p := range []*Param{lp.qkvw, lp.projw, lp.fcw, lp.fcprojw} {
			gemmWritten[p] = true
		}
	}
	for _, p := range ps.params {
		if !gemmWritten[p] {
			t.zeroed = append(t.zeroed, p)
		}
	}
}

func (t *transformer) allocActs() error {
	B, T, C, N := t.B, t.T, t.C, t.B*t.T
	var err error
	alloc := func(shape ...int) *tensor.Tensor {
		if err != nil {
			return nil
		}
		var x *tensor.Tensor
		x, err = t.dev.Alloc(shape...)
		if err == nil {
			t.allocated = append(t.allocated, x)
		}
		return x
	}
	a := &acts{x0: alloc(N, C)}
	for l := 0; l < t.L; l++ {
		a.layer = append(a.layer, layerActs{
			ln1: alloc(N, C), ln1Mean: alloc(N), ln1Rstd: alloc(N),
			qkv: alloc(N, 3*t.Cl), att: alloc(B, t.nh, T, T), atty: alloc(N, t.Cl),
			resid2: alloc(N, C), ln2: alloc(N, C), ln2Mean: alloc(N), ln2Rstd: alloc(N),
			fch: alloc(N, t.FFl), fchGelu: alloc(N, t.FFl), resid3: alloc(N, C),
		})
	}
	a.lnf, a.lnfMean, a.lnfRstd = alloc(N, C), alloc(N), alloc(N)
	rows, cols := N, t.Vl
	if !t.gpt {
		rows, cols = B, numClasses
		a.pool, a.pooled, a.h1, a.h1g = alloc(B, N), alloc(B, C), alloc(B, t.Hl), alloc(B, t.Hl)
		a.dpooled, a.dh1, a.dh1g = alloc(B, C), alloc(B, t.Hl), alloc(B, t.Hl)
	}
	a.logits, a.dlogits = alloc(rows, cols), alloc(rows, cols)
	a.rowMax, a.sumExp, a.tlogit, a.losses = alloc(rows), alloc(rows), alloc(rows), alloc(rows)
	a.dresid, a.dln, a.tmp = alloc(N, C), alloc(N, C), alloc(N, C)
	a.dqkv, a.datty = alloc(N, 3*t.Cl), alloc(N, t.Cl)
	a.datt, a.dpreatt = alloc(B, t.nh, T, T), alloc(B, t.nh, T, T)
	a.dfch, a.dfchGelu = alloc(N, t.FFl), alloc(N, t.FFl)
	if err != nil {
		return fmt.Errorf("activations for batch %d x seq %d: %w", B, T, err)
	}
	t.acts = a
	if t.tp.Size() > 1 && t.ps.W.Buffer().Host() == nil {
		t.stage = make([]float32, max(N*C, N, B*numClasses))
	}
	t.lossHost = make([]float32, rows)
	t.pred = make([]int32, B)
	return nil
}

// Params implements model.
func (t *transformer) Params() []*Param { return t.ps.params }

// ZeroGrad implements model.
func (t *transformer) ZeroGrad() {
	for _, p := range t.zeroed {
		t.dev.Zero(p.G)
	}
	t.fresh = true
}

// gradBeta is the GEMM beta for a weight gradient: 0 to overwrite on the
// first backward after ZeroGrad, 1 to accumulate.
func (t *transformer) gradBeta() float32 {
	if t.fresh {
		return 0
	}
	return 1
}

// Predictions implements model.
func (t *transformer) Predictions() []int32 {
	if t.gpt {
		return nil
	}
	return t.pred
}

// Close implements model.
func (t *transformer) Close() {
	for _, x := range t.allocated {
		t.dev.Free(x)
	}
	t.allocated = nil
	if t.ps != nil {
		t.dev.Free(t.ps.W)
		t.dev.Free(t.ps.G)
	}
}

// reduce is the all-reduce (sum) over the TP group.
func (t *transformer) reduce(x *tensor.Tensor) error {
	return allReduce(t.dev, t.tp, x, nccl.Sum, t.stage)
}

// linear is out = inp @ w^T (+ bias). inp is (N,IC), w is (OC,IC), out is (N,OC).
func (t *transformer) linear(out, inp *tensor.Tensor, w, bias *Param) {
	n, ic, oc := inp.Rows(), inp.Cols(), out.Cols()
	t.dev.Gemm(false, true, n, oc, ic, 1, inp, 0, ic, w.W, 0, ic, 0, out, 0, oc)
	if bias != nil {
		t.dev.AddBias(out, bias.W)
	}
}

// linearBackward accumulates dw (and dbias) and sets dinp (when not nil) for
// out = inp @ w^T + bias.
func (t *transformer) linearBackward(dinp, dout, inp *tensor.Tensor, w, bias *Param) {
	n, ic, oc := inp.Rows(), inp.Cols(), dout.Cols()
	if bias != nil {
		t.dev.BiasBackward(bias.G, dout)
	}
	t.dev.Gemm(true, false, oc, ic, n, 1, dout, 0, oc, inp, 0, ic, t.gradBeta(), w.G, 0, ic)
	if dinp != nil {
		t.dev.Gemm(false, false, n, ic, oc, 1, dout, 0, oc, w.W, 0, ic, 0, dinp, 0, ic)
	}
}

// Forward implements model.
func (t *transformer) Forward(b *Batch, train bool) (float64, error) {
	if b.B != t.B || b.T != t.T {
		return 0, fmt.Errorf("batch is %dx%d, the model was built for %dx%d", b.B, b.T, t.B, t.T)
	}
	a := t.acts
	t.ids = append(t.ids[:0], b.Tokens...)
	for _, id := range t.ids {
		if id < 0 || int(id) >= t.V {
			return 0, fmt.Errorf("token id %d is outside the vocabulary of %d", id, t.V)
		}
	}
	if t.gpt {
		t.targets = append(t.targets[:0], b.Targets...)
		t.keyValid = nil
	} else {
		t.labels = append(t.labels[:0], b.Labels...)
		t.keyValid = t.keyValid[:0]
		for i := 0; i < t.B; i++ {
			for j := 0; j < t.T; j++ {
				v := int32(0)
				if j < int(b.Lengths[i]) {
					v = 1
				}
				t.keyValid = append(t.keyValid, v)
			}
		}
	}
	// Embeddings: vocab-parallel lookup, all-reduce, then positions.
	t.dev.EmbeddingForward(a.x0, t.ids, t.wte.W, t.v0)
	if err := t.reduce(a.x0); err != nil {
		return 0, err
	}
	TC := t.T * t.C
	for i := 0; i < t.B; i++ {
		row := a.x0.View(i*TC, t.T, t.C)
		t.dev.Add(row, row, t.wpe.W)
	}
	x := a.x0
	for l := range t.layers {
		if err := t.blockForward(l, x); err != nil {
			return 0, err
		}
		x = a.layer[l].resid3
	}
	t.dev.LayerNormForward(a.lnf, a.lnfMean, a.lnfRstd, x, t.lnfw.W, t.lnfb.W, lnEps)
	t.forwardedTrain = train
	if t.gpt {
		return t.lmHeadForward()
	}
	return t.classifierForward(b)
}

// blockForward runs block l on x (N,C) into the block's resid3.
func (t *transformer) blockForward(l int, x *tensor.Tensor) error {
	p, la, a := &t.layers[l], &t.acts.layer[l], t.acts
	d := t.dev
	d.LayerNormForward(la.ln1, la.ln1Mean, la.ln1Rstd, x, p.ln1w.W, p.ln1b.W, lnEps)
	t.linear(la.qkv, la.ln1, p.qkvw, p.qkvb)
	t.attentionForward(la)
	t.linear(a.tmp, la.atty, p.projw, nil)
	if err := t.reduce(a.tmp); err != nil {
		return err
	}
	d.AddBias(a.tmp, p.projb.W)
	d.Add(la.resid2, x, a.tmp)
	d.LayerNormForward(la.ln2, la.ln2Mean, la.ln2Rstd, la.resid2, p.ln2w.W, p.ln2b.W, lnEps)
	t.linear(la.fch, la.ln2, p.fcw, p.fcb)
	d.GELUForward(la.fchGelu, la.fch)
	t.linear(a.tmp, la.fchGelu, p.fcprojw, nil)
	if err := t.reduce(a.tmp); err != nil {
		return err
	}
	d.AddBias(a.tmp, p.fcprojb.W)
	d.Add(la.resid3, la.resid2, a.tmp)
	return nil
}

// attentionForward computes la.atty (N,Cl) from la.qkv (N,3Cl) for this
// rank's heads; la.att keeps the (B,nh,T,T) probabilities. Each GEMM batches
// over the B sequences for one head.
func (t *transformer) attentionForward(la *layerActs) {
	T, hs, Cl, nh, B := t.T, t.hs, t.Cl, t.nh, t.B
	ld, sQKV, sAtt := 3*Cl, T*3*Cl, nh*T*T
	for h := 0; h < nh; h++ {
		// preatt = q k^T, (T,T) per sequence
		t.dev.GemmStridedBatched(false, true, T, T, hs, 1,
			la.qkv, h*hs, ld, sQKV, la.qkv, Cl+h*hs, ld, sQKV, 0, la.att, h*T*T, T, sAtt, B)
	}
	t.dev.SoftmaxForward(la.att, la.att, float32(1/math.Sqrt(float64(hs))), t.gpt, t.keyValid)
	for h := 0; h < nh; h++ {
		// y = att v, (T,hs) per sequence
		t.dev.GemmStridedBatched(false, false, T, hs, T, 1,
			la.att, h*T*T, T, sAtt, la.qkv, 2*Cl+h*hs, ld, sQKV, 0, la.atty, h*hs, Cl, T*Cl, B)
	}
}

// attentionBackward accumulates a.dqkv from a.datty.
func (t *transformer) attentionBackward(la *layerActs) {
	a := t.acts
	T, hs, Cl, nh, B := t.T, t.hs, t.Cl, t.nh, t.B
	ld, sQKV, sAtt := 3*Cl, T*3*Cl, nh*T*T
	for h := 0; h < nh; h++ {
		// datt = dy v^T; dv += att^T dy
		t.dev.GemmStridedBatched(false, true, T, T, hs, 1,
			a.datty, h*hs, Cl, T*Cl, la.qkv, 2*Cl+h*hs, ld, sQKV, 0, a.datt, h*T*T, T, sAtt, B)
		t.dev.GemmStridedBatched(true, false, T, hs, T, 1,
			la.att, h*T*T, T, sAtt, a.datty, h*hs, Cl, T*Cl, 1, a.dqkv, 2*Cl+h*hs, ld, sQKV, B)
	}
	t.dev.Zero(a.dpreatt)
	t.dev.SoftmaxBackward(a.dpreatt, a.datt, la.att, float32(1/math.Sqrt(float64(hs))))
	for h := 0; h < nh; h++ {
		// dq += dpreatt k; dk += dpreatt^T q
		t.dev.GemmStridedBatched(false, false, T, hs, T, 1,
			a.dpreatt, h*T*T, T, sAtt, la.qkv, Cl+h*hs, ld, sQKV, 1, a.dqkv, h*hs, ld, sQKV, B)
		t.dev.GemmStridedBatched(true, false, T, hs, T, 1,
			a.dpreatt, h*T*T, T, sAtt, la.qkv, h*hs, ld, sQKV, 1, a.dqkv, Cl+h*hs, ld, sQKV, B)
	}
}

// lmHeadForward is the tied, vocab-parallel LM head and cross-entropy: the
// row max is all-reduced with MAX, the sum of exponentials and the target
// logit with SUM. Padding ids get a logit that contributes nothing.
func (t *transformer) lmHeadForward() (float64, error) {
	a, d := t.acts, t.dev
	N := t.B * t.T
	d.Gemm(false, true, N, t.Vl, t.C, 1, a.lnf, 0, t.C, t.wte.W, 0, t.C, 0, a.logits, 0, t.Vl)
	if pad := t.Vl - t.validLocal; pad > 0 {
		for i := 0; i < N; i++ {
			d.Fill(a.logits.View(i*t.Vl+t.validLocal, pad), maskedLogit)
		}
	}
	d.CrossEntropyRowMax(a.rowMax, a.logits)
	if err := allReduce(d, t.tp, a.rowMax, nccl.Max, t.stage); err != nil {
		return 0, err
	}
	d.CrossEntropySumExp(a.sumExp, a.logits, a.rowMax)
	d.CrossEntropyTargetLogit(a.tlogit, a.logits, t.targets, t.v0)
	if err := t.reduce(a.sumExp); err != nil {
		return 0, err
	}
	if err := t.reduce(a.tlogit); err != nil {
		return 0, err
	}
	d.CrossEntropyLoss(a.losses, a.rowMax, a.sumExp, a.tlogit, t.targets)
	return t.meanLoss(N), nil
}

func (t *transformer) meanLoss(n int) float64 {
	t.dev.CopyToHost(t.lossHost, t.acts.losses)
	sum := 0.0
	for _, v := range t.lossHost[:n] {
		sum += float64(v)
	}
	t.lastLossCount = n
	return sum / float64(n)
}

// classifierForward pools the final hidden states over each sequence's
// tokens (a (B,N) averaging matrix times (N,C)), then runs the two-layer
// head: column-parallel fc1 and GELU, row-parallel fc2 and an all-reduce.
func (t *transformer) classifierForward(b *Batch) (float64, error) {
	a, d := t.acts, t.dev
	N := t.B * t.T
	pool := make([]float32, t.B*N)
	for i := 0; i < t.B; i++ {
		n := int(b.Lengths[i])
		for j := 0; j < n; j++ {
			pool[i*N+i*t.T+j] = 1 / float32(n)
		}
	}
	d.CopyFromHost(a.pool, pool)
	d.Gemm(false, false, t.B, t.C, N, 1, a.pool, 0, N, a.lnf, 0, t.C, 0, a.pooled, 0, t.C)
	t.linear(a.h1, a.pooled, t.cw1, t.cb1)
	d.GELUForward(a.h1g, a.h1)
	t.linear(a.logits, a.h1g, t.cw2, nil)
	if err := t.reduce(a.logits); err != nil {
		return 0, err
	}
	d.AddBias(a.logits, t.cb2.W)
	d.CrossEntropyRowMax(a.rowMax, a.logits)
	d.CrossEntropySumExp(a.sumExp, a.logits, a.rowMax)
	d.CrossEntropyTargetLogit(a.tlogit, a.logits, t.labels, 0)
	d.CrossEntropyLoss(a.losses, a.rowMax, a.sumExp, a.tlogit, t.labels)
	logits := make([]float32, t.B*numClasses)
	d.CopyToHost(logits, a.logits)
	for i := range t.pred {
		t.pred[i] = 0
		if logits[i*numClasses+1] > logits[i*numClasses] {
			t.pred[i] = 1
		}
	}
	return t.meanLoss(t.B), nil
}

// Backward implements model.
func (t *transformer) Backward(scale float32) error {
	if !t.forwardedTrain {
		return fmt.Errorf("backward without a training forward pass")
	}
	a, d := t.acts, t.dev
	d.Zero(a.dlogits)
	d.Zero(a.dresid)
	dloss := scale / float32(t.lastLossCount)
	if t.gpt {
		N := t.B * t.T
		d.CrossEntropyBackward(a.dlogits, a.logits, a.rowMax, a.sumExp, t.targets, t.v0, dloss)
		// Tied head: dwte += dlogits^T lnf; dlnf = dlogits wte, all-reduced.
		d.Gemm(true, false, t.Vl, t.C, N, 1, a.dlogits, 0, t.Vl, a.lnf, 0, t.C, t.gradBeta(), t.wte.G, 0, t.C)
		d.Gemm(false, false, N, t.C, t.Vl, 1, a.dlogits, 0, t.Vl, t.wte.W, 0, t.C, 0, a.dln, 0, t.C)
	} else {
		d.CrossEntropyBackward(a.dlogits, a.logits, a.rowMax, a.sumExp, t.labels, 0, dloss)
		t.linearBackward(a.dh1g, a.dlogits, a.h1g, t.cw2, t.cb2)
		d.Zero(a.dh1)
		d.GELUBackward(a.dh1, a.h1, a.dh1g)
		t.linearBackward(a.dpooled, a.dh1, a.pooled, t.cw1, t.cb1)
		if err := t.reduce(a.dpooled); err != nil {
			return err
		}
		N := t.B * t.T
		d.Gemm(true, false, N, t.C, t.B, 1, a.pool, 0, N, a.dpooled, 0, t.C, 0, a.dln, 0, t.C)
	}
	if t.gpt {
		if err := t.reduce(a.dln); err != nil {
			return err
		}
	}
	x := a.x0
	if t.L > 0 {
		x = a.layer[t.L-1].resid3
	}
	d.LayerNormBackward(a.dresid, t.lnfw.G, t.lnfb.G, a.dln, x, t.lnfw.W, a.lnfMean, a.lnfRstd)
	for l := t.L - 1; l >= 0; l-- {
		in := a.x0
		if l > 0 {
			in = a.layer[l-1].resid3
		}
		if err := t.blockBackward(l, in); err != nil {
			return err
		}
	}
	// Positions and the vocab-parallel embedding.
	TC := t.T * t.C
	for i := 0; i < t.B; i++ {
		d.Axpy(t.wpe.G, 1, a.dresid.View(i*TC, t.T, t.C))
	}
	d.EmbeddingBackward(t.wte.G, a.dresid, t.ids, t.v0)
	t.fresh = false
	return nil
}

// blockBackward turns a.dresid from the gradient of block l's output into
// the gradient of its input x, accumulating the block's parameter gradients.
func (t *transformer) blockBackward(l int, x *tensor.Tensor) error {
	p, la, a, d := &t.layers[l], &t.acts.layer[l], t.acts, t.dev
	// MLP: resid3 = resid2 + fcproj(gelu(fc(ln2(resid2)))).
	t.linearBackward(a.dfchGelu, a.dresid, la.fchGelu, p.fcprojw, p.fcprojb)
	d.Zero(a.dfch)
	d.GELUBackward(a.dfch, la.fch, a.dfchGelu)
	t.linearBackward(a.dln, a.dfch, la.ln2, p.fcw, p.fcb)
	if err := t.reduce(a.dln); err != nil {
		return err
	}
	d.LayerNormBackward(a.dresid, p.ln2w.G, p.ln2b.G, a.dln, la.resid2, p.ln2w.W, la.ln2Mean, la.ln2Rstd)
	// Attention: resid2 = x + proj(attn(qkv(ln1(x)))).
	t.linearBackward(a.datty, a.dresid, la.atty, p.projw, p.projb)
	d.Zero(a.dqkv)
	t.attentionBackward(la)
	t.linearBackward(a.dln, a.dqkv, la.ln1, p.qkvw, p.qkvb)
	if err := t.reduce(a.dln); err != nil {
		return err
	}
	d.LayerNormBackward(a.dresid, p.ln1w.G, p.ln1b.G, a.dln, x, p.ln1w.W, la.ln1Mean, la.ln1Rstd)
	return nil
}
