package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/spec"
)

// bertLayer is one post-LN encoder layer of BERT: h1 = LN1(x + attn(x)),
// out = LN2(h1 + mlp(h1)).
type bertLayer struct {
	attn   *parallel.ParallelSelfAttention
	ln1    *parallel.LayerNorm
	mlp    *parallel.ParallelMLP
	ln2    *parallel.LayerNorm
	r1, r2 *tensor.Tensor // (B,T,C) the residual sums, LN1's and LN2's inputs
}

// hfBERT is the classifier of arch "hf", laid out as Hugging Face's
// BertForSequenceClassification so that its weights load and export:
// word (vocab-parallel), position and token type embeddings summed and
// layer-normed, post-LN layers (attention and MLP tensor-parallel as in
// GPT), a tanh pooler over the [CLS] token (column-parallel) and a
// row-parallel classifier over the 2 classes. Layer norms use BERT's 1e-12.
type hfBERT struct {
	dev     tensor.Device
	B, T, C int

	wte    *parallel.VocabParallelEmbedding
	wpe    *parallel.PositionEmbedding
	tte    *parallel.PositionEmbedding // its weight only: row 0 is added to every token
	lnE    *parallel.LayerNorm
	layers []*bertLayer
	pooler *parallel.ColumnParallelLinear
	cls    *parallel.RowParallelLinear
	loss   *parallel.VocabParallelCrossEntropy
	params []*parallel.Param
	set    *parallel.ParamSet // params, made from the spec
	fresh  bool               // the token type gradient is stale (MarkGradsStale)

	keyValid, labels []int32
	forwardedTrain   bool

	allocated            []*tensor.Tensor
	ones                 *tensor.Tensor // (B*T, 1)
	sel                  *tensor.Tensor // (B, B*T) picks each sequence's [CLS]
	first, dfirst        *tensor.Tensor // (B,1,C)
	pre                  *tensor.Tensor // (B,1,C/tp) the pooler's output (its saved buffer), tanh's input
	pooled, dpooled      *tensor.Tensor // (B,1,C/tp) tanh of the pooler
	dpre                 *tensor.Tensor // (B,1,C/tp)
	dlogits              *tensor.Tensor // (B,1,2)
	dx, dy, dr, dh, demb *tensor.Tensor // (B,T,C)
	logitsHost           []float32
	pred                 []int32
}

func newBERT(cfg config.Config, vocab int, tp nccl.Comm, dev tensor.Device) (model, error) {
	m := &hfBERT{dev: dev, B: cfg.BatchSize, T: cfg.Seq, C: cfg.Dim}
	c := cfg
	c.TP = parallel.NewGroup(tp).Size()
	want, err := spec.Params(c, vocab, parallel.NewGroup(tp).Rank(), 0)
	if err != nil {
		return nil, err
	}
	from, err := parallel.NewParamSet(dev, want, uint64(cfg.Seed), parallel.BlockSharding{}, spec.Compute(cfg))
	if err != nil {
		return nil, err
	}
	m.set, m.params = from, from.Params()
	if err = m.build(cfg, vocab, tp, from); err == nil {
		err = spec.Check(m.params, want)
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// build makes the model's layers, which take their parameters from from.
func (m *hfBERT) build(cfg config.Config, vocab int, tp nccl.Comm, from *parallel.ParamSet) error {
	dev, C, seed := m.dev, cfg.Dim, uint64(cfg.Seed)
	var err error
	ln := func(name string) *parallel.LayerNorm {
		if err != nil {
			return nil
		}
		var l *parallel.LayerNorm
		if l, err = parallel.NewLayerNorm(dev, name, C, from); err == nil {
			l.Eps = interop.BERTEps
		}
		return l
	}
	if m.wte, err = parallel.NewVocabParallelEmbedding(dev, tp, "embeddings.word_embeddings", vocab, C, seed, parallel.DefaultStd, from); err != nil {
		return err
	}
	if m.wpe, err = parallel.NewPositionEmbedding(dev, "embeddings.position_embeddings", cfg.PositionRows(), C, seed, parallel.DefaultStd, from); err != nil {
		return err
	}
	if m.tte, err = parallel.NewPositionEmbedding(dev, "embeddings.token_type_embeddings", config.BERTTypes, C, seed, parallel.DefaultStd, from); err != nil {
		return err
	}
	m.lnE = ln("embeddings.LayerNorm")
	fused, _, err := AttentionFused(cfg, dev)
	if err != nil {
		return err
	}
	for l := 0; l < cfg.Layers && err == nil; l++ {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		ly := &bertLayer{}
		if ly.attn, err = parallel.NewParallelSelfAttention(dev, tp, p+"attention", parallel.AttentionConfig{Dim: C, Heads: cfg.Heads, Seed: seed, Fused: fused, Activations: spec.Compute(cfg), From: from}); err != nil {
			return err
		}
		ly.ln1 = ln(p + "attention.output.LayerNorm")
		if ly.mlp, err = parallel.NewParallelMLP(dev, tp, p+"mlp", C, 4*C, seed, parallel.DefaultStd, parallel.DefaultStd, from, spec.Compute(cfg)); err != nil {
			return err
		}
		ly.ln2 = ln(p + "output.LayerNorm")
		if l > 0 { // they run one after the other
			ly.attn.ShareScratch(m.layers[0].attn)
			ly.mlp.ShareScratch(m.layers[0].mlp)
		}
		m.layers = append(m.layers, ly)
	}
	if err != nil {
		return err
	}
	if m.pooler, err = parallel.NewColumnParallelLinear(dev, tp, "pooler.dense", C, C, parallel.LinearOptions{Bias: true, Seed: seed, From: from}); err != nil {
		return err
	}
	if m.cls, err = parallel.NewRowParallelLinear(dev, tp, "classifier", C, config.NumClasses, parallel.LinearOptions{Bias: true, InputIsParallel: true, Seed: seed, From: from}); err != nil {
		return err
	}
	if m.loss, err = parallel.NewVocabParallelCrossEntropy(nil, "cls.loss", config.NumClasses); err != nil {
		return err
	}
	B, T, cl := m.B, m.T, m.pooler.LocalOut()
	alloc := func(shape ...int) *tensor.Tensor {
		if err != nil {
			return nil
		}
		var x *tensor.Tensor
		if x, err = dev.Alloc(shape...); err == nil {
			m.allocated = append(m.allocated, x)
		}
		return x
	}
	for _, ly := range m.layers {
		ly.r1, ly.r2 = alloc(B, T, C), alloc(B, T, C)
	}
	m.ones, m.sel = alloc(B*T, 1), alloc(B, B*T)
	m.first, m.dfirst = alloc(B, 1, C), alloc(B, 1, C)
	m.pooled, m.dpooled, m.dpre = alloc(B, 1, cl), alloc(B, 1, cl), alloc(B, 1, cl)
	m.dlogits = alloc(B, 1, config.NumClasses)
	m.dx, m.dy, m.dr, m.dh, m.demb = alloc(B, T, C), alloc(B, T, C), alloc(B, T, C), alloc(B, T, C), alloc(B, T, C)
	if err != nil {
		return fmt.Errorf("activations for batch %d x seq %d: %w", B, T, err)
	}
	ones := make([]float32, B*T)
	sel := make([]float32, B*B*T)
	for i := range ones {
		ones[i] = 1
	}
	for b := 0; b < B; b++ {
		sel[b*B*T+b*T] = 1
	}
	dev.CopyFromHost(m.ones, ones)
	dev.CopyFromHost(m.sel, sel)
	m.logitsHost = make([]float32, B*config.NumClasses)
	m.pred = make([]int32, B)
	m.keyValid = make([]int32, B*T)
	return nil
}

// Params implements model.
func (m *hfBERT) Params() []*parallel.Param { return m.params }

// ParamSet implements model.
func (m *hfBERT) ParamSet() *parallel.ParamSet { return m.set }

// MarkGradsStale implements model; the token type table's gradient, which
// this model writes itself, is zeroed by the next Backward.
func (m *hfBERT) MarkGradsStale() {
	for _, p := range m.params {
		if p != m.tte.Weight {
			parallel.MarkGradsStale([]*parallel.Param{p})
		}
	}
	m.fresh = true // the token type gradient is written by this model
}

// Predictions implements model.
func (m *hfBERT) Predictions() []int32 { return m.pred }

// Forward implements model.
func (m *hfBERT) Forward(b *data.Batch, train bool) (float64, error) {
	if b.B != m.B || b.T != m.T {
		return 0, fmt.Errorf("batch is %dx%d, the model was built for %dx%d", b.B, b.T, m.B, m.T)
	}
	d, N, C := m.dev, m.B*m.T, m.C
	m.forwardedTrain = false
	m.labels = append(m.labels[:0], b.Labels...)
	for i := 0; i < m.B; i++ {
		for j := 0; j < m.T; j++ {
			m.keyValid[i*m.T+j] = b2i(j < int(b.Lengths[i]))
		}
	}
	x, err := m.wte.Forward(b.Tokens, m.B, m.T)
	if err != nil {
		return 0, err
	}
	if x, err = m.wpe.Forward(x); err != nil {
		return 0, err
	}
	// + token type 0 on every token: ones (N,1) @ row 0 (1,C).
	d.Gemm(false, false, N, C, 1, 1, m.ones, 0, 1, m.tte.Weight.Data, 0, C, 1, x, 0, C)
	if x, err = m.lnE.Forward(x); err != nil {
		return 0, err
	}
	for _, ly := range m.layers {
		a, err := ly.attn.Forward(x, m.keyValid)
		if err != nil {
			return 0, err
		}
		d.Add(ly.r1, x, a)
		h1, err := ly.ln1.Forward(ly.r1)
		if err != nil {
			return 0, err
		}
		f, err := ly.mlp.Forward(h1)
		if err != nil {
			return 0, err
		}
		d.Add(ly.r2, h1, f)
		if x, err = ly.ln2.Forward(ly.r2); err != nil {
			return 0, err
		}
	}
	// The [CLS] rows, the pooler and its tanh.
	d.Gemm(false, false, m.B, C, N, 1, m.sel, 0, N, x, 0, C, 0, m.first, 0, C)
	if m.pre, err = m.pooler.Forward(m.first); err != nil {
		return 0, err
	}
	d.ActivationForward(tensor.Tanh, m.pooled, m.pre)
	logits, err := m.cls.Forward(m.pooled)
	if err != nil {
		return 0, err
	}
	loss, err := m.loss.Forward(logits, m.labels)
	if err != nil {
		return 0, err
	}
	d.CopyToHost(m.logitsHost, logits)
	for i := range m.pred {
		m.pred[i] = b2i(m.logitsHost[i*config.NumClasses+1] > m.logitsHost[i*config.NumClasses])
	}
	m.forwardedTrain = train
	return loss, nil
}

// Backward implements model.
func (m *hfBERT) Backward(scale float32) error {
	if !m.forwardedTrain {
		return fmt.Errorf("backward without a training forward pass")
	}
	d, N, C := m.dev, m.B*m.T, m.C
	d.Zero(m.dlogits)
	if err := m.loss.Backward(m.dlogits, scale); err != nil {
		return err
	}
	d.Zero(m.dpooled)
	if err := m.cls.Backward(m.dlogits, m.dpooled); err != nil {
		return err
	}
	d.Zero(m.dpre)
	d.ActivationBackward(tensor.Tanh, m.dpre, m.pre, m.dpooled)
	d.Zero(m.dfirst)
	if err := m.pooler.Backward(m.dpre, m.dfirst); err != nil {
		return err
	}
	dout, din := m.dx, m.dy                                                       // the gradients of a layer's output and input, ping-pong
	d.Gemm(true, false, N, C, m.B, 1, m.sel, 0, N, m.dfirst, 0, C, 0, dout, 0, C) // (N,C) = sel^T @ dfirst
	for l := len(m.layers) - 1; l >= 0; l-- {
		ly := m.layers[l]
		d.Zero(m.dr) // d r2
		if err := ly.ln2.Backward(dout, m.dr); err != nil {
			return err
		}
		d.Zero(m.dh) // d h1 = d r2 + the MLP's input gradient
		d.Axpy(m.dh, 1, m.dr)
		if err := ly.mlp.Backward(m.dr, m.dh); err != nil {
			return err
		}
		d.Zero(m.dr) // d r1
		if err := ly.ln1.Backward(m.dh, m.dr); err != nil {
			return err
		}
		d.Zero(din) // d x = d r1 + the attention's input gradient
		d.Axpy(din, 1, m.dr)
		if err := ly.attn.Backward(m.dr, din); err != nil {
			return err
		}
		dout, din = din, dout
	}
	dx := dout
	d.Zero(m.demb)
	if err := m.lnE.Backward(dx, m.demb); err != nil {
		return err
	}
	tt := m.tte.Weight.Grad
	if m.fresh {
		d.Zero(tt)
		m.fresh = false
	}
	d.Gemm(true, false, 1, C, N, 1, m.ones, 0, 1, m.demb, 0, C, 1, tt, 0, C) // row 0 += ones^T @ demb
	if err := m.wpe.Backward(m.demb, nil); err != nil {
		return err
	}
	if err := m.wte.Backward(m.demb); err != nil {
		return err
	}
	parallel.ZeroStaleGrads(m.params)
	return nil
}

// Close implements model.
func (m *hfBERT) Close() {
	for _, ly := range m.layers {
		for _, r := range []interface{ Release() }{ly.attn, ly.mlp, ly.ln1, ly.ln2} {
			r.Release()
		}
	}
	if m.wte != nil {
		m.wte.Release()
	}
	if m.wpe != nil {
		m.wpe.Release()
	}
	if m.lnE != nil {
		m.lnE.Release()
	}
	if m.pooler != nil {
		m.pooler.Release()
	}
	if m.cls != nil {
		m.cls.Release()
	}
	if m.loss != nil {
		m.loss.Release()
	}
	for _, x := range m.allocated {
		m.dev.Free(x)
	}
	m.allocated = nil
	if m.set != nil {
		m.set.Free()
		m.set = nil
	}
	m.params = nil
}

// ReduceGrads implements model: without sequence parallelism every
// gradient is complete after Backward.
func (m *hfBERT) ReduceGrads() error { return nil }
