package plan

import (
	"fmt"
	"math"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/spec"
)

// This file is the plan at cluster scale (hpcrun plan --cluster): a GPT
// trained the way Megatron-LM trains it (Narayanan et al. 2021), on a
// preset cluster, predicted by arithmetic. It is a simulation for
// planning only: hpcrun's engine stores fp32 weights, gradients and most
// activations (at --precision bf16 also bf16 copies of the weights and
// the activations only products read) and runs plain 1F1B (its --recompute full is the paper's
// recomputation); this model prices what Megatron-LM does instead: bf16
// weights with fp32 gradients, masters and Adam moments (18 bytes a
// parameter), full activation recomputation, the interleaved 1F1B
// schedule.

// ScaleRequest is what a plan at scale is made for: a GPT config (its
// layout: tp, pp, ntasks, bsz the micro-batch, micro-batches), the
// vocabulary, the cluster, and Interleave, the virtual pipeline stages
// (model chunks) each rank holds (0 or 1: plain 1F1B).
type ScaleRequest struct {
	Config     config.Config
	Vocab      int
	Cluster    Cluster
	Interleave int
}

// Scale is what a plan at scale adds to the Plan: the cluster, the
// schedule, the paper's FLOP accounting and, where the model and GPUs are
// a row of Narayanan et al.'s table, that row.
type Scale struct {
	Cluster     string  `json:"cluster"`
	GPUsPerNode int     `json:"gpus_per_node"`
	Interleave  int     `json:"interleave"`
	CrossNodePP bool    `json:"cross_node_pp"` // neighbour stages on different nodes
	GlobalBatch int     `json:"global_batch"`
	IterFlops   float64 `json:"iteration_flops"` // PaperFlops of the global batch
	// TFLOPs is teraFLOP/s a GPU in the paper's accounting: IterFlops over
	// the step and the GPUs.
	TFLOPs float64 `json:"tflops_per_gpu"`
	// Per layer and micro-batch on one GPU: the GEMMs (forward, the
	// recomputed forward, backward), the elementwise kernels and the
	// tensor-parallel all-reduces; per micro-batch a stage's
	// point-to-point time.
	LayerGemmS float64 `json:"layer_gemm_s"`
	LayerElemS float64 `json:"layer_elem_s"`
	LayerTPS   float64 `json:"layer_tp_s"`
	P2PS       float64 `json:"p2p_s"`
	DPS        float64 `json:"dp_s"` // the data-parallel gradient all-reduce
	// Paper is the table's row of this model and GPU count, if any, and
	// ErrorPct the predicted TFLOPs against its own, in percent.
	Paper    *PaperRow `json:"paper,omitempty"`
	ErrorPct float64   `json:"error_pct,omitempty"`
	// Modelled and Assumed say what the prediction rests on.
	Modelled []string `json:"modelled"`
	Assumed  []string `json:"assumed"`
}

// Bytes per element: Megatron's bf16 activations and weights.
const bf16 = 2

// Megatron-LM's mixed-precision state, bytes a parameter: bf16 weights,
// fp32 gradients (main_grad), fp32 master weights, Adam's two fp32
// moments: 2 + 4 + 4 + 8 = 18.
const (
	weightBytes = 2
	gradBytes   = 4
	masterBytes = 4
	adamBytes   = 8
)

// adamTraffic is the bytes a parameter the optimizer step moves: it reads
// the gradient, master and moments (16), writes master, moments and the
// bf16 weight (14) and zeroes the gradient (4).
const adamTraffic = 34

// The elementwise kernels of one layer's forward, in element passes
// (reads plus writes) over three kinds of tensor: (b,s,h) ones that every
// tensor-parallel rank holds whole (two layer norms: 2 each; two fused
// bias-dropout-residual adds: 3 each and a 1-byte mask), (b,s,h/tp) ones
// (the q/k/v bias and the heads' transposes: 12, the fused bias-GeLU on
// the 4h/tp: 8), and the (b,a/tp,s,s) attention scores (the fused
// scale-mask-softmax: 2, dropout: 2 and its mask). The backward moves
// about twice the forward.
const (
	elemPassesH     = 11
	elemPassesHtp   = 20
	elemPassesScore = 4.5
)

// lossPasses are the fp32 passes of the vocab-parallel cross-entropy over
// the (b,s,V/tp) logits: the cast, max, exp and sum, and the gradient.
const lossPasses = 5

// gemmTime is g's seconds at rate FLOP/s (the half-precision peak times
// the GEMM efficiency), or, when its operands and result take longer to
// move than to multiply (attention's products of head width), at the
// memory's bandwidth.
func gemmTime(g tensor.GemmShape, rate, bandwidth float64) float64 {
	m, n, k := float64(g.M), float64(g.N), float64(g.K)
	move := float64(max(g.Batch, 1)) * bf16 * (m*k + k*n + m*n) / bandwidth
	return math.Max(g.Flops()/rate, move)
}

// halfPrecision is the 16-bit format Megatron-LM trains in on dev and
// its tensor cores' peak: bf16, or fp16 (with loss scaling) on a GPU
// without bf16 (V100).
func halfPrecision(dev Device) (string, float64) {
	if dev.BF16Flops > 0 {
		return "bf16", dev.BF16Flops
	}
	return "fp16", dev.FP16Flops
}

// layerGemms are one transformer layer's forward products on a rank of a
// tp group for a micro-batch of b sequences of s tokens, width h, a
// heads: the q/k/v projection, the scores and their product with the
// values (a/tp heads), the output projection, the MLP's two.
func layerGemms(b, s, h, a, tp int) []tensor.GemmShape {
	return []tensor.GemmShape{
		{M: b * s, N: 3 * h / tp, K: h},
		{M: s, N: s, K: h / a, Batch: b * a / tp},
		{M: s, N: h / a, K: s, Batch: b * a / tp},
		{M: b * s, N: h, K: h / tp},
		{M: b * s, N: 4 * h / tp, K: h},
		{M: b * s, N: h, K: 4 * h / tp},
	}
}

// AtScale plans r's GPT on r's cluster as Megatron-LM would train it:
// memory per GPU in Megatron's accounting, the step's time and the
// teraFLOP/s a GPU in the paper's. The layout's tensor-parallel group
// stays in a node; ranks are ordered tp, then dp, then pp (Megatron's
// grid).
func AtScale(r ScaleRequest) (*Plan, error) {
	cfg, c := r.Config, r.Cluster
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	G := c.Node.GPUs
	switch {
	case cfg.Model != "gpt":
		return nil, fmt.Errorf("plan --cluster: model %q: the plan at scale models a GPT (--model gpt)", cfg.Model)
	case r.Vocab < 1:
		return nil, fmt.Errorf("plan --cluster: vocab %d: must be at least 1", r.Vocab)
	case G < 1 || c.Node.GPU.BF16Flops+c.Node.GPU.FP16Flops <= 0:
		return nil, fmt.Errorf("plan --cluster: cluster %q has no GPUs or no half-precision rate", c.Name)
	case cfg.TP > G:
		return nil, fmt.Errorf("plan --cluster: tp %d is more than the %d GPUs of a %s node: a tensor-parallel group stays in a node", cfg.TP, G, c.Name)
	case cfg.NTasks > G && cfg.NTasks%G != 0:
		return nil, fmt.Errorf("plan --cluster: %d tasks do not fill nodes of %d GPUs", cfg.NTasks, G)
	case cfg.SP || cfg.Zero > 0 || (cfg.Recompute != "" && cfg.Recompute != "full"):
		return nil, fmt.Errorf("plan --cluster models Megatron-LM's training as Narayanan et al. ran it: full recomputation, no sequence parallelism, no ZeRO; leave out --sp, --zero %d and --recompute %s", cfg.Zero, cfg.Recompute)
	}
	split, err := stageSplit(cfg)
	if err != nil {
		return nil, err
	}
	pp, m, dp := cfg.Stages(), cfg.Micro(), cfg.DP()
	v := max(r.Interleave, 1)
	if v > 1 {
		switch {
		case pp == 1:
			return nil, fmt.Errorf("plan --cluster: --interleave %d needs a pipeline (--pp > 1)", v)
		case cfg.PPSplit != "" || split[0]%v != 0:
			return nil, fmt.Errorf("plan --cluster: --interleave %d does not divide a stage's %d layers", v, split[0])
		case m%pp != 0:
			return nil, fmt.Errorf("plan --cluster: --interleave %d needs micro-batches (%d) a multiple of pp %d", v, m, pp)
		}
	}
	vp, err := parallel.PadVocab(r.Vocab, cfg.TP)
	if err != nil {
		return nil, err
	}
	dev := c.Node.GPU
	precision, peak := halfPrecision(dev)
	rate, hbm := peak*dev.Efficiency, dev.MemBandwidth
	nodes := (cfg.NTasks + G - 1) / G
	b, s, h, a, t := float64(cfg.BatchSize), float64(cfg.Seq), float64(cfg.Dim), float64(cfg.Heads), float64(cfg.TP)
	V := float64(vp)
	lmax := 0
	for _, l := range split {
		lmax = max(lmax, l)
	}
	L := float64(lmax)

	// One layer, one micro-batch, one GPU: forward, recomputed forward and
	// backward (twice the forward) of the GEMMs and of the elementwise
	// kernels; six all-reduces of the (b,s,h) activations in the tp group
	// (two in each forward, two in the backward).
	var fwdS, fwdFlops float64
	for _, g := range layerGemms(cfg.BatchSize, cfg.Seq, cfg.Dim, cfg.Heads, cfg.TP) {
		fwdS, fwdFlops = fwdS+gemmTime(g, rate, hbm), fwdFlops+g.Flops()
	}
	act := bf16 * b * s * h
	fwdBytes := bf16 * (elemPassesH*b*s*h + elemPassesHtp*b*s*h/t + elemPassesScore*b*a/t*s*s)
	tpPath := Path{Ranks: cfg.TP, PerNode: G}
	layerGemmS, layerElemS := 4*fwdS, 4*fwdBytes/dev.MemBandwidth
	layerTPS := 6 * c.AllReduce(act, tpPath)

	// The first stage's embedding (a lookup written, its all-reduce over
	// tp forward, the gradient's scatter backward); the last stage's head
	// (the logits' product forward and backward, not recomputed), its
	// fp32 loss and the all-reduce of its input's gradient.
	embElemS := 2 * act / dev.MemBandwidth
	embTPS := c.AllReduce(act, tpPath)
	head := tensor.GemmShape{M: cfg.BatchSize * cfg.Seq, N: vp / cfg.TP, K: cfg.Dim}
	headGemmS := 3 * gemmTime(head, rate, hbm)
	headElemS := lossPasses*4*b*s*V/t/dev.MemBandwidth + 4*act/dev.MemBandwidth
	headTPS := c.AllReduce(act, tpPath) + 3*c.AllReduce(4*b*s, tpPath)

	// A micro-batch's time on the slowest stage: its layers, the
	// embedding or the head, and its point-to-point messages: the
	// activation in and the gradient out for each of its v chunks.
	type part struct{ gemm, elem, comm float64 }
	stage := func(first, last bool) part {
		p := part{L * layerGemmS, L * layerElemS, L * layerTPS}
		if first {
			p.elem, p.comm = p.elem+embElemS, p.comm+embTPS
		}
		if last {
			p.gemm, p.elem, p.comm = p.gemm+headGemmS, p.elem+headElemS, p.comm+headTPS
		}
		return p
	}
	parts := []part{stage(true, pp == 1), stage(false, true)}
	slow := parts[0]
	for _, p := range parts[1:] {
		if p.gemm+p.elem+p.comm > slow.gemm+slow.elem+slow.comm {
			slow = p
		}
	}
	crossNode := nodes > 1
	var p2pS float64
	if pp > 1 {
		p2pS = 2 * float64(v) * c.Send(act, crossNode, cfg.TP)
	}
	mbS := slow.gemm + slow.elem + slow.comm + p2pS
	micro := float64(m)
	bubbleStages := 0.0
	if pp > 1 {
		// Interleaved 1F1B: the m micro-batches take as long as m +
		// (p-1)/v of them.
		bubbleStages = float64(pp-1) / float64(v)
	}

	// The rank's parameters: of its layers, with the embedding on the
	// first stage (and its tied copy on the last), the position table on
	// the first, the final layer norm on the last.
	layerParams := 12*h*h/t + 7*h/t + 6*h
	firstParams := L*layerParams + V*h/t + float64(cfg.PositionRows())*h
	lastParams := L*layerParams + 2*h
	if pp > 1 {
		lastParams += V * h / t
	} else {
		lastParams = firstParams + 2*h
		firstParams = lastParams
	}
	rankParams := math.Max(firstParams, lastParams)

	// After the pipeline: the fp32 gradients' all-reduce over dp (the
	// data-parallel group has min(dp, GPUs/tp) ranks a node in
	// Megatron's grid), the tied embedding's between the first and the
	// last stage, and Adam.
	dpS := c.AllReduce(gradBytes*rankParams, Path{Ranks: dp, PerNode: min(dp, max(G/cfg.TP, 1))})
	embARS := 0.0
	if pp > 1 {
		embARS = c.AllReduce(gradBytes*V*h/t, Path{Ranks: 2, PerNode: 1})
	}
	optS := adamTraffic * rankParams / dev.MemBandwidth

	var tm Time
	tm.GemmFlops = micro * (4*L*fwdFlops + 3*head.Flops())
	tm.Rate = rate
	tm.ComputeS = micro * slow.gemm
	tm.MemoryS = micro*slow.elem + optS
	tm.CommS = micro*(slow.comm+p2pS) + dpS + embARS
	tm.BubbleS = bubbleStages * mbS
	if pp > 1 {
		tm.Bubble = bubbleStages / (micro + bubbleStages)
		tm.Transfers = 2 * v * m
		tm.PPBytes = float64(tm.Transfers) * act
	}
	tm.StepS = tm.ComputeS + tm.MemoryS + tm.CommS + tm.BubbleS
	tm.CommShare = tm.CommS / tm.StepS
	half := func(p float64) float64 { return (p - 1) / p }
	tm.TPBytes = micro * (6*L + 2) * 2 * act * half(t)
	tm.DPBytes = 2 * gradBytes * rankParams * half(float64(dp))
	global := cfg.BatchSize * m * dp
	iter := PaperFlops(global, cfg.Seq, cfg.Layers, cfg.Dim, r.Vocab)
	tm.TokensPerS = float64(global*cfg.Seq) / tm.StepS
	// MFU and HFU as a run's summary counts them; the paper's own
	// accounting stays in Scale.TFLOPs, to set beside its table. Megatron-LM
	// as the paper ran it recomputes in full, whatever --recompute says.
	tm.FlopsPerToken = spec.ModelFlopsPerToken(cfg, r.Vocab)
	tm.PeakFlops = peak
	tm.MFU = metrics.MFU(tm.FlopsPerToken, tm.TokensPerS, tm.PeakFlops, cfg.NTasks)
	full := cfg
	full.Recompute = "full"
	tm.HardwareFlopsPerToken = spec.HardwareFlopsPerToken(full, r.Vocab)
	tm.HFU = metrics.HFU(tm.HardwareFlopsPerToken, tm.TokensPerS, tm.PeakFlops, cfg.NTasks)

	// Memory of the first stage (the most activations in flight) and of
	// the last (the logits), in Megatron's accounting.
	inFlight := float64(min(m, pp))
	stored := act * L * inFlight
	if v > 1 {
		// Korthikanti et al. 2022: interleaving keeps (1 + (p-1)/(p v))
		// times the layer inputs of plain 1F1B on the first stage.
		stored *= 1 + float64(pp-1)/float64(pp*v)
	}
	// One layer's activations while it is recomputed and back-propagated
	// (Korthikanti et al. 2022, eq. 2 with tp: s b h (10 + 24/t + 5 a
	// s/(h t)) bytes).
	working := s * b * h * (10 + 24/t + 5*a*s/(h*t))
	logits := 10 * b * s * V / t // bf16 logits, their fp32 copy and gradient
	comms := int64(0)
	for _, n := range []int{cfg.TP, dp} {
		if n > 1 {
			comms++
		}
	}
	if pp > 1 {
		comms += 3 // the two neighbours, the embedding group
	}
	mem := func(params, activations, logits float64) Memory {
		P := int64(params)
		mm := Memory{
			Params: weightBytes * P, Grads: gradBytes * P, Masters: masterBytes * P, Optimizer: adamBytes * P,
			ActivationsPerBlock: int64(working), SavedPerBlock: int64(act),
			Blocks: int64(activations + working), Logits: int64(logits),
			CommBuffers: comms * ncclBuffers, Context: dev.ContextBytes,
		}
		mm.EnginePeak = mm.Params + mm.Grads + mm.Masters + mm.Optimizer + mm.Blocks + mm.Logits
		mm.Total = mm.EnginePeak + mm.CommBuffers + mm.Context
		return mm
	}
	memory := mem(firstParams, stored, 0)
	if pp == 1 {
		memory = mem(firstParams, stored, logits)
	} else if last := mem(lastParams, act*L, logits); last.Total > memory.Total {
		memory = last
	}

	pl := &Plan{
		Model: cfg.Model, Layers: cfg.Layers, Dim: cfg.Dim, Heads: cfg.Heads, Seq: cfg.Seq,
		Vocab: r.Vocab, PaddedVocab: vp, BatchSize: cfg.BatchSize, GradAccum: m, Precision: precision,
		NTasks: cfg.NTasks, TP: cfg.TP, DP: dp, PP: cfg.PP, Nodes: nodes,
		Params: int64(float64(cfg.Layers)*(12*h*h+13*h) + V*h + float64(cfg.PositionRows())*h + 2*h),
		Device: dev, Memory: memory, Time: tm,
	}
	pl.Headroom = dev.MemBytes - memory.Total
	pl.Fits = pl.Headroom >= 0
	sc := &Scale{
		Cluster: c.Name, GPUsPerNode: G, Interleave: v, CrossNodePP: pp > 1 && crossNode, GlobalBatch: global,
		IterFlops: iter, TFLOPs: iter / tm.StepS / float64(cfg.NTasks) / 1e12,
		LayerGemmS: layerGemmS, LayerElemS: layerElemS, LayerTPS: layerTPS, P2PS: p2pS, DPS: dpS,
	}
	// The paper's figure, on the paper's hardware: 8 A100 80GB a node.
	if row, ok := FindPaperRow(cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, r.Vocab, cfg.NTasks); ok && c.Name == paperCluster {
		sc.Paper, sc.ErrorPct = &row, 100*(sc.TFLOPs/row.TFLOPs-1)
	}
	sc.Modelled = []string{
		fmt.Sprintf("GEMMs by shape at %.0f%% of the %s peak, or by their bytes at HBM bandwidth where that is slower (attention's head-width products)", 100*dev.Efficiency, precision),
		"elementwise kernels (layer norms, bias-GeLU, bias-dropout-add, softmax, dropout, the fp32 loss) and Adam by the bytes they move at HBM bandwidth",
		"full activation recomputation: every layer's forward twice, its input kept",
		"tp: six all-reduces of (b,s,h) a layer a micro-batch over NVLink; pp: point-to-point of (b,s,h) each way, across nodes 1/tp a GPU and an NVLink all-gather (the paper's scatter/gather); dp: the fp32 gradients' all-reduce, ring or tree as NCCL picks, NVLink and a GPU's share of the node's adapters",
		fmt.Sprintf("the interleaved 1F1B schedule, plan-only (hpcrun's engine runs plain 1F1B): bubble (p-1)/(v m) of the micro-batches' time, v = %d", v),
	}
	sc.Assumed = []string{
		fmt.Sprintf("link rates at %.0f%% of nominal (NCCL's bus bandwidth); no overlap of communication with compute (Megatron-LM 2021)", 100*linkEfficiency),
		"memory in Megatron's mixed-precision accounting (18 bytes a parameter: bf16 weights, fp32 gradients, masters and Adam moments), not hpcrun's engine's fp32 (16 bytes a parameter and every activation kept)",
		"no allocator fragmentation, no kernel-launch gaps; the CUDA context and NCCL buffers as in the device table",
		"FLOPs in the paper's accounting: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) an iteration, recomputation counted",
	}
	pl.Scale = sc
	pl.Notes = append(pl.Notes, "plan at scale: a simulation of Megatron-LM's training on the cluster, not of hpcrun's engine")
	return pl, nil
}
