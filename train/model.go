package train

import (
	"fmt"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/spec"
)

// model is what the training loop drives: one rank's shard of a network
// with an explicit forward and backward pass.
type model interface {
	// Params are this rank's trainable tensors.
	Params() []*parallel.Param
	// ParamSet holds them: their values are loaded and read through it
	// (a block's sharded over dp under ZeRO-3).
	ParamSet() *parallel.ParamSet
	// MarkGradsStale starts a new accumulation: the next Backward
	// overwrites the gradients instead of adding to them.
	MarkGradsStale()
	// Forward runs b (of the configured batch size) and returns its mean
	// loss. With train set it keeps what Backward needs.
	Forward(b *data.Batch, train bool) (float64, error)
	// Backward accumulates the gradients of scale * the last Forward's loss.
	Backward(scale float32) error
	// ReduceGrads completes the gradients after the last Backward of a
	// step: under sequence parallelism it sums the layer norms' and the
	// position table's partial gradients over tp (once per step, not per
	// micro-batch, since Backward accumulates into them).
	ReduceGrads() error
	// Predictions are the classes the last Forward chose (nil for an LM).
	Predictions() []int32
	// Close frees the model's device memory.
	Close()
}

// transformer is the network of the three models, GPT-2's layout built
// from the tensor-parallel layers of package parallel: a vocab-parallel
// token embedding and a replicated learned position embedding, pre-LN
// blocks (attention then MLP, each with a residual), a final layer norm,
// then either the LM head tied to the token embedding with the
// vocab-parallel cross-entropy (gpt), or a two-layer classifier over the
// mean of the non-padding tokens (bert: bidirectional attention with a key
// padding mask; fc1 column-parallel, fc2 row-parallel, one all-reduce
// forward and one backward; softmax cross-entropy over the replicated 2
// logits). A Llama (llama) is the language model with no position table
// (its attention rotates queries and keys), parallel.LlamaBlock blocks, a
// final RMSNorm and a head tied to the embedding or its own.
type transformer struct {
	dev   tensor.Device
	gpt   bool // a causal language model: gpt or llama
	llama bool
	tied  bool // the LM head is the token embedding (gpt; llama unless untied_head)
	B, T  int
	C     int

	// A pipeline stage (pp > 1) holds blocks [lo, hi); the first stage
	// the embeddings, the last ln_f, the head and the loss, and under gpt
	// its own copy of wte for the tied head. One stage is both.
	first, last bool
	lo, hi      int

	wte    *parallel.VocabParallelEmbedding // nil on a middle stage, and on the last of bert's and of an untied llama's
	wpe    *parallel.PositionEmbedding      // first stage only; nil for llama
	blocks []block
	lnf    finalNorm
	head   *parallel.ColumnParallelLinear // gpt: tied to wte (llama: or its own); bert: cls.fc1
	fc2    *parallel.RowParallelLinear    // bert
	loss   *parallel.VocabParallelCrossEntropy
	params []*parallel.Param
	set    *parallel.ParamSet // params, made from the spec
	// blockGrads, under ZeRO-2 and 3, takes each block's gradients out of the
	// blocks' shared gradient buffer as its backward ends (shared with
	// the pipeline's stage copies); nil otherwise.
	blockGrads *blockGrads
	// sp is the sequence-parallel region (nil without --sp): the
	// embeddings' output, the blocks' residual stream and ln_f hold this
	// rank's (B,T/tp,C) positions; Tl is T/tp (T without it).
	sp *parallel.SequenceParallel
	// kv is the tensor-parallel ranks that share this rank's key/value
	// heads (a Llama at a tp that is a multiple of its kv heads:
	// parallel.KVReplicas); nil when none do.
	kv *parallel.Group
	Tl int
	// stageAct is the shape of a pipeline stage's input and output
	// (spec.StageActivation).
	stageAct parallel.Buffer
	poolSum  *parallel.Region // bert under sp: sums the pooled partial means over tp

	ids, targets, labels, keyValid []int32
	forwardedTrain                 bool

	allocated []*tensor.Tensor
	dlogits   *tensor.Tensor // bert (B,1,2); an LM's gradient is written over its logits
	dx        *tensor.Tensor // (B,T,C) gradient of the residual stream, which each block turns in place into its input's; stored as the stream (spec.Residual)
	dh        *tensor.Tensor // (B,T,C) gradient of ln_f's output
	// bert head
	pool            *tensor.Tensor // (B, B*T) averaging matrix over each sequence's tokens
	pooled, dpooled *tensor.Tensor // (B,1,C)
	h1, h1g, dh1g   *tensor.Tensor // (B,1,C/tp): fc1's output, GELU of it, its gradient
	dh1             *tensor.Tensor
	poolHost        []float32
	logitsHost      []float32
	pred            []int32
}

// block is a transformer block of either family (parallel.Block,
// parallel.LlamaBlock).
type block interface {
	Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
	BackwardInPlace(d *tensor.Tensor) error
	Params() []*parallel.Param
	Release()
}

// finalNorm is the final normalisation (parallel.LayerNorm, parallel.RMSNorm).
type finalNorm interface {
	Forward(inp *tensor.Tensor) (*tensor.Tensor, error)
	Backward(dout, dinp *tensor.Tensor) error
	Params() []*parallel.Param
	SetSequenceParallel(sp *parallel.SequenceParallel)
	Release()
}

// newModel builds this rank's shard of the config's model, initialised from
// the full model of the config's seed (GPT-2's init: N(0,0.02), residual
// projections scaled by 1/sqrt(2L), positions N(0,0.01), layer norms 1 and
// 0, biases 0).
func newModel(cfg config.Config, ds *data.Data, m *parallel.Mesh, dev tensor.Device) (model, error) {
	if cfg.Arch == "hf" {
		return newBERT(cfg, ds.Vocab, m.TP, dev) // BERT's own layout (bert.go)
	}
	seed := uint64(cfg.Seed)
	t := &transformer{dev: dev, gpt: cfg.LM(), llama: cfg.Model == "llama", B: cfg.BatchSize, T: cfg.Seq, C: cfg.Dim, Tl: cfg.Seq}
	t.tied = t.gpt && !(t.llama && cfg.UntiedHead)
	p, s := m.PPSize(), m.PPRank()
	c := cfg
	c.PP = p
	split, err := c.StageLayers()
	if err != nil {
		return nil, err
	}
	t.first, t.last = s == 0, s == p-1
	for _, n := range split[:s] {
		t.lo += n
	}
	t.hi = t.lo + split[s]
	t.stageAct = spec.StageActivation(cfg)
	c.TP = parallel.NewGroup(m.TP).Size()
	want, err := spec.Params(c, ds.Vocab, parallel.NewGroup(m.TP).Rank(), s)
	if err != nil {
		return nil, err
	}
	var sharding parallel.BlockSharding
	if cfg.Zero >= 2 && m.ZeroShard != nil {
		sharding = parallel.BlockSharding{DP: parallel.NewDeviceGroup(m.ZeroShard, dev), Grads: true, Params: cfg.Zero == 3}
		t.blockGrads = &blockGrads{}
	}
	from, err := parallel.NewParamSet(dev, want, seed, sharding, spec.Compute(cfg))
	if err != nil {
		return nil, err
	}
	t.set, t.params = from, from.Params()
	if t.blockGrads != nil {
		for i, p := range t.params {
			if want[i].Block < 0 {
				t.blockGrads.others = append(t.blockGrads.others, p)
			}
		}
	}
	if err := t.build(cfg, ds.Vocab, m.TP, from); err != nil {
		t.Close()
		return nil, err
	}
	if err := spec.Check(t.params, want); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// build makes the stage's layers, which take their parameters from from.
func (t *transformer) build(cfg config.Config, vocab int, tp nccl.Comm, from *parallel.ParamSet) error {
	dev, C, seed := t.dev, cfg.Dim, uint64(cfg.Seed)
	var err error
	wteName := "wte"
	if t.llama {
		wteName = "model.embed_tokens"
	}
	if t.first || (t.last && t.tied) {
		if t.wte, err = parallel.NewVocabParallelEmbedding(dev, tp, wteName, vocab, C, seed, parallel.DefaultStd, from); err != nil {
			return err
		}
		t.wte.Out = spec.TokenEmbeddingOut(cfg)
	}
	if t.first && !t.llama {
		if t.wpe, err = parallel.NewPositionEmbedding(dev, "wpe", cfg.PositionRows(), C, seed, spec.PositionStd, from); err != nil {
			return err
		}
		t.wpe.Out = spec.PositionEmbeddingOut(cfg)
	}
	if cfg.SP && tp != nil && tp.Size() > 1 {
		if cfg.Seq%tp.Size() != 0 {
			return fmt.Errorf("sp: seq %d is not a multiple of tp %d", cfg.Seq, tp.Size())
		}
		t.sp, t.Tl = parallel.NewSequenceParallel(tp), cfg.Seq/tp.Size()
		if t.wte != nil {
			if err := t.wte.SetSequenceParallel(t.sp); err != nil {
				return err
			}
		}
		if t.wpe != nil {
			t.wpe.SetSequenceParallel(t.sp)
		}
	}
	if t.llama && t.hi > t.lo {
		kv, err := parallel.KVReplicas(tp, cfg.Heads, cfg.KVHeadCount())
		if err != nil {
			return err
		}
		if kv != nil {
			t.kv = parallel.NewDeviceGroup(kv, dev)
		}
	}
	projStd := spec.ProjStd(cfg.Layers)
	fused, _, err := AttentionFused(cfg, dev)
	if err != nil {
		return err
	}
	for l := t.lo; l < t.hi; l++ {
		var blk block
		if t.llama {
			lb, err := parallel.NewLlamaBlock(dev, tp, fmt.Sprintf("model.layers.%d", l), parallel.LlamaBlockConfig{
				Dim: C, Heads: cfg.Heads, KVHeads: cfg.KVHeadCount(), Hidden: cfg.Hidden(), Eps: cfg.Eps(), RoPE: cfg.RoPE(),
				Seed: seed, ProjStd: projStd, SP: t.sp, Recompute: cfg.RecomputeMode(), FusedAttention: fused, Activations: spec.Compute(cfg), From: from})
			if err != nil {
				return err
			}
			if len(t.blocks) > 0 {
				lb.ShareBuffers(t.blocks[0].(*parallel.LlamaBlock)) // they run one after the other
			}
			blk = lb
		} else {
			gb, err := parallel.NewBlock(dev, tp, fmt.Sprintf("h.%d", l), parallel.BlockConfig{
				Dim: C, Heads: cfg.Heads, Causal: t.gpt, Seed: seed, ProjStd: projStd, SP: t.sp, Recompute: cfg.RecomputeMode(), FusedAttention: fused, Activations: spec.Compute(cfg), From: from})
			if err != nil {
				return err
			}
			if len(t.blocks) > 0 {
				gb.ShareBuffers(t.blocks[0].(*parallel.Block)) // they run one after the other
			}
			blk = gb
		}
		t.blocks = append(t.blocks, blk)
	}
	B := t.B
	if !t.gpt {
		t.keyValid = make([]int32, B*t.T)
	}
	if !t.last {
		return t.allocate(cfg)
	}
	// The LM head's products (and under sequence parallelism the
	// all-gather into them) are all that read ln_f's output (the
	// classifier pools it): bf16 at bf16.
	lnfOut := tensor.Float32
	if t.gpt {
		lnfOut = spec.Compute(cfg)
	}
	if t.llama {
		var n *parallel.RMSNorm
		if n, err = parallel.NewRMSNorm(dev, "model.norm", C, cfg.Eps(), from); err == nil {
			n.Out, t.lnf = lnfOut, n
		}
	} else {
		var n *parallel.LayerNorm
		if n, err = parallel.NewLayerNorm(dev, "ln_f", C, from); err == nil {
			n.Out, t.lnf = lnfOut, n
		}
	}
	if err != nil {
		return err
	}
	t.lnf.SetSequenceParallel(t.sp)
	vp := 0
	if t.gpt {
		if vp, err = parallel.PadVocab(vocab, parallel.NewGroup(tp).Size()); err != nil {
			return err
		}
		if t.tied {
			t.head, err = parallel.NewLMHead(tp, "lm_head", t.wte, spec.Logits(cfg))
		} else {
			t.head, err = parallel.NewColumnParallelLinear(dev, tp, "lm_head", C, vp, parallel.LinearOptions{ValidOut: vocab, ValidRows: vocab, Seed: seed, SequenceParallel: t.sp, OutDType: spec.Logits(cfg), From: from})
		}
		if err != nil {
			return err
		}
		if t.loss, err = parallel.NewVocabParallelCrossEntropy(tp, "loss", vp); err != nil {
			return err
		}
	} else {
		if t.head, err = parallel.NewColumnParallelLinear(dev, tp, "cls.fc1", C, C, parallel.LinearOptions{Bias: true, Seed: seed, From: from}); err != nil {
			return err
		}
		if t.fc2, err = parallel.NewRowParallelLinear(dev, tp, "cls.fc2", C, config.NumClasses, parallel.LinearOptions{Bias: true, InputIsParallel: true, Seed: seed, From: from}); err != nil {
			return err
		}
		// The two logits are replicated after fc2's all-reduce: an
		// unsharded cross-entropy on every rank.
		if t.loss, err = parallel.NewVocabParallelCrossEntropy(nil, "cls.loss", config.NumClasses); err != nil {
			return err
		}
		if t.sp != nil {
			t.poolSum = parallel.ReduceFromRegion(tp)
		}
		t.poolHost = make([]float32, B*B*t.Tl)
		t.logitsHost = make([]float32, B*config.NumClasses)
		t.pred = make([]int32, B)
	}
	return t.allocate(cfg)
}

// allocate makes the model's own buffers (spec.ModelBuffers: with the
// head's on the last stage) and the sequence-parallel region's
// (parallel.SequenceParallelSizes).
func (t *transformer) allocate(cfg config.Config) error {
	if t.Tl != cfg.LocalSeq() {
		return fmt.Errorf("the model holds %d positions a rank, the config %d", t.Tl, cfg.LocalSeq())
	}
	stream, head := spec.ModelBuffers(cfg, t.last)
	var err error
	t.allocated, err = parallel.Allocate(t.dev, append(stream, head...), func(get func(string) *tensor.Tensor) {
		t.dx, t.dh, t.dlogits = get("dx"), get("dh"), get("dlogits")
		t.pool, t.pooled, t.dpooled = get("pool"), get("pooled"), get("dpooled")
		t.h1g, t.dh1g, t.dh1 = get("h1g"), get("dh1g"), get("dh1")
	})
	if err != nil {
		return fmt.Errorf("activations for batch %d x seq %d: %w", t.B, t.T, err)
	}
	if t.sp == nil {
		return nil
	}
	return t.sp.Reserve(t.dev, t.B, t.T, t.C, seqReduced(t.params), spec.NormOut(cfg))
}

// seqReduced is the floats of the gradients the sequence-parallel region
// sums over tp (parallel.SequenceParallel.ReduceGrads).
func seqReduced(params []*parallel.Param) int {
	n := 0
	for _, p := range params {
		if p.SeqReduce {
			n += p.Grad.Len()
		}
	}
	return n
}

// Params implements model.
func (t *transformer) Params() []*parallel.Param { return t.params }

// ParamSet implements model.
func (t *transformer) ParamSet() *parallel.ParamSet { return t.set }

// MarkGradsStale implements model: no pass over the gradient memory, the
// weight gradient GEMMs of the next Backward write with beta 0.
func (t *transformer) MarkGradsStale() { parallel.MarkGradsStale(t.params) }

// Predictions implements model.
func (t *transformer) Predictions() []int32 {
	if t.gpt {
		return nil
	}
	return t.pred
}

// Close implements model.
func (t *transformer) Close() {
	t.releaseLayers()
	for _, x := range t.allocated {
		t.dev.Free(x)
	}
	t.allocated = nil
	if t.set != nil {
		t.set.Free()
		t.set = nil
	}
	t.params = nil
	if c := t.kv.Comm(); c != nil {
		c.Close()
		t.kv = nil
	}
}

// releaseLayers frees the layers' activation buffers.
func (t *transformer) releaseLayers() {
	for _, b := range t.blocks {
		b.Release()
	}
	if t.wte != nil {
		t.wte.Release()
	}
	if t.wpe != nil {
		t.wpe.Release()
	}
	if t.lnf != nil {
		t.lnf.Release()
	}
	if t.head != nil {
		t.head.Release()
	}
	if t.fc2 != nil {
		t.fc2.Release()
	}
	if t.loss != nil {
		t.loss.Release()
	}
	if t.sp != nil {
		t.sp.Release()
	}
}

// Forward implements model.
func (t *transformer) Forward(b *data.Batch, train bool) (float64, error) {
	_, loss, err := t.forwardStage(b, nil, train)
	return loss, err
}

// forwardStage runs this stage's part of the forward pass on b: the
// embeddings on the first stage (else x, the previous stage's output,
// (B,T,C) or (B,T/tp,C) under sp, is the input), the stage's blocks, and on
// the last stage ln_f, the head and the loss. It returns the stage's output
// (nil on the last stage) and the loss (0 but on the last stage). x must
// not change until the stage's Backward.
func (t *transformer) forwardStage(b *data.Batch, x *tensor.Tensor, train bool) (*tensor.Tensor, float64, error) {
	x, err := t.body(b, x)
	if err != nil {
		return nil, 0, err
	}
	if !t.last {
		t.forwardedTrain = train
		return x, 0, nil
	}
	h, err := t.lnf.Forward(x)
	if err != nil {
		return nil, 0, err
	}
	var loss float64
	if t.gpt {
		logits, err := t.head.Forward(h)
		if err != nil {
			return nil, 0, err
		}
		if loss, err = t.loss.Forward(logits, t.targets); err != nil {
			return nil, 0, err
		}
	} else if loss, err = t.classifierForward(b, h); err != nil {
		return nil, 0, err
	}
	t.forwardedTrain = train
	return nil, loss, nil
}

// DeviceLoss reports whether ForwardOnDevice can run: the language model
// can; the classifier reads its predictions in Forward.
func (t *transformer) DeviceLoss() bool { return t.gpt }

// ForwardOnDevice is a training Forward of the language model that leaves
// the loss on the device: per-row losses (N) whose sum over count is the
// mean loss, so that a step reads it back once.
func (t *transformer) ForwardOnDevice(b *data.Batch) (losses *tensor.Tensor, count int, err error) {
	if !t.gpt {
		return nil, 0, fmt.Errorf("ForwardOnDevice: the classifier has no device loss")
	}
	h, err := t.trunk(b)
	if err != nil {
		return nil, 0, err
	}
	logits, err := t.head.Forward(h)
	if err != nil {
		return nil, 0, err
	}
	if err := t.loss.ForwardDevice(logits, t.targets); err != nil {
		return nil, 0, err
	}
	t.forwardedTrain = true
	return t.loss.Losses(), t.loss.Count(), nil
}

// trunk runs the embeddings, the blocks and the final layernorm on b and
// returns ln_f's output (B,T,C); under sequence parallelism this rank's
// (B,T/tp,C) positions, which the LM head gathers. The model must be one
// stage.
func (t *transformer) trunk(b *data.Batch) (*tensor.Tensor, error) {
	x, err := t.body(b, nil)
	if err != nil {
		return nil, err
	}
	return t.lnf.Forward(x)
}

// body runs the embeddings (first stage) and the stage's blocks on b and
// returns the residual stream after the last of them; x is the stage's
// input on the other stages.
func (t *transformer) body(b *data.Batch, x *tensor.Tensor) (*tensor.Tensor, error) {
	if b.B != t.B || b.T != t.T {
		return nil, fmt.Errorf("batch is %dx%d, the model was built for %dx%d", b.B, b.T, t.B, t.T)
	}
	t.forwardedTrain = false
	t.ids = append(t.ids[:0], b.Tokens...)
	var keyValid []int32
	if t.gpt {
		t.targets = append(t.targets[:0], b.Targets...)
	} else {
		t.labels = append(t.labels[:0], b.Labels...)
		for i := 0; i < t.B; i++ {
			for j := 0; j < t.T; j++ {
				t.keyValid[i*t.T+j] = b2i(j < int(b.Lengths[i]))
			}
		}
		keyValid = t.keyValid
	}
	var err error
	if t.first {
		if x, err = t.wte.Forward(t.ids, t.B, t.T); err != nil {
			return nil, err
		}
		if t.wpe != nil {
			if x, err = t.wpe.Forward(x); err != nil {
				return nil, err
			}
		}
	} else if x == nil || x.Len() != t.B*t.Tl*t.C {
		return nil, fmt.Errorf("blocks %d-%d: no input of %dx%dx%d from the previous stage", t.lo, t.hi-1, t.B, t.Tl, t.C)
	}
	for l, blk := range t.blocks {
		if err := t.set.GatherBlock(l); err != nil {
			return nil, err
		}
		if x, err = blk.Forward(x, keyValid); err != nil {
			return nil, err
		}
	}
	return x, nil
}

// classifierForward pools the final hidden states h (B,T,C) over each
// sequence's tokens (a (B,B*T) averaging matrix times (B*T,C)), then runs
// fc1, GELU, fc2 and the cross-entropy. Under sequence parallelism h is
// this rank's (B,T/tp,C) positions: the pooling is a partial mean over
// them, summed over tp by the g operator (the backward needs nothing).
func (t *transformer) classifierForward(b *data.Batch, h *tensor.Tensor) (float64, error) {
	d, N := t.dev, t.B*t.Tl
	first := 0
	if t.sp != nil {
		first = t.sp.Rank() * t.Tl
	}
	clear(t.poolHost)
	for i := 0; i < t.B; i++ {
		n := int(b.Lengths[i])
		for j := 0; j < t.Tl && first+j < n; j++ {
			t.poolHost[i*N+i*t.Tl+j] = 1 / float32(n)
		}
	}
	d.CopyFromHost(t.pool, t.poolHost)
	d.Gemm(false, false, t.B, t.C, N, 1, t.pool, 0, N, h, 0, t.C, 0, t.pooled, 0, t.C)
	var err error
	if t.poolSum != nil {
		if err = t.poolSum.Forward(t.pooled); err != nil {
			return 0, err
		}
	}
	if t.h1, err = t.head.Forward(t.pooled); err != nil {
		return 0, err
	}
	d.ActivationForward(tensor.GELU, t.h1g, t.h1)
	logits, err := t.fc2.Forward(t.h1g)
	if err != nil {
		return 0, err
	}
	loss, err := t.loss.Forward(logits, t.labels)
	if err != nil {
		return 0, err
	}
	d.CopyToHost(t.logitsHost, logits)
	for i := range t.pred {
		t.pred[i] = b2i(t.logitsHost[i*config.NumClasses+1] > t.logitsHost[i*config.NumClasses])
	}
	return loss, nil
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// Backward implements model.
func (t *transformer) Backward(scale float32) error {
	_, err := t.backwardStage(scale, nil)
	return err
}

// backwardStage accumulates the gradients of scale * the loss through this
// stage after its forwardStage. dout is the gradient of the stage's output
// (from the next stage, in the device's memory, best received straight
// into stageGradient(); nil on the last, which starts from the loss). It
// returns the gradient of the stage's input (nil
// on the first stage), owned by the model until its next backward.
func (t *transformer) backwardStage(scale float32, dout *tensor.Tensor) (*tensor.Tensor, error) {
	if !t.forwardedTrain {
		return nil, fmt.Errorf("backward without a training forward pass")
	}
	d := t.dev
	dx := t.dx
	if t.last {
		if err := t.headBackward(scale); err != nil {
			return nil, err
		}
	} else if dout == nil || dout.Len() != dx.Len() {
		return nil, fmt.Errorf("stage gradient %v, want %d elements", dout, dx.Len())
	} else if dout != dx {
		d.Copy(dx, dout)
	}
	for l := len(t.blocks) - 1; l >= 0; l-- {
		if err := t.set.GatherBlock(l); err != nil {
			return nil, err
		}
		if err := t.blocks[l].BackwardInPlace(dx); err != nil {
			return nil, err
		}
		if err := t.blockGrads.takeOut(t, l); err != nil {
			return nil, err
		}
	}
	if !t.first {
		parallel.ZeroStaleGrads(t.blockGrads.rest(t))
		return dx, nil
	}
	if t.wpe != nil {
		if err := t.wpe.Backward(dx, nil); err != nil {
			return nil, err
		}
	}
	if err := t.wte.Backward(dx); err != nil {
		return nil, err
	}
	parallel.ZeroStaleGrads(t.blockGrads.rest(t))
	return nil, nil
}

// headBackward runs the loss, the head and ln_f backward, leaving the
// gradient of the last block's output in t.dx.
func (t *transformer) headBackward(scale float32) error {
	d := t.dev
	if t.gpt {
		// The fused classifier: the gradient written over the logits.
		dlogits, err := t.loss.BackwardInPlace(scale, t.head.ProductOut())
		if err != nil {
			return err
		}
		d.Zero(t.dh)
		if err := t.head.Backward(dlogits, t.dh); err != nil {
			return err
		}
	} else {
		d.Zero(t.dlogits)
		if err := t.loss.Backward(t.dlogits, scale); err != nil {
			return err
		}
		d.Zero(t.dh)
		if err := t.classifierBackward(); err != nil {
			return err
		}
	}
	d.Zero(t.dx)
	return t.lnf.Backward(t.dh, t.dx)
}

// stageGradient is where the gradient of a (not last) stage's output is
// best received: the backward's own first buffer, which the forward never
// uses and stage copies share.
func (t *transformer) stageGradient() *tensor.Tensor { return t.dx }

// tiedEmbedding is the token embedding this stage shares with the other
// end of the pipeline (the LM head's weight): non-nil on the first and the
// last stage of a gpt pipeline of more than one stage.
func (t *transformer) tiedEmbedding() *parallel.Param {
	if !t.tied || t.first == t.last {
		return nil
	}
	return t.wte.Weight
}

// ReduceGrads implements model.
func (t *transformer) ReduceGrads() error {
	return t.reduceOverTP(t.blockGrads.rest(t))
}

// reduceOverTP sums over tp the gradients of params that tensor
// parallelism leaves partial: the key/value heads a Llama's kv replicas
// share, and under sequence parallelism the replicated parameters used on
// this rank's positions only.
func (t *transformer) reduceOverTP(params []*parallel.Param) error {
	if err := parallel.ReduceReplicas(t.kv, params); err != nil {
		return err
	}
	if t.sp == nil {
		return nil
	}
	return t.sp.ReduceGrads(params)
}

// blockGrads is ZeRO-2's (and 3's) side of the model: the gradients of each block's
// parameters share one buffer (parallel.ParamSet's BlockGrads), and as a
// block's backward ends they are completed (reduced over tp) and handed to
// reduce, which takes them out of the buffer (the optimizer's
// reduce-scatter) before the next block writes its own.
type blockGrads struct {
	reduce func(block int) error // the stage's block block (from 0), set by the optimizer
	others []*parallel.Param     // the stage's parameters outside the blocks
}

// takeOut hands block l's gradients of this micro-batch to reduce and
// leaves the blocks' gradients stale for the next block's backward to
// overwrite. Nothing without ZeRO-2 or 3.
func (g *blockGrads) takeOut(t *transformer, l int) error {
	if g == nil {
		return nil
	}
	if g.reduce == nil {
		return fmt.Errorf("zero: no optimizer takes the blocks' gradients")
	}
	ps := t.set.Blocks()[l]
	parallel.ZeroStaleGrads(ps)
	if err := t.reduceOverTP(ps); err != nil {
		return err
	}
	if err := g.reduce(l); err != nil {
		return err
	}
	for _, b := range t.set.Blocks() {
		parallel.MarkGradsStale(b) // whichever block writes next overwrites
	}
	return nil
}

// rest is the model's parameters whose gradients a step reduces after its
// backward: all of them, or under ZeRO-2 and 3 those outside the blocks.
func (g *blockGrads) rest(t *transformer) []*parallel.Param {
	if g == nil {
		return t.params
	}
	return g.others
}

// classifierBackward turns t.dlogits into the gradient of ln_f's output in
// t.dh (zeroed), accumulating the head's parameter gradients.
func (t *transformer) classifierBackward() error {
	d, N := t.dev, t.B*t.Tl
	d.Zero(t.dh1g)
	if err := t.fc2.Backward(t.dlogits, t.dh1g); err != nil {
		return err
	}
	d.Zero(t.dh1)
	d.ActivationBackward(tensor.GELU, t.dh1, t.h1, t.dh1g)
	d.Zero(t.dpooled)
	if err := t.head.Backward(t.dh1, t.dpooled); err != nil {
		return err
	}
	// dh = pool^T @ dpooled, (B*T,C)
	d.Gemm(true, false, N, t.C, t.B, 1, t.pool, 0, N, t.dpooled, 0, t.C, 0, t.dh, 0, t.C)
	return nil
}

// cachedBlock is a block with an incremental decode path.
type cachedBlock interface {
	NewKVCache(max int) (*parallel.KVCache, error)
	ForwardCached(x *tensor.Tensor, c *parallel.KVCache) (*tensor.Tensor, error)
}

// newKVCaches makes an empty key/value cache of max positions for each
// block of a one-stage language model.
func (t *transformer) newKVCaches(max int) ([]*parallel.KVCache, error) {
	if !t.gpt || !t.first || !t.last || t.sp != nil {
		return nil, fmt.Errorf("a key/value cache decodes with a whole language model on each rank, without sequence parallelism")
	}
	var cs []*parallel.KVCache
	for _, blk := range t.blocks {
		cb, ok := blk.(cachedBlock)
		var c *parallel.KVCache
		var err error
		if !ok {
			err = fmt.Errorf("block %T has no cached forward", blk)
		} else {
			c, err = cb.NewKVCache(max)
		}
		if err != nil {
			for _, c := range cs {
				c.Release()
			}
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// decode runs the model on ids, the tokens of one sequence at positions
// pos..pos+len(ids)-1 after the pos the caches hold (one per block), which
// take their keys and values, and returns the LM head's (1,len(ids),V/tp)
// logits.
func (t *transformer) decode(ids []int32, pos int, caches []*parallel.KVCache) (*tensor.Tensor, error) {
	n := len(ids)
	x, err := t.wte.Forward(ids, 1, n)
	if err != nil {
		return nil, err
	}
	if t.wpe != nil {
		if x, err = t.wpe.ForwardAt(x, pos); err != nil {
			return nil, err
		}
	}
	for i, blk := range t.blocks {
		if err := t.set.GatherBlock(i); err != nil {
			return nil, err
		}
		if x, err = blk.(cachedBlock).ForwardCached(x, caches[i]); err != nil {
			return nil, err
		}
	}
	h, err := t.lnf.Forward(x)
	if err != nil {
		return nil, err
	}
	return t.head.Forward(h)
}
