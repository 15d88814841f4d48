// Package plan predicts what a training run needs before it runs: per rank,
// the memory of every kind of buffer the engine allocates (parameters,
// gradients, AdamW moments, the activations each block keeps for backward,
// logits and loss buffers, GPU workspace, comm buffers, the CUDA context),
// whether that fits the device, and a step time split into compute and
// communication, with the tokens/s and MFU that follow.
//
// It is pure arithmetic on a config.Config, the vocabulary, the number of
// nodes and a Device (the table in device.go): no allocation on a device,
// and no I/O but host.go's, which chooses a rank's Device (RankDevice) and
// for a CPU rank reads this machine's cores, memory and load and the
// rates hpcrun bench gemm and bench comm kept (rates.go, commrates.go:
// GEMMs by shape, streaming bandwidth, the collectives' latency and
// bandwidth). The memory model sums the
// engine's own size tables, the lists from which its layers and model
// allocate their activation buffers (parallel.BlockSizes and the other
// layers', parallel.SequenceParallelSizes, spec.ModelBuffers and
// spec.StageActivation; see blockBytes and the functions beside it), so
// on the CPU, where the engine counts exactly the bytes of its tensors,
// the prediction is that count; its test checks it against the engine's own peak
// (tensor.MemStats) after real steps. The communication model
// follows the collectives one for one too: the test checks the bytes and
// the collectives of a step against the engine's counters (nccl.Stats).
//
// Sequence parallelism (config.Config.SP) and ZeRO (config.Config.Zero) are
// modelled buffer for buffer as the rest: the sequence-parallel region's
// activations per rank fall by tp, against the region's shared
// full-sequence buffers (Memory.SPBuffers); ZeRO-1 keeps the AdamW
// moments of this data-parallel rank's range of every gradient bucket,
// ZeRO-2 also the blocks' gradients (one block's whole in a shared
// buffer), ZeRO-3 the blocks' values too; hybrid sharding cuts the ranges
// over ZeRO's group of the data-parallel ranks instead of all of them.
//
// A pipeline (config.Config.PP > 1) is modelled stage by stage (Plan.Stages):
// stage s holds its blocks' saved activations for the pp-s micro-batches
// in flight in the 1F1B schedule (the first stage the most) beside one
// backward scratch, the embeddings on the first stage and ln_f, the head
// and the loss on the last; each rank sends its activations and gradients
// to its neighbour stages point-to-point; and the step is the slowest
// stage's, its micro-batches' work stretched by the 1F1B bubble.
//
// The engine keeps every tensor in float32 whatever the precision (bf16
// changes how a GPU multiplies, not what it stores). With activation
// recomputation (config.Config.Recompute) a block keeps less (its table
// says what) and the blocks share one backward scratch, and the step
// computes the recomputed part of the forward again.
//
// Auto (auto.go) plans every layout of a job's tasks and global batch the
// engine runs (tp x pp x dp, sequence parallelism, ZeRO 1-3, micro-batches)
// and ranks those that fit by predicted tokens/s, saying why.
//
// AtScale (scale.go, on the clusters of cluster.go) is a second model, for
// planning only: a GPT trained the way Megatron-LM trains it (bf16 weights
// with fp32 gradients, masters and Adam moments, full activation
// recomputation, the interleaved 1F1B schedule) on a preset cluster of
// hundreds of GPUs, checked against Narayanan et al.'s published
// weak-scaling table (megatron.go); Auto searches its layouts too.
//
// Compare sets a plan beside what its run measured (a metrics.Summary),
// with the error in percent of the measured (ErrorPct); the MFU it
// predicts is metrics.MFU, the rule the run's summary uses.
package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/spec"
)

// Request is what a plan is made for.
type Request struct {
	Config config.Config
	Vocab  int // the tokenizer's vocabulary (data.Data.Vocab), before padding
	Nodes  int // nodes the ranks spread over; 0 means 1
	Device Device
}

// Plan is the prediction for one run. Memory is per rank: every rank of
// the job holds the same sizes (the vocabulary is padded to split evenly),
// but for a pipeline's, whose stages differ (Stages).
type Plan struct {
	Model       string `json:"model"`
	Preset      string `json:"preset,omitempty"`
	Layers      int    `json:"layers"`
	Dim         int    `json:"dim"`
	Heads       int    `json:"heads"`
	Seq         int    `json:"seq"`
	Vocab       int    `json:"vocab"`
	PaddedVocab int    `json:"padded_vocab"`
	BatchSize   int    `json:"bsz"`
	GradAccum   int    `json:"grad_accum"` // micro-batches a step (a pipeline's micro_batches)
	Precision   string `json:"precision"`
	NTasks      int    `json:"ntasks"`
	TP          int    `json:"tp"`
	DP          int    `json:"dp"`
	PP          int    `json:"pp,omitempty"` // pipeline stages (0: none); Memory and Time are one stage's
	Nodes       int    `json:"nodes"`
	// SP is sequence parallelism (--sp) and Zero the ZeRO stage (--zero:
	// 0 to 3), as the config asks; ZeroShards the data-parallel ranks ZeRO
	// shards over (DP, or the group of hybrid sharding).
	SP         bool `json:"sp,omitempty"`
	Zero       int  `json:"zero,omitempty"`
	ZeroShards int  `json:"zero_shards,omitempty"`
	// Recompute is the activation recomputation (--recompute): "",
	// selective or full.
	Recompute string `json:"recompute,omitempty"`
	Params    int64  `json:"params"` // of the whole model

	Device Device `json:"device"`
	// Memory is a rank's memory: with a pipeline, that of the stage that
	// needs the most (Stages has each).
	Memory Memory `json:"memory"`
	// Stages are the pipeline's stages (none without one).
	Stages []Stage `json:"stages,omitempty"`
	// Fits says whether Memory.Total is within the device's memory;
	// Headroom is what is left (negative: how much is missing).
	Fits     bool  `json:"fits"`
	Headroom int64 `json:"headroom_bytes"`

	// Time is the step: with a pipeline, the slowest stage's.
	Time  Time     `json:"time"`
	Notes []string `json:"notes,omitempty"`
	// Scale is set by AtScale, the plan at cluster scale (nil for New's).
	Scale *Scale `json:"scale,omitempty"`
}

// Stage is one pipeline stage's prediction, for a rank of it.
type Stage struct {
	Stage  int `json:"stage"`
	Blocks int `json:"blocks"`
	// InFlight is the micro-batches whose activations the stage holds at
	// once in the 1F1B schedule: pp - stage.
	InFlight int    `json:"in_flight"`
	Memory   Memory `json:"memory"`
	Time     Time   `json:"time"`
}

// Memory is one rank's memory in bytes, by what it holds.
type Memory struct {
	Params int64 `json:"params"` // this rank's shard of the weights
	Grads  int64 `json:"grads"`  // their gradients
	// Optimizer is AdamW's two moments: of every parameter, or with
	// ZeRO of this data-parallel rank's range of every gradient bucket
	// (each bucket padded to a multiple of ZeRO's ranks).
	Optimizer int64 `json:"optimizer"`
	Masters   int64 `json:"masters"` // fp32 master weights: 0, the weights are fp32
	// ActivationsPerBlock is what one transformer block keeps for its
	// backward and uses in it for one micro-batch (inputs of each product,
	// attention probabilities, their gradients), with the tensor-parallel
	// split (and with sequence parallelism the region outside attention
	// and MLP split along the sequence); SavedPerBlock is the part of it
	// the forward keeps for the backward, the rest being scratch (the
	// backward's, the projections' outputs the residual adds read at
	// once). Blocks is the blocks' total: the saved part times the
	// layers (on a pipeline stage holding k micro-batches in flight, k
	// times that), and the scratch, which the blocks share, once.
	ActivationsPerBlock int64 `json:"activations_per_block"`
	SavedPerBlock       int64 `json:"saved_per_block"`
	Blocks              int64 `json:"blocks"`
	// Embeddings are the embedding outputs, the residual stream's
	// gradients and the final layer norm; on a pipeline stage those its
	// layers hold (the embeddings' outputs once per micro-batch in flight
	// on the first stage), and on the others the stage's inputs, one per
	// micro-batch in flight.
	Embeddings int64 `json:"embeddings"`
	// Logits are the head's output and the cross-entropy's buffers (the
	// vocab-parallel logits of an LM, which its loss overwrites with their
	// gradient; the pooled classifier's small tensors and gradients).
	Logits int64 `json:"logits"`
	// SPBuffers are the sequence-parallel region's shared buffers (0
	// without --sp): the all-gather's packed and gathered (B,T,C), the
	// full-sequence (B,T,C) the row-parallel layers and the embedding
	// reduce-scatter from, the (B,T/tp,C) an accumulating reduce-scatter
	// lands in, and the bucket that sums the layer norms' and the position
	// table's gradients over tp.
	SPBuffers int64 `json:"sp_buffers"`
	// Workspace is the GPU kernels' scratch (reduction partials, staged
	// ids); 0 on the CPU.
	Workspace int64 `json:"workspace"`
	// StepScalars are the training step's gradient norm (each parameter's
	// float64 squares, their all-gather) and scalars, on every device.
	StepScalars int64 `json:"step_scalars"`
	// GradBucket is the device buffer the data-parallel gradient
	// all-reduce packs buckets into (dp > 1, when a bucket holds more than
	// one gradient, or every bucket as bfloat16 under grad_reduce bf16;
	// with ZeRO the biggest bucket that is packed, padded, and its 1/dp
	// range, and four scalars on a GPU; under grad_reduce bf16 also the
	// biggest bucket, padded, and its range in bfloat16).
	GradBucket int64 `json:"grad_bucket"`
	// EnginePeak is what the engine's accounting (tensor.MemStats.Peak,
	// mem_peak_bytes in the metrics) counts: everything above.
	EnginePeak int64 `json:"engine_peak"`
	// CommBuffers are the communication library's own buffers (NCCL's per
	// communicator on a GPU; on the CPU, whose collectives work in the
	// tensors' own memory, only the host staging of bfloat16 packed two a
	// word: the dp bucket under grad_reduce bf16, or with ZeRO its
	// reduce-scatter's ranges, sequence parallelism's gathers of bf16 norm
	// outputs). A GPU over the host collectives
	// (--comm tcp) stages more, uncounted, and pads a bf16 bucket's odd
	// element, which DPBytes does not count there.
	CommBuffers int64 `json:"comm_buffers"`
	// Context is the CUDA context and library handles; 0 on the CPU.
	Context int64 `json:"context"`
	// Total is what the rank needs of its device: EnginePeak plus the
	// comm buffers and the context.
	Total int64 `json:"total"`
}

// Time is the predicted optimizer step, for one rank (all ranks alike).
type Time struct {
	// GemmFlops are the matrix-product FLOPs of one rank in one step.
	GemmFlops float64 `json:"gemm_flops"`
	// Rate is the FLOP/s the GEMMs are taken to run at: the peak of the
	// units the precision uses (fp32, or a GPU's tf32 or bf16 tensor
	// cores) times the efficiency, or the measured rates of the shapes.
	Rate float64 `json:"rate_flops"`
	// ComputeS is the GEMMs' time; MemoryS the elementwise kernels' and
	// the optimizer's, bound by memory bandwidth.
	ComputeS float64 `json:"compute_s"`
	MemoryS  float64 `json:"memory_s"`
	// CommS is the collectives' time: TPBytes and DPBytes are what one
	// rank sends in the tensor- and data-parallel groups (ring all-reduce:
	// 2(p-1)/p of each tensor; all-gather and reduce-scatter (p-1)/p of
	// the full tensor), Collectives how many it takes part in.
	CommS       float64 `json:"comm_s"`
	TPBytes     float64 `json:"tp_bytes"`
	DPBytes     float64 `json:"dp_bytes"`
	Collectives int     `json:"collectives"`
	// PPBytes are what a pipeline stage's rank sends its neighbours
	// point-to-point in a step (part of CommS): each micro-batch's output,
	// (B,T,C) or (B,T/tp,C) under sequence parallelism, to the next stage
	// (2 bytes an element at bf16; the host links pad an odd count to a
	// whole word, which C even never needs) and the gradient of its
	// input, of the same size, float32, to the previous one; Transfers
	// counts those messages.
	PPBytes   float64 `json:"pp_bytes,omitempty"`
	Transfers int     `json:"transfers,omitempty"`
	// Bubble is the 1F1B schedule's idle share, (p-1)/(m+p-1), and
	// BubbleS the time it adds: the micro-batches' compute, memory traffic
	// and communication, m of them, take as long as m+p-1.
	Bubble  float64 `json:"bubble,omitempty"`
	BubbleS float64 `json:"bubble_s,omitempty"`
	// TurnS is the part of CommS that ranks sharing cores spend waiting
	// in collectives while the others run: it overlaps their work.
	TurnS float64 `json:"turn_s,omitempty"`
	// StepS is ComputeS + MemoryS + CommS - TurnS + BubbleS.
	StepS float64 `json:"step_s"`
	// CommShare is CommS / StepS, the share hpcrun metrics measures: the
	// engine does not overlap its collectives with its work, but ranks
	// taking turns on shared cores wait in them while others work (TurnS).
	CommShare float64 `json:"comm_share"`
	// CommRates says, per group, the latency and bandwidth CommS takes
	// and whether hpcrun bench comm measured them.
	CommRates string `json:"comm_rates,omitempty"`
	// Warnings say which collectives' rates the time takes are not
	// measured, old, or of another CPU, with the command that measures them.
	Warnings []string `json:"warnings,omitempty"`
	// TokensPerS is the job's (all data-parallel replicas).
	TokensPerS float64 `json:"tokens_per_s"`
	// FlopsPerToken is spec.ModelFlopsPerToken, the convention MFU uses in
	// hpcrun metrics; PeakFlops the device's peak at the run's precision.
	FlopsPerToken float64 `json:"flops_per_token"`
	PeakFlops     float64 `json:"peak_flops"`
	MFU           float64 `json:"mfu"` // metrics.MFU, the rule a run's summary uses
	// HardwareFlopsPerToken is spec.HardwareFlopsPerToken: the model's
	// and the forward recomputation runs again; HFU is metrics.HFU of it.
	HardwareFlopsPerToken float64 `json:"hardware_flops_per_token"`
	HFU                   float64 `json:"hfu"`
}

const f32 = 4 // bytes of a float32 (bf16's are scale.go's)

// ncclBuffers is NCCL's memory per communicator: send and receive buffers
// of NCCL_BUFFSIZE (4 MiB) on each of its channels (about 16 on NVLink).
const ncclBuffers = 2 * 16 * 4 * mib

// New predicts the run of r. The config must be valid (config.Config.Validate)
// and the vocabulary known.
func New(r Request) (*Plan, error) {
	cfg := r.Config
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r.Vocab < 1 {
		return nil, fmt.Errorf("plan: vocab %d: must be at least 1", r.Vocab)
	}
	if r.Device.FP32Flops <= 0 || r.Device.MemBytes <= 0 {
		return nil, fmt.Errorf("plan: device %q has no rate or no memory", r.Device.Name)
	}
	nodes := max(r.Nodes, 1)
	vp, err := parallel.PadVocab(r.Vocab, cfg.TP)
	if err != nil {
		return nil, err
	}
	p := &Plan{
		Model: cfg.Model, Preset: cfg.Preset, Layers: cfg.Layers, Dim: cfg.Dim, Heads: cfg.Heads, Seq: cfg.Seq,
		Vocab: r.Vocab, PaddedVocab: vp, BatchSize: cfg.BatchSize, GradAccum: cfg.Micro(), Precision: cfg.Precision,
		NTasks: cfg.NTasks, TP: cfg.TP, DP: cfg.DP(), PP: cfg.PP, Nodes: nodes, SP: cfg.SP, Zero: cfg.Zero,
		Recompute: recomputeName(cfg),
		Params:    spec.ParamCount(cfg, r.Vocab), Device: r.Device,
	}
	split, err := stageSplit(cfg)
	if err != nil {
		return nil, err
	}
	// The gradient norm's list is padded to the stages' longest.
	var entries int64
	stages := make([]shapes, len(split))
	for stage, blocks := range split {
		fused := r.Device.CUDA && r.Device.BF16Flops > 0 && cfg.AttentionFusedOnGPU()
		if stages[stage], err = newShapes(cfg, vp, stage, blocks, ranksPerNode(cfg, r.Nodes), fused); err != nil {
			return nil, err
		}
		entries = max(entries, stages[stage].normTensors())
	}
	for stage, s := range stages {
		s.normEntries = entries
		m, t := s.memory(r.Device), s.time(cfg, r.Vocab, r.Device, nodes)
		if stage == 0 || m.Total > p.Memory.Total {
			p.Memory = m
		}
		if stage == 0 || t.StepS > p.Time.StepS {
			p.Time = t
		}
		if len(split) > 1 {
			p.Stages = append(p.Stages, Stage{Stage: stage, Blocks: split[stage], InFlight: int(s.inFlight), Memory: m, Time: t})
		}
	}
	if stages[0].zero {
		p.ZeroShards = int(stages[0].zdp)
	}
	p.Headroom = r.Device.MemBytes - p.Memory.Total
	p.Fits = p.Headroom >= 0
	modes := ""
	if cfg.SP && cfg.TP > 1 {
		modes += fmt.Sprintf("; sequence parallelism splits the layer norms' and residuals' activations over tp %d", cfg.TP)
	}
	if s := stages[0]; s.zero {
		kept := "the AdamW moments"
		switch {
		case s.zero3:
			kept = "the blocks' weights and gradients and of the AdamW moments, one block gathered whole at a time"
		case s.zero2:
			kept = "the blocks' gradients and of the AdamW moments"
		}
		modes += fmt.Sprintf("; ZeRO-%d keeps 1/%d of %s", cfg.Zero, s.zdp, kept)
	}
	if pp := cfg.Stages(); pp > 1 {
		p.Notes = append(p.Notes, fmt.Sprintf("pp %d: memory is the stage that needs the most, stage s holding the activations of pp-s micro-batches in flight; the step is the slowest stage's, stretched by the 1F1B bubble (p-1)/(m+p-1) = %.2f, with the point-to-point transfers; it leaves out the tied embedding's gradient all-reduce between the first and the last stage and the small collectives over the stages (the loss, the gradient norm)",
			pp, parallel.BubbleFraction(pp, cfg.Micro())))
	} else if cfg.RecomputeMode() == parallel.RecomputeNone {
		p.Notes = append(p.Notes, "activations: no recomputation (--recompute none); every block keeps its own"+modes)
	}
	switch cfg.RecomputeMode() {
	case parallel.RecomputeSelective:
		p.Notes = append(p.Notes, "recompute selective: the blocks keep no attention probabilities, the backward computes them again (the time counts those products twice), and the blocks share one backward scratch"+modes)
	case parallel.RecomputeFull:
		p.Notes = append(p.Notes, "recompute full: each block keeps only its output, the backward runs its forward again (the time counts the blocks' forward products and tensor-parallel collectives twice), and the blocks share every other buffer"+modes)
	}
	if cfg.Arch == "hf" {
		p.Notes = append(p.Notes, "arch hf: the plan models hpcrun's own BERT layout; BERT's (token types, embedding layer norm, pooler) differs by a few small tensors")
	}
	switch {
	case cfg.Precision == "fp32":
	case !r.Device.CUDA:
		p.Notes = append(p.Notes, fmt.Sprintf("precision %s: the CPU computes every product in fp32; the plan times it so", cfg.Precision))
		if cfg.Precision == "bf16" {
			p.Notes = append(p.Notes, "precision bf16: the products read bf16 copies of the weights (fp32 masters) and the activations only products read are stored in bf16 (the MLP's pre-activation and hidden one, the attention's Q, K and V, its unfused probabilities and its output, the norms' outputs, a language model's logits), which the memory counts")
		}
	case cfg.Precision == "bf16" && r.Device.BF16Flops == 0, cfg.Precision == "tf32" && r.Device.TF32Flops == 0:
		p.Notes = append(p.Notes, fmt.Sprintf("precision %s: %s has no %s tensor cores; the run will refuse it (use fp32)", cfg.Precision, r.Device.Name, cfg.Precision))
	case cfg.Precision == "bf16":
		p.Notes = append(p.Notes, "precision bf16: the engine keeps bf16 copies of the weights beside their fp32 masters and stores the activations only products and the activation and attention kernels read in bf16 (the MLP's pre-activation and hidden one, the attention's Q, K and V, its unfused probabilities and its output, the norms' outputs, which sequence parallelism all-gathers as bf16, a language model's logits, whose gradient the loss writes over them, and the pre-norm blocks' residual stream) and the MLP's hidden gradients (GELU's, written in place, or a Llama's two), the attention's gradients of its output and of Q, K and V (fp32 in an unfused grouped-query attention), the unfused attention's scores' gradient, the residual stream's gradient (which pipeline stages and sequence parallelism send as bf16, and each block turns in place into its input's; BERT's post-norm layers keep an fp32 stream, which their output projections round to bf16 once for their two products), the norms' outputs' gradients and the embeddings' output; the other gradients and activations are fp32, which each GEMM converts to bf16 (the copies, the bf16 activations and the operand scratch count in the memory, the conversion in the time); time and MFU at the bf16 peak (measured on an H200 before the bf16 storage: slower than tf32, 0.157 against 0.138 s for GPT-2 124M at 16 x 1024)")
	case cfg.Precision == "tf32":
		p.Notes = append(p.Notes, "precision tf32: float32 GEMMs on the tensor cores (10-bit mantissa products, float32 sums); time and MFU at the tf32 peak")
	}
	return p, nil
}

// shapes are the sizes the buffers are made of, for one rank.
type shapes struct {
	cfg        config.Config
	vp         int            // the padded vocabulary
	blk        parallel.Sizes // one block's buffers (parallel.BlockSizes)
	recompute  parallel.Recompute
	fusedAttn  bool // attention in the GPU's fused kernels (not cuBLAS products)
	gpt        bool // a language model (gpt or llama): the LM head and loss
	llama      bool // RMSNorms, no position table, the head tied or not
	tied       bool // the LM head is the token embedding
	B, T, C, L int64
	N          int64 // tokens of a micro-batch, B*T
	P          int64 // rows of the position table (config.Config.PositionRows)
	cl, fl, vl int64 // this rank's attention width, MLP width, vocab slice
	tp, dp     int64
	// A pipeline's stage (pp > 1): the shapes are its (L its blocks); it
	// holds the embeddings when first, ln_f and the head when last (one
	// stage is both), and the activations of inFlight micro-batches.
	pp, stage   int64
	first, last bool
	inFlight    int64
	m           int64 // micro-batches a step
	sp, zero    bool  // sequence parallelism (tp > 1); ZeRO, any stage (dp > 1)
	zdp         int64 // the data-parallel ranks ZeRO shards over (config.Config.ZeroShards)
	zero2       bool  // ZeRO-2 (and 3): each block's gradients reduce-scattered as its backward ends
	zero3       bool  // ZeRO-3: each block's values gathered before its forward and its backward
	// params are this rank's parameter tensors' elements in the model's
	// order (train's model.Params); buckets the gradient buckets
	// train.NewGradSync packs them into (parallel.GradBuckets).
	params     []int64
	buckets    []parallel.Bucket
	paramElems int64
	// copyElems are the elements of the bf16 copies of the weights the
	// products read (spec.Compute), each its own; sharedCopy says the
	// blocks' share one buffer (ZeRO-3), the size of their shared values.
	copyElems  int64
	sharedCopy bool
	// linears are one block's weight products (spec.BlockLinears).
	linears []spec.Linear
	// seqReduce are the floats of the gradients sequence parallelism sums
	// over tp (spec.Param.SeqReduce), blockSeqReduce one block's of them.
	seqReduce, blockSeqReduce int64
	// normEntries is the length of the gradient norm's list of squares:
	// the longest stage's normTensors.
	normEntries int64
}

// newShapes are the shapes of a rank of stage (0 without a pipeline),
// which holds blocks blocks; its parameters are the spec's
// (spec.StageParams).
func newShapes(cfg config.Config, paddedVocab, stage, blocks, ranksPerNode int, fusedAttention bool) (shapes, error) {
	tp := int64(cfg.TP)
	C := int64(cfg.Dim)
	s := shapes{
		cfg: cfg, vp: paddedVocab,
		gpt: cfg.LM(), llama: cfg.Model == "llama",
		B: int64(cfg.BatchSize), T: int64(cfg.Seq), C: C, L: int64(blocks), P: int64(cfg.PositionRows()),
		pp: int64(cfg.Stages()), stage: int64(stage), m: int64(cfg.Micro()),
		tp: tp, dp: int64(cfg.DP()),
		cl: C / tp, fl: int64(cfg.Hidden()) / tp, vl: int64(paddedVocab) / tp,
	}
	s.tied = s.gpt && !(s.llama && cfg.UntiedHead)
	s.first, s.last = s.stage == 0, s.stage == s.pp-1
	s.recompute, s.fusedAttn = cfg.RecomputeMode(), fusedAttention
	if s.llama {
		shape := cfg.LlamaBlockShape()
		shape.FusedAttention, shape.Activations = fusedAttention, spec.Compute(cfg)
		s.blk = parallel.LlamaBlockSizes(shape, cfg.BatchSize, cfg.Seq)
	} else {
		s.blk = parallel.BlockSizes(parallel.BlockShape{Dim: cfg.Dim, Heads: cfg.Heads, TP: cfg.TP, SP: cfg.SP && tp > 1, Recompute: s.recompute,
			FusedAttention: fusedAttention, Activations: spec.Compute(cfg), PostNorm: cfg.Arch == "hf"}, cfg.BatchSize, cfg.Seq)
	}
	s.inFlight = s.pp - s.stage // parallel.OneFOneB's bound (1 without a pipeline)
	s.sp = cfg.SP && tp > 1
	s.zero = cfg.Zero > 0 && s.dp > 1
	s.zero2 = cfg.Zero >= 2 && s.dp > 1
	s.zero3 = cfg.Zero == 3 && s.dp > 1
	s.zdp = s.dp
	if s.zero {
		shards, err := cfg.ZeroShards(ranksPerNode)
		if err != nil {
			return shapes{}, err
		}
		s.zdp = int64(shards)
	}
	s.N = s.B * s.T
	ps, err := spec.StageParams(cfg, paddedVocab, 0, s.first, s.last, 0, blocks)
	if err != nil {
		return shapes{}, err
	}
	s.params = spec.LocalElems(ps)
	firstBlock := -1
	for i, p := range ps {
		if firstBlock < 0 && p.Block >= 0 {
			firstBlock = p.Block
		}
		if p.SeqReduce {
			s.seqReduce += s.params[i]
			if p.Block >= 0 && p.Block == firstBlock {
				s.blockSeqReduce += s.params[i]
			}
		}
	}
	for _, n := range s.params {
		s.paramElems += n
	}
	if spec.Compute(cfg) == tensor.BFloat16 {
		for i, p := range ps {
			switch {
			case !p.Product:
			case s.zero3 && p.Block >= 0:
				s.sharedCopy = true // one copy the blocks share, as their values
			default:
				s.copyElems += s.params[i]
			}
		}
	}
	s.buckets = parallel.GradBuckets(s.params, 0)
	if s.zero2 {
		block := make([]int, len(ps))
		for i, p := range ps {
			block[i] = p.Block
		}
		s.buckets = parallel.BlockBuckets(s.params, block, 0)
	}
	if s.linears, err = spec.BlockLinears(cfg, paddedVocab, fusedAttention); err != nil {
		return shapes{}, err
	}
	return s, nil
}

// blockBytes are the bytes one block allocates for a micro-batch: what
// its forward keeps for the backward (blockSavedBytes) and the backward's
// scratch (blockScratchBytes). Every size here is in bytes: a buffer's
// dtype (parallel.Buffer.DType) says how many each element takes.
func (s shapes) blockBytes() int64 { return s.blockSavedBytes() + s.blockScratchBytes() }

// blockSavedBytes are the bytes a block's forward keeps for its backward
// (parallel.BlockSizes lists each buffer of the block and its layers, with
// why it exists).
func (s shapes) blockSavedBytes() int64 { return s.blk.Saved.Bytes() }

// blockScratchBytes are the bytes of a block's scratch, which nothing
// outlives the call that wrote it (shared by the blocks and the copies of
// a pipeline stage).
func (s shapes) blockScratchBytes() int64 { return s.blk.Scratch.Bytes() }

// embeddingBytes are the stage's buffers outside the blocks and the head
// for k micro-batches in flight: the model's residual stream gradients
// (spec.ModelBuffers); on the first stage wte's and wpe's outputs
// (spec.TokenEmbeddingOut, spec.PositionEmbeddingOut), k times; on the
// others the stage inputs (spec.StageActivation), k of
// them; on the last ln_f's.
func (s shapes) embeddingBytes(k int64) int64 {
	stream, _ := spec.ModelBuffers(s.cfg, s.last)
	e := stream.Bytes()
	B, Tl, C := s.cfg.BatchSize, s.cfg.LocalSeq(), s.cfg.Dim
	if s.first {
		e += k * parallel.EmbeddingSizes(B, Tl, C, spec.TokenEmbeddingOut(s.cfg)).Bytes()
		if !s.llama {
			e += k * parallel.EmbeddingSizes(B, Tl, C, spec.PositionEmbeddingOut(s.cfg)).Bytes()
		}
	} else {
		e += k * spec.StageActivation(s.cfg).Bytes()
	}
	switch {
	case s.last && s.llama:
		e += parallel.RMSNormSizes(B, Tl, C, s.lnfOut()).Bytes()
	case s.last:
		e += parallel.LayerNormSizes(B, Tl, C, s.lnfOut()).Bytes()
	}
	return e
}

// lnfOut is what ln_f stores its output as: the products' dtype when only
// the LM head's products (and under sequence parallelism the all-gather
// into them, which carries it as it is) read it, not the classifier's
// pooling; else Float32.
func (s shapes) lnfOut() tensor.DType {
	if s.gpt {
		return spec.Compute(s.cfg)
	}
	return tensor.Float32
}

// headBytes are the head's and the loss's buffers on the last stage. GPT:
// the LM head (a column-parallel layer over the padded vocabulary, whose
// logits the loss overwrites with their gradient), the vocab-parallel
// cross-entropy over B*T rows.
// BERT: the model's pooling buffers, the classifier's fc1 (column-parallel)
// and fc2 (row-parallel) on the (B,1,C) pooled mean, the cross-entropy over
// its B rows of 2 logits.
func (s shapes) headBytes() int64 {
	if !s.last {
		return 0
	}
	_, head := spec.ModelBuffers(s.cfg, true)
	B, T, C, tp := s.cfg.BatchSize, s.cfg.Seq, s.cfg.Dim, int(s.tp)
	e := head.Bytes()
	if s.gpt {
		e += parallel.ColumnSizes(parallel.LinearShape{In: C, Out: s.vp, TP: tp, SP: s.sp, OutDType: spec.Logits(s.cfg)}, B, T).Bytes()
		return e + parallel.CrossEntropySizes(B*T).Bytes()
	}
	e += parallel.ColumnSizes(parallel.LinearShape{In: C, Out: C, TP: tp}, B, 1).Bytes()
	e += parallel.RowSizes(parallel.LinearShape{In: C, Out: config.NumClasses, TP: tp, InputIsParallel: true}, B, 1).Bytes()
	return e + parallel.CrossEntropySizes(B).Bytes()
}

// spBytes are the sequence-parallel region's shared buffers
// (parallel.SequenceParallelSizes), its ReduceGrads bucket holding the
// gradients summed over tp (seqGrads).
func (s shapes) spBytes() int64 {
	if !s.sp {
		return 0
	}
	return parallel.SequenceParallelSizes(s.cfg.BatchSize, s.cfg.Seq, s.cfg.Dim, int(s.tp), int(s.seqGrads()), spec.NormOut(s.cfg)).Bytes()
}

// seqGrads are the floats of the gradients summed over tp under sequence
// parallelism (spec.Param.SeqReduce): the blocks' norms, ln_f's on the
// last stage, the position table's on the first.
func (s shapes) seqGrads() int64 { return s.seqReduce }

// normTensors is how many parameters the stage counts in the gradient
// norm: all of its own but, on the last stage of a GPT pipeline, its copy
// of the tied embedding (the first stage counts it).
func (s shapes) normTensors() int64 {
	n := int64(len(s.params))
	if s.tied && s.last && !s.first {
		n--
	}
	return n
}

// zeroSizes are, in elements, this data-parallel rank's ranges of the
// gradient buckets (train.ZeRO: each bucket padded to a multiple of dp),
// the largest padded bucket, and all the padded buckets.
func (s shapes) zeroSizes() (local, biggest, padded int64) {
	for _, b := range s.buckets {
		per := (b.Elems + s.zdp - 1) / s.zdp
		local += per
		biggest = max(biggest, per*s.zdp)
		padded += per * s.zdp
	}
	return local, biggest, padded
}

func (s shapes) memory(dev Device) Memory {
	m := Memory{
		Params:              s.paramElems * f32,
		Grads:               s.paramElems * f32,
		Optimizer:           2 * s.paramElems * f32,
		ActivationsPerBlock: s.blockBytes(),
		SavedPerBlock:       s.blockSavedBytes(),
		Embeddings:          s.embeddingBytes(s.inFlight),
		Logits:              s.headBytes(),
		SPBuffers:           s.spBytes(),
	}
	if s.zero {
		local, _, _ := s.zeroSizes()
		m.Optimizer = 2 * local * f32
	}
	if s.zero2 {
		// The blocks' gradients: one buffer they share (the largest
		// block's, padded to a multiple of dp) and this rank's range of
		// each; the others' whole.
		var shared, ranges, blocks int64
		for _, b := range s.buckets {
			if b.Block {
				per := (b.Elems + s.zdp - 1) / s.zdp
				shared, ranges, blocks = max(shared, per*s.zdp), ranges+per, blocks+b.Elems
			}
		}
		m.Grads = (s.paramElems - blocks + shared + ranges) * f32
		if s.zero3 {
			m.Params = m.Grads // the values held as the gradients are
		}
		if s.sharedCopy {
			m.Params += shared * bf16
		}
	}
	m.Params += s.copyElems * bf16
	// The blocks share one backward scratch (parallel.Block.ShareBuffers).
	m.Blocks = 0
	if s.L > 0 {
		m.Blocks = s.L*s.inFlight*s.blockSavedBytes() + s.blockScratchBytes()
	}
	// train.GradSync's biggest bucket, allocated when a bucket packs more
	// than one gradient (one is all-reduced in place); or, with ZeRO,
	// train.ZeRO's biggest packed bucket, padded, and its 1/dp range (a
	// bucket of one tensor that needs no padding runs in place); on the
	// GPU also ZeRO's four device scalars.
	var bucket int64
	multi := false
	for _, b := range s.buckets {
		bucket = max(bucket, b.Elems)
		multi = multi || b.Tensors > 1
	}
	// train's gradNorm: the float64 squares of the norm's list, their
	// all-gather over the largest group it sums or joins over (tp, ZeRO's
	// dp ranks, pp), and the norm, the clip scale and the loss.
	n, widest := 2*max(s.normEntries, 1), max(s.tp, s.pp)
	if s.zero {
		widest = max(widest, s.zdp)
	}
	m.StepScalars = (n + 4) * f32
	if widest > 1 {
		m.StepScalars += n * widest * f32
	}
	if s.pp > 1 && !s.last {
		// A stage that sends activations copies them into a send buffer of
		// its own.
		m.Embeddings += spec.StageActivation(s.cfg).Bytes()
	}
	switch {
	case s.zero:
		// ZeRO-2's block buckets gather in the blocks' shared gradients,
		// and stage their ranges in the range buffer.
		packed, staged := int64(0), int64(0)
		for _, b := range s.buckets {
			switch {
			case b.Block:
				staged = max(staged, (b.Elems+s.zdp-1)/s.zdp)
			case b.Tensors > 1 || b.Elems%s.zdp != 0:
				packed = max(packed, (b.Elems+s.zdp-1)/s.zdp*s.zdp)
			}
		}
		m.GradBucket = (packed + max(packed/s.zdp, staged)) * f32
		if s.cfg.GradReduceBF16() {
			// train.ZeRO.ReduceInBF16: the largest bucket, padded, rounded
			// to bfloat16, and its range.
			_, biggest, _ := s.zeroSizes()
			m.GradBucket += 2 * (biggest + biggest/s.zdp)
		}
	case s.dp > 1 && s.cfg.GradReduceBF16():
		// Every bucket rounded into a bfloat16 buffer.
		m.GradBucket = bucket * 2
	case s.dp > 1 && multi:
		m.GradBucket = bucket * f32
	}
	if dev.CUDA {
		// Reduction partials of the layer norm backward (2 x SMs blocks of
		// 2C floats; its rows are T/tp positions under sequence
		// parallelism) and of the grad norm (128 float64 per tensor),
		// staged ids and targets.
		rows := s.N
		if s.sp {
			rows /= s.tp
		}
		parts := int64(2) // LayerNorm's dweight and dbias; RMSNorm's dweight
		if s.llama {
			parts = 1
		}
		m.Workspace = min(rows, int64(2*dev.SMs))*parts*s.C*f32 + int64(len(s.params))*128*8 + 2*s.N*4
		if s.cfg.Precision == "bf16" {
			m.Workspace += s.bf16Operands()
		}
		groups := int64(0)
		if s.tp > 1 {
			groups++
		}
		if s.dp > 1 {
			groups++
		}
		if s.pp > 1 {
			// The pipeline: one NCCL communicator per neighbour.
			if !s.first {
				groups++
			}
			if !s.last {
				groups++
			}
		}
		m.CommBuffers = groups * ncclBuffers
		m.Context = dev.ContextBytes
	} else {
		// The host collectives carry bfloat16 packed two a float32 word,
		// staged in host memory (parallel.Group's words): the dp bucket
		// under grad_reduce bf16 (with ZeRO its reduce-scatter's ranges),
		// and sequence parallelism's gathers of
		// bfloat16 norm outputs (this rank's (B,T/tp,C) and the tp
		// gathered).
		words := func(n int64) int64 { return (n + 1) / 2 * f32 }
		switch {
		case s.zero && s.cfg.GradReduceBF16():
			// The reduce-scatter's every range, each from a word of its
			// own, and the range it leaves; under hybrid sharding the
			// replicas' all-reduce of that range.
			_, biggest, _ := s.zeroSizes()
			m.CommBuffers += (s.zdp + 1) * words(biggest/s.zdp)
			if s.dp > s.zdp {
				m.CommBuffers += words(biggest / s.zdp)
			}
		case s.dp > 1 && s.cfg.GradReduceBF16():
			m.CommBuffers += words(bucket)
		}
		if s.sp && spec.NormOut(s.cfg) == tensor.BFloat16 {
			m.CommBuffers += (1 + s.tp) * words(s.N/s.tp*s.C)
		}
	}
	m.EnginePeak = m.Params + m.Grads + m.Optimizer + m.Masters + m.Blocks + m.Embeddings + m.Logits + m.SPBuffers + m.Workspace + m.GradBucket + m.StepScalars
	m.Total = m.EnginePeak + m.CommBuffers + m.Context
	return m
}

// activationBytes are all the activation bytes of a micro-batch.
func (s shapes) activationBytes() int64 {
	return s.L*s.blockBytes() + s.embeddingBytes(1) + s.headBytes()
}

// activationTouches is how many times the step reads or writes each
// activation byte in its elementwise kernels, on average.
const activationTouches = 3

func (s shapes) time(cfg config.Config, vocab int, dev Device, nodes int) Time {
	var t Time
	accum := float64(cfg.Micro())
	N, C, B := float64(s.N), float64(s.C), float64(s.B)
	tp := float64(s.tp)
	// The path within a node: shared memory, or the TCP ring when the
	// config asks for it; a group spanning nodes takes the network.
	local := PathShm
	if cfg.Comm == "tcp" {
		local = PathTCP
	}
	across := local
	if nodes > 1 {
		across = PathNet
	}
	var froms []string
	// The share of the work between two collectives that their ranks wait
	// for the slowest: the largest group's.
	var skew float64
	// The micro-batch's products (s.gemms: its blocks' forward and
	// backward, what recomputation runs again, the head's on the last
	// stage), each at its shape's rate where the device has them.
	gs := s.gemms()
	t.GemmFlops = gemmFlops(gs) * accum
	t.ComputeS = dev.gemmSeconds(gs) * accum
	// The fused attention's products run on bf16 tensor cores at tf32 too
	// (only a GPU with them plans it).
	var fusedS float64
	if f := s.fusedAttentionFlops(); f > 0 {
		fusedS = accum * f / (dev.BF16Flops * dev.Efficiency)
		t.GemmFlops += accum * f
		t.ComputeS += fusedS
	}
	// convertS is bf16's operand conversion, an elementwise kernel a GEMM.
	var convertS float64
	switch {
	case cfg.Precision == "tf32" && dev.Rates == nil && dev.TF32Flops > 0:
		// A GPU's tensor cores on float32 operands.
		t.ComputeS = gemmFlops(gs)*accum/(dev.TF32Flops*dev.Efficiency) + fusedS
	case cfg.Precision == "bf16" && dev.Rates == nil && dev.BF16Flops > 0:
		// A GPU's tensor cores on bf16 copies of the operands, which a
		// kernel writes first (4 bytes read and 2 written an element),
		// but for the operands stored as bf16; and the output
		// projections' gradients where their layers round them once
		// (BERT's post-norm layers, spec.Linear.GradRounded).
		t.ComputeS = t.GemmFlops / (dev.BF16Flops * dev.Efficiency) // fusedS included
		convertS = accum * 6 * float64(operandElems(gs)-s.storedBF16OperandElems()+s.roundedGradElems()) / dev.MemBandwidth
	}
	t.Rate = t.GemmFlops / t.ComputeS
	// Elementwise kernels touch the activations a few times per
	// micro-batch; AdamW reads weight, gradient and moments and writes
	// three of them back (with ZeRO-1 of this rank's ranges only); the
	// gradient is zeroed or overwritten once.
	adam := s.paramElems
	if s.zero {
		adam, _, _ = s.zeroSizes()
	}
	actS := accum*activationTouches*float64(s.activationBytes())/dev.MemBandwidth + convertS
	t.MemoryS = actS + float64(7*adam)*f32/dev.optBandwidth() + float64(s.paramElems)*f32/dev.MemBandwidth
	// What the micro-batches take, the part a pipeline's bubble stretches.
	microS := t.ComputeS + actS

	// A ring all-reduce sends 2(p-1)/p of the tensor a rank, an
	// all-gather (p-1)/p of the gathered tensor and a reduce-scatter
	// (p-1)/p of the tensor reduced.
	half := func(p float64) float64 { return (p - 1) / p }
	// The floats an element of the norms' outputs and of ln_f's takes on
	// the wire: 0.5 where they are bf16.
	normFloats, lnfFloats := float64(spec.NormOut(cfg).Size())/f32, float64(s.lnfOut().Size())/f32
	dp := float64(cfg.DP())
	if s.tp > 1 {
		// Per micro-batch, in units of (p-1)/p floats of each kind:
		// all-reduces count twice their floats.
		var ar, ag, rs float64
		var n int
		if !s.sp {
			// Each block's two forward all-reduces (out of the row-parallel
			// layers) and two backward ones (into the column-parallel
			// layers' inputs); the embedding's forward (first stage).
			ar, n = 2*4*float64(s.L)*N*C, 4*int(s.L)
			if s.recompute == parallel.RecomputeFull {
				ar, n = ar+2*2*float64(s.L)*N*C, n+2*int(s.L) // the forward's all-reduces again
			}
			if s.first {
				ar, n = ar+2*float64(spec.TokenEmbeddingOut(cfg).Size())/f32*N*C, n+1 // a Llama's sums bf16 at bf16
			}
		} else {
			// Sequence parallelism: per block, forward two all-gathers (into
			// c_attn and c_fc) and two reduce-scatters (out of the
			// projections), the bytes of the two all-reduces they replace;
			// backward four all-gathers (the inputs again, the projections'
			// output gradients) and two reduce-scatters (the input
			// gradients): two all-gathers more than the all-reduces. The
			// inputs gathered are the norms' outputs, and the output
			// gradients as the products read them (spec.Compute: the
			// residual stream's in a pre-norm block, rounded by the
			// projections in a post-norm one; bf16 at bf16, half a float
			// an element). The embedding (first stage) reduce-scatters
			// forward and all-gathers backward the residual stream's
			// gradient.
			projGradFloats := float64(spec.Compute(cfg).Size()) / f32
			ag, rs, n = (4*normFloats+2*projGradFloats)*float64(s.L)*N*C, 4*float64(s.L)*N*C, 10*int(s.L)
			if s.recompute == parallel.RecomputeFull {
				ag, rs, n = ag+2*normFloats*float64(s.L)*N*C, rs+2*float64(s.L)*N*C, n+4*int(s.L) // the forward's all-gathers and reduce-scatters again
			}
			if s.first {
				ag, rs, n = ag+float64(spec.Residual(cfg).Size())/f32*N*C, rs+N*C, n+2
			}
		}
		switch {
		case !s.last:
		case s.gpt && s.sp:
			// The head all-gathers its input (ln_f's output) forward and
			// again backward, and reduce-scatters its dx; the loss as
			// without.
			ag, rs, ar = ag+2*lnfFloats*N*C, rs+N*C, ar+2*3*N
			n += 5
		case s.gpt:
			ar += 2 * (N*C + 3*N) // the head's dx; the loss's row max and sums
			n += 3
		case s.sp:
			ar += 2 * (2*B*C + 2*B) // the pooled partial means are summed over tp
			n += 3
		default:
			ar += 2 * (B*C + 2*B) // fc1's dx, fc2's output
			n += 2
		}
		// The gradient norm: the per-parameter float64 sums of squares,
		// two floats each, all-gathered (train's gradNorm).
		normAG, stepAR, nStep := float64(s.tp*2*max(s.normEntries, 1)), 0.0, 1
		if s.sp {
			// ReduceGrads: the layer norms' (and ln_f's on the last stage,
			// the positions' on the first) gradients, once; under ZeRO-2
			// each block's as its backward ends, the rest once.
			rest := s.seqGrads()
			if s.zero2 {
				ar, n = ar+2*float64(s.L*s.blockSeqReduce), n+int(s.L)
				rest -= s.L * s.blockSeqReduce
			}
			if rest > 0 {
				stepAR = 2 * float64(rest)
				nStep++
			}
		}
		t.TPBytes = (accum*(ar+ag+rs) + normAG + stepAR) * half(tp) * f32
		t.Collectives += int(accum)*n + nStep
		c := dev.collective(local, int(s.tp), 1)
		skew = max(skew, c.skew)
		froms, t.Warnings = append(froms, "tp "+c.from), appendNew(t.Warnings, c.warn)
		h := half(tp) * f32
		tpMicroS := accum * (h*(ar/c.allReduce+ag/c.allGather+rs/c.reduceScatter) + float64(n)*c.latency)
		t.CommS += tpMicroS + h*(normAG/c.allGather+stepAR/c.allReduce) + float64(nStep)*c.latency
		if _, r, err := parallel.KVSplit(cfg.Heads, cfg.KVHeadCount(), int(s.tp)); s.llama && err == nil && r > 1 {
			// Key/value heads replicated over r ranks: each block's k and
			// v rows' gradients all-reduced over them once a step
			// (parallel.ReduceReplicas); under ZeRO-2 once a micro-batch.
			times := 1.0
			if s.zero2 {
				times = accum
			}
			kv := times * 2 * float64(s.L) * 2 * (C / float64(cfg.Heads) * C) * half(float64(r)) * f32
			t.TPBytes += kv
			t.Collectives += int(times) * int(s.L)
			t.CommS += kv/c.allReduce + times*float64(s.L)*c.latency
		}
		microS += tpMicroS
	}
	if s.pp > 1 {
		// Each micro-batch's output to the next stage, stored as the
		// residual stream (spec.StageActivation: bf16 at bf16), the
		// gradient of its input, stored as the stream too, to the previous
		// one: (B,T,C), or this rank's T/tp positions under sequence
		// parallelism. Neighbour stages may sit on different nodes.
		x := N * C
		if s.sp {
			x /= tp
		}
		t.Transfers = 0
		if !s.last {
			t.Transfers += int(accum)
			t.PPBytes += accum * x * float64(spec.Residual(cfg).Size())
		}
		if !s.first {
			t.Transfers += int(accum)
			t.PPBytes += accum * x * float64(spec.Residual(cfg).Size())
		}
		c := dev.collective(across, 2, nodes)
		froms, t.Warnings = append(froms, "pp "+c.from), appendNew(t.Warnings, c.warn)
		// A send is half an exchange: the all-reduce's bus bandwidth.
		ppS := t.PPBytes/c.allReduce + float64(t.Transfers)*c.latency
		t.CommS += ppS
		microS += ppS
		// 1F1B: the m micro-batches' work takes as long as m+p-1 of them.
		t.Bubble = parallel.BubbleFraction(int(s.pp), int(s.m))
		t.BubbleS = microS * float64(s.pp-1) / float64(s.m)
	}
	if dp > 1 {
		c := dev.collective(across, int(s.dp), nodes)
		skew = max(skew, c.skew)
		froms, t.Warnings = append(froms, "dp "+c.from), appendNew(t.Warnings, c.warn)
		// An all-reduce of every bucket, and the loss's mean (one float).
		buckets := len(s.buckets)
		n := buckets + 1
		h := half(dp) * f32
		units := 2 * float64(s.paramElems+1)
		if s.cfg.GradReduceBF16() {
			// 2 bytes an element: NCCL's bf16 on a GPU, else packed two a
			// float32 word, a bucket's odd element padded.
			var halves int64
			for _, b := range s.buckets {
				halves += b.Elems
				if !dev.CUDA {
					halves += b.Elems % 2
				}
			}
			units = 2 * (float64(halves)/2 + 1)
		}
		commS := units * h / c.allReduce
		t.DPBytes = units * h
		if s.zero {
			// A reduce-scatter of every padded bucket and an all-gather of
			// the updated parameters over ZeRO's ranks: the all-reduce's
			// bytes (the reduce-scatters' halved under grad_reduce bf16);
			// and the gradient norm's per-parameter squares
			// all-gathered over them. ZeRO-2 reduce-scatters each block's
			// bucket once a micro-batch; ZeRO-3 gathers each block's values
			// before its forward and before its backward instead of after
			// the update. Under hybrid sharding each reduce-scattered range
			// is then averaged over the replicas.
			zh := half(float64(s.zdp)) * f32
			_, _, padded := s.zeroSizes()
			// rangeWords is a reduce-scattered range of n gradients in
			// float32 words: n, or under grad_reduce bf16 2 bytes an
			// element (through the host packed two a word, an odd range
			// padded).
			rangeWords := func(n int64) float64 {
				switch {
				case !s.cfg.GradReduceBF16():
					return float64(n)
				case dev.CUDA:
					return float64(n) / 2
				}
				return float64((n + 1) / 2)
			}
			rs, ag := 0.0, float64(padded)
			calls := buckets // reduce-scatters
			n = 2*buckets + 2
			for _, b := range s.buckets {
				per := (b.Elems + s.zdp - 1) / s.zdp
				rs += float64(s.zdp) * rangeWords(per)
				if !s.zero2 || !b.Block {
					continue
				}
				rs += (accum - 1) * float64(s.zdp) * rangeWords(per)
				n, calls = n+int(accum)-1, calls+int(accum)-1
				if s.zero3 {
					ag += (2*accum - 1) * float64(per*s.zdp)
					n += 2*int(accum) - 1
				}
			}
			norm := float64(s.zdp * 2 * max(s.normEntries, 1))
			t.DPBytes = zh*(rs+ag+norm) + 2*h
			commS = zh*(rs/c.reduceScatter+(ag+norm)/c.allGather) + 2*h/c.allReduce
			if rep := s.dp / s.zdp; rep > 1 {
				ranges := 2 * rs / float64(s.zdp) * half(float64(rep)) * f32
				t.DPBytes += ranges
				commS += ranges / c.allReduce
				n += calls
			}
		}
		t.Collectives += n
		t.CommS += commS + float64(n)*c.latency
	}
	if t.Collectives > 0 {
		// The collectives' ranks wait for the slowest after the work
		// between two of them, a share of it: of all the work, whatever
		// their number. A pipeline's stages wait for each other in the
		// bubble.
		t.CommS += skew * (t.ComputeS + t.MemoryS)
	}
	if syncs := t.Collectives + t.Transfers; dev.Wait > 0 && syncs > 0 && dev.Cores > 0 && dev.Cores < 1 {
		// Ranks sharing cores take turns: a rank waits in a collective
		// while a peer that was not running catches up, up to Wait a
		// collective or transfer, and at most the time the others run.
		// Its work is priced at its share of the cores already, so the
		// wait is comm that the step does not add (TurnS).
		t.TurnS = min(float64(syncs)*dev.Wait, (t.ComputeS+t.MemoryS)*(1-dev.Cores))
		t.CommS += t.TurnS
	}
	t.CommRates = strings.Join(froms, "; ")
	t.StepS = t.ComputeS + t.MemoryS + t.CommS - t.TurnS + t.BubbleS
	t.CommShare = t.CommS / t.StepS
	t.TokensPerS = float64(cfg.BatchSize*cfg.Seq) * accum * dp / t.StepS
	t.FlopsPerToken = spec.ModelFlopsPerToken(cfg, vocab)
	t.PeakFlops = dev.FP32Flops
	switch {
	case cfg.Precision == "bf16" && dev.BF16Flops > 0:
		t.PeakFlops = dev.BF16Flops
	case cfg.Precision == "tf32" && dev.TF32Flops > 0:
		t.PeakFlops = dev.TF32Flops
	}
	t.MFU = metrics.MFU(t.FlopsPerToken, t.TokensPerS, t.PeakFlops, cfg.NTasks)
	t.HardwareFlopsPerToken = spec.HardwareFlopsPerToken(cfg, vocab)
	t.HFU = metrics.HFU(t.HardwareFlopsPerToken, t.TokensPerS, t.PeakFlops, cfg.NTasks)
	return t
}

// EngineCommS is the time a step's ranks spend in collectives and
// point-to-point transfers as the engine counts it (comm_s in the metrics):
// CommS, and a pipeline's bubble, which its stages spend waiting in their
// receives.
func (t Time) EngineCommS() float64 { return t.CommS + t.BubbleS }

// Suggestion is a change of the request that makes it fit, with the
// memory a rank then needs.
type Suggestion struct {
	Flags string `json:"flags"` // the submit flags that make the change, e.g. "--tp 4"
	Total int64  `json:"total"` // bytes a rank then needs
}

// Suggest lists the smallest changes of each kind that make r fit the
// device: sequence parallelism (--sp, where tp > 1 and tp divides the
// sequence) and ZeRO (--zero 1, else 2, else 3, where dp > 1), each alone or, when
// neither fits alone, both, on the same tasks
// and batch; activation recomputation (--recompute selective, else full;
// not for arch hf); a larger tp on the same tasks; a smaller batch with more
// gradient accumulation (the same global batch); more nodes holding a
// larger tp (the same data-parallel degree); bf16 (--precision bf16, where
// the device has bf16 products: its stored bf16 activations against its
// weights' bf16 copies).
func Suggest(r Request) []Suggestion {
	var out []Suggestion
	try := func(flags string, change func(c *config.Config, nodes *int)) bool {
		q := r
		change(&q.Config, &q.Nodes)
		if q.Config.Validate() != nil {
			return false
		}
		p, err := New(q)
		if err != nil || !p.Fits {
			return false
		}
		out = append(out, Suggestion{Flags: flags, Total: p.Memory.Total})
		return true
	}
	cfg := r.Config
	canSP := !cfg.SP && cfg.TP > 1 && cfg.Seq%cfg.TP == 0
	canZero := cfg.Zero < 3 && cfg.DP() > 1
	sp := func(c *config.Config, _ *int) { c.SP = true }
	fitSP := canSP && try("--sp", sp)
	for stage := cfg.Zero + 1; canZero && stage <= 3; stage++ {
		zero := func(c *config.Config, _ *int) { c.Zero = stage }
		if try(fmt.Sprintf("--zero %d", stage), zero) {
			break
		}
		if canSP && !fitSP && try(fmt.Sprintf("--sp --zero %d", stage), func(c *config.Config, nd *int) { sp(c, nd); zero(c, nd) }) {
			break
		}
	}
	// bf16 stores the activations only products read in 2 bytes (and
	// adds a 2-byte copy of each product weight), where the device has
	// bf16 products.
	if cfg.Precision != "bf16" && (!r.Device.CUDA || r.Device.BF16Flops > 0) {
		try("--precision bf16", func(c *config.Config, _ *int) { c.Precision = "bf16" })
	}
	if cfg.Arch != "hf" {
		for _, mode := range []string{"selective", "full"} {
			if recomputeOrder[mode] > recomputeOrder[recomputeName(cfg)] && try("--recompute "+mode, func(c *config.Config, _ *int) { c.Recompute = mode }) {
				break
			}
		}
	}
	for tp := cfg.TP * 2; tp <= cfg.NTasks; tp *= 2 {
		if try(fmt.Sprintf("--tp %d", tp), func(c *config.Config, _ *int) { c.TP = tp }) {
			break
		}
	}
	for div := 2; div <= cfg.BatchSize; div *= 2 {
		if cfg.BatchSize%div != 0 {
			break
		}
		bsz, accum := cfg.BatchSize/div, cfg.GradAccum*div
		if try(fmt.Sprintf("--bsz %d --grad-accum %d", bsz, accum), func(c *config.Config, _ *int) { c.BatchSize, c.GradAccum = bsz, accum }) {
			break
		}
	}
	nodes := max(r.Nodes, 1)
	for k := 2; k <= 16; k *= 2 {
		n, tp := cfg.NTasks*k, cfg.TP*k
		if try(fmt.Sprintf("--nodes %d --ntasks %d --tp %d", nodes*k, n, tp), func(c *config.Config, nd *int) {
			c.NTasks, c.TP, *nd = n, tp, nodes*k
		}) {
			break
		}
	}
	return out
}

// recomputeName is the config's recomputation as the plan shows it: ""
// for none.
func recomputeName(cfg config.Config) string {
	if cfg.RecomputeMode() == parallel.RecomputeNone {
		return ""
	}
	return cfg.Recompute
}

// stageSplit is the blocks of each pipeline stage (one stage holding
// them all without a pipeline).
func stageSplit(cfg config.Config) ([]int, error) {
	if cfg.Stages() == 1 {
		return []int{cfg.Layers}, nil
	}
	return cfg.StageLayers()
}

// appendNew appends x to xs unless it is empty or already there.
func appendNew(xs []string, x string) []string {
	if x == "" || slices.Contains(xs, x) {
		return xs
	}
	return append(xs, x)
}

// ranksPerNode is how many ranks each of nodes nodes runs (one node when
// nodes is 0), for zero_group node.
func ranksPerNode(cfg config.Config, nodes int) int {
	return cfg.NTasks / max(nodes, 1)
}
