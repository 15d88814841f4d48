// Package plan predicts what a training run needs before it runs: per rank,
// the memory of every kind of buffer the engine allocates (parameters,
// gradients, AdamW moments, the activations each block keeps for backward,
// logits and loss buffers, GPU workspace, comm buffers, the CUDA context),
// whether that fits the device, and a step time split into compute and
// communication, with the tokens/s and MFU that follow.
//
// It is pure arithmetic on a train.Config, the vocabulary, the number of
// nodes and a Device (the table in device.go): no I/O, no allocation on a
// device. The memory model follows the buffers of package parallel and
// train's model one for one (see buffers), so on the CPU, where the engine
// counts exactly the bytes of its tensors, the prediction is that count;
// its test checks it against the engine's own peak (tensor.MemStats) after
// real steps.
//
// The engine keeps every tensor in float32 whatever the precision (bf16
// changes how a GPU multiplies, not what it stores), has no sequence
// parallelism, no ZeRO and no pipeline: the plan says so instead of
// modelling what does not exist.
package plan

import (
	"fmt"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train"
)

// Request is what a plan is made for.
type Request struct {
	Config train.Config
	Vocab  int // the tokenizer's vocabulary (train.Data.Vocab), before padding
	Nodes  int // nodes the ranks spread over; 0 means 1
	Device Device
}

// Plan is the prediction for one run. Memory is per rank: every rank of
// the job holds the same sizes (the vocabulary is padded to split evenly).
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
	GradAccum   int    `json:"grad_accum"`
	Precision   string `json:"precision"`
	NTasks      int    `json:"ntasks"`
	TP          int    `json:"tp"`
	DP          int    `json:"dp"`
	Nodes       int    `json:"nodes"`
	Params      int64  `json:"params"` // of the whole model

	Device Device `json:"device"`
	Memory Memory `json:"memory"`
	// Fits says whether Memory.Total is within the device's memory;
	// Headroom is what is left (negative: how much is missing).
	Fits     bool  `json:"fits"`
	Headroom int64 `json:"headroom_bytes"`

	Time  Time     `json:"time"`
	Notes []string `json:"notes,omitempty"`
}

// Memory is one rank's memory in bytes, by what it holds.
type Memory struct {
	Params    int64 `json:"params"`    // this rank's shard of the weights
	Grads     int64 `json:"grads"`     // their gradients
	Optimizer int64 `json:"optimizer"` // AdamW's two moments
	Masters   int64 `json:"masters"`   // fp32 master weights: 0, the weights are fp32
	// ActivationsPerBlock is what one transformer block keeps for its
	// backward and uses in it (inputs of each product, attention
	// probabilities, their gradients), with the tensor-parallel split;
	// Blocks is that times the layers.
	ActivationsPerBlock int64 `json:"activations_per_block"`
	Blocks              int64 `json:"blocks"`
	// Embeddings are the embedding outputs, the residual stream's
	// gradients and the final layer norm.
	Embeddings int64 `json:"embeddings"`
	// Logits are the head's output and gradient and the cross-entropy's
	// buffers (the vocab-parallel logits of an LM, the pooled classifier's
	// small tensors).
	Logits int64 `json:"logits"`
	// Workspace is the GPU kernels' scratch (reduction partials, staged
	// ids) and the GPU step's scalars; 0 on the CPU.
	Workspace int64 `json:"workspace"`
	// GradBucket is the device buffer the data-parallel gradient
	// all-reduce packs buckets into (GPU with NCCL, dp > 1); on the CPU the
	// bucket is staged in host memory outside the engine's count.
	GradBucket int64 `json:"grad_bucket"`
	// EnginePeak is what the engine's accounting (tensor.MemStats.Peak,
	// mem_peak_bytes in the metrics) counts: everything above.
	EnginePeak int64 `json:"engine_peak"`
	// CommBuffers are the communication library's own buffers (NCCL's per
	// communicator on a GPU; the host staging of the gradient bucket on
	// the CPU).
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
	// Rate is the FLOP/s the GEMMs are taken to run at (the peak of the
	// device's fp32 units times its efficiency: the engine multiplies in
	// fp32 in training).
	Rate float64 `json:"rate_flops"`
	// ComputeS is the GEMMs' time; MemoryS the elementwise kernels' and
	// the optimizer's, bound by memory bandwidth.
	ComputeS float64 `json:"compute_s"`
	MemoryS  float64 `json:"memory_s"`
	// CommS is the collectives' time: TPBytes and DPBytes are what one
	// rank sends in the tensor- and data-parallel groups (ring all-reduce:
	// 2(p-1)/p of each tensor), Collectives how many it takes part in.
	CommS       float64 `json:"comm_s"`
	TPBytes     float64 `json:"tp_bytes"`
	DPBytes     float64 `json:"dp_bytes"`
	Collectives int     `json:"collectives"`
	StepS       float64 `json:"step_s"`
	CommShare   float64 `json:"comm_share"` // CommS / StepS: the engine does not overlap them
	// TokensPerS is the job's (all data-parallel replicas).
	TokensPerS float64 `json:"tokens_per_s"`
	// FlopsPerToken is train.FlopsPerToken, the convention MFU uses in
	// hpcrun metrics; PeakFlops the device's peak at the run's precision.
	FlopsPerToken float64 `json:"flops_per_token"`
	PeakFlops     float64 `json:"peak_flops"`
	MFU           float64 `json:"mfu"`
}

const f32 = 4 // bytes of a float32

// ncclBuffers is NCCL's memory per communicator: send and receive buffers
// of NCCL_BUFFSIZE (4 MiB) on each of its channels (about 16 on NVLink).
const ncclBuffers = 2 * 16 * 4 * mib

// gradBucketElems is train's data-parallel bucket size (4 Mi floats).
const gradBucketElems = 1 << 22

// New predicts the run of r. The config must be valid (train.Config.Validate)
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
		Vocab: r.Vocab, PaddedVocab: vp, BatchSize: cfg.BatchSize, GradAccum: cfg.GradAccum, Precision: cfg.Precision,
		NTasks: cfg.NTasks, TP: cfg.TP, DP: cfg.DP(), Nodes: nodes, Params: train.ParamCount(cfg, r.Vocab),
		Device: r.Device,
	}
	s := newShapes(cfg, vp)
	p.Memory = s.memory(r.Device, p.DP)
	p.Headroom = r.Device.MemBytes - p.Memory.Total
	p.Fits = p.Headroom >= 0
	p.Time = s.time(cfg, r.Vocab, r.Device, nodes)
	p.Notes = append(p.Notes, "activations: the engine has no sequence parallelism, ZeRO or recomputation; every block keeps its own")
	switch {
	case cfg.Precision == "bf16" && r.Device.BF16Flops == 0:
		p.Notes = append(p.Notes, fmt.Sprintf("precision bf16: %s has no bf16 units; the engine trains in fp32 there as everywhere; MFU is against its fp32 peak", r.Device.Name))
	case cfg.Precision == "bf16":
		p.Notes = append(p.Notes, "precision bf16: the engine stores fp32 weights, gradients and activations and trains with fp32 GEMMs; MFU is against the bf16 peak")
	}
	return p, nil
}

// shapes are the sizes the buffers are made of, for one rank.
type shapes struct {
	gpt                bool
	B, T, C, L         int64
	N                  int64 // tokens of a micro-batch, B*T
	nh                 int64 // heads on this rank
	cl, fl, vl         int64 // this rank's attention width, MLP width, vocab slice
	tp                 int64
	paramElems         int64
	paramTensors       int64
	blockParamElems    int64
	largestParamTensor int64
}

func newShapes(cfg train.Config, paddedVocab int) shapes {
	tp := int64(cfg.TP)
	C := int64(cfg.Dim)
	s := shapes{
		gpt: cfg.Model == "gpt",
		B:   int64(cfg.BatchSize), T: int64(cfg.Seq), C: C, L: int64(cfg.Layers), tp: tp,
		nh: int64(cfg.Heads) / tp, cl: C / tp, fl: 4 * C / tp, vl: int64(paddedVocab) / tp,
	}
	s.N = s.B * s.T
	// Per block: ln_1 (2C), c_attn (3C/tp x C + 3C/tp), attn.c_proj
	// (C x C/tp + C, bias replicated), ln_2 (2C), mlp.c_fc (4C/tp x C +
	// 4C/tp), mlp.c_proj (C x 4C/tp + C).
	s.blockParamElems = 2*C + (3*s.cl*C + 3*s.cl) + (C*s.cl + C) + 2*C + (s.fl*C + s.fl) + (C*s.fl + C)
	wte, wpe := s.vl*C, s.T*C
	s.paramElems = wte + wpe + s.L*s.blockParamElems + 2*C
	s.paramTensors = 2 + 12*s.L + 2
	s.largestParamTensor = max(wte, wpe, s.fl*C)
	if !s.gpt {
		// cls.fc1 column-parallel (C/tp x C + C/tp), cls.fc2 row-parallel
		// (2 x C/tp + 2).
		s.paramElems += s.cl*C + s.cl + 2*s.cl + 2
		s.paramTensors += 4
	}
	return s
}

// blockElems are the floats one block allocates for a micro-batch (see
// parallel.Block, ParallelSelfAttention, ParallelMLP, LayerNorm and the
// linear layers' buffers):
//
//	block: r, out, dr, dh                      4 (B,T,C)
//	ln_1, ln_2: out, mean, rstd                2 x ((B,T,C) + 2 (B,T))
//	attention: att, datt, dpre                 3 (B,nh,T,T)
//	           y, dy, dqkv                     5 (B,T,C/tp)
//	c_attn: its output (B,T,3C/tp), dx (B,T,C); c_proj: out (B,T,C), dxl (B,T,C/tp)
//	mlp: h, dh, dpre                           3 (B,T,4C/tp)
//	c_fc: its output (B,T,4C/tp), dx (B,T,C); c_proj: out (B,T,C), dxl (B,T,4C/tp)
func (s shapes) blockElems() int64 {
	N, C := s.N, s.C
	return 10*N*C + 4*N + 3*s.B*s.nh*s.T*s.T + 9*N*s.cl + 5*N*s.fl
}

// embeddingElems: wte's and wpe's outputs, the residual stream's
// gradients dx, dy and ln_f's dh, ln_f's output and statistics.
func (s shapes) embeddingElems() int64 { return 5*s.N*s.C + s.N*s.C + 2*s.N }

// headElems are the head's and the loss's buffers. GPT: the logits slice
// (B,T,V/tp), their gradient, the head's dx (B,T,C), the loss's row max,
// sums and losses (4N). BERT: the (B, B*T) pooling matrix, pooled and its
// gradient (2 (B,C)), fc1's output, GELU and gradients (5 (B,C/tp) with
// fc2's dxl), fc1's dx (B,C), the logits' gradient and fc2's output (2 x
// 2B), the loss (4B).
func (s shapes) headElems() int64 {
	if s.gpt {
		return 2*s.N*s.vl + s.N*s.C + 4*s.N
	}
	return s.B*s.N + 3*s.B*s.C + 5*s.B*s.cl + 8*s.B
}

func (s shapes) memory(dev Device, dp int) Memory {
	m := Memory{
		Params:              s.paramElems * f32,
		Grads:               s.paramElems * f32,
		Optimizer:           2 * s.paramElems * f32,
		ActivationsPerBlock: s.blockElems() * f32,
		Embeddings:          s.embeddingElems() * f32,
		Logits:              s.headElems() * f32,
	}
	m.Blocks = s.L * m.ActivationsPerBlock
	bucket := min(s.paramElems, max(int64(gradBucketElems), s.largestParamTensor)) * f32
	if dev.CUDA {
		// Reduction partials of the layer norm backward (2 x SMs blocks of
		// 2C floats) and of the grad norm (128 float64 per tensor), staged
		// ids and targets, the GPU step's scalars.
		m.Workspace = min(s.N, int64(2*dev.SMs))*2*s.C*f32 + s.paramTensors*128*8 + 2*s.N*4 + 8*f32
		if dp > 1 {
			m.GradBucket = bucket
		}
		groups := int64(0)
		if s.tp > 1 {
			groups++
		}
		if dp > 1 {
			groups++
		}
		m.CommBuffers = groups * ncclBuffers
		m.Context = dev.ContextBytes
	} else if dp > 1 {
		m.CommBuffers = bucket
	}
	m.EnginePeak = m.Params + m.Grads + m.Optimizer + m.Masters + m.Blocks + m.Embeddings + m.Logits + m.Workspace + m.GradBucket
	m.Total = m.EnginePeak + m.CommBuffers + m.Context
	return m
}

// activationElems are all the activation floats of a micro-batch.
func (s shapes) activationElems() int64 {
	return s.L*s.blockElems() + s.embeddingElems() + s.headElems()
}

// activationTouches is how many times the step reads or writes each
// activation float in its elementwise kernels, on average.
const activationTouches = 3

func (s shapes) time(cfg train.Config, vocab int, dev Device, nodes int) Time {
	var t Time
	accum := float64(cfg.GradAccum)
	N, C, T, B := float64(s.N), float64(s.C), float64(s.T), float64(s.B)
	tp := float64(s.tp)
	// Per block and micro-batch: the four products 24 N C^2 forward (over
	// tp ranks), attention's two 4 B T^2 C, backward twice the forward.
	gemm := float64(s.L) * (72*N*C*C + 12*B*T*T*C) / tp
	if s.gpt {
		gemm += 6 * N * C * float64(s.vl)
	} else {
		gemm += 4*B*N*C + 6*B*C*float64(s.cl)
	}
	t.GemmFlops = gemm * accum
	t.Rate = dev.FP32Flops * dev.Efficiency
	t.ComputeS = t.GemmFlops / t.Rate
	// Elementwise kernels touch the activations a few times per
	// micro-batch; AdamW reads weight, gradient and moments and writes
	// three of them back; the gradient is zeroed or overwritten once.
	t.MemoryS = (accum*activationTouches*float64(s.activationElems())*f32 + 8*float64(s.paramElems)*f32) / dev.MemBandwidth

	ring := func(p float64) float64 { return 2 * (p - 1) / p }
	dp := float64(cfg.DP())
	if s.tp > 1 {
		elems := (4*float64(s.L) + 1) * N * C
		n := 4*int(s.L) + 1
		if s.gpt {
			elems += N*C + 3*N
			n += 3
		} else {
			elems += B*C + 2*B
			n += 2
		}
		t.TPBytes = accum * ring(tp) * elems * f32
		t.Collectives += int(accum)*n + 1 // and the grad norm's
		t.CommS += t.TPBytes/dev.LinkBandwidth + float64(int(accum)*n+1)*dev.Latency
	}
	if dp > 1 {
		bw := dev.LinkBandwidth
		if nodes > 1 {
			bw = dev.NetBandwidth
		}
		buckets := (s.paramElems + gradBucketElems - 1) / gradBucketElems
		t.DPBytes = ring(dp) * float64(s.paramElems) * f32
		t.Collectives += int(buckets) + 1 // and the loss's mean
		t.CommS += t.DPBytes/bw + float64(buckets+1)*dev.Latency
	}
	if dev.Wait > 0 && t.Collectives > 0 {
		// Ranks sharing cores wait for each other at every collective, at
		// most the work between two of them.
		t.CommS += float64(t.Collectives) * min(dev.Wait, (t.ComputeS+t.MemoryS)/float64(t.Collectives))
	}
	t.StepS = t.ComputeS + t.MemoryS + t.CommS
	t.CommShare = t.CommS / t.StepS
	t.TokensPerS = float64(cfg.BatchSize*cfg.Seq) * accum * dp / t.StepS
	t.FlopsPerToken = train.FlopsPerToken(cfg, vocab)
	t.PeakFlops = dev.FP32Flops
	if cfg.Precision == "bf16" && dev.BF16Flops > 0 {
		t.PeakFlops = dev.BF16Flops
	}
	t.MFU = t.FlopsPerToken * t.TokensPerS / (t.PeakFlops * float64(cfg.NTasks))
	return t
}

// Suggestion is a change of the request that makes it fit, with the
// memory a rank then needs.
type Suggestion struct {
	Flags string `json:"flags"` // the submit flags that make the change, e.g. "--tp 4"
	Total int64  `json:"total"` // bytes a rank then needs
}

// Suggest lists the smallest changes of each kind that make r fit the
// device: a larger tp on the same tasks, a smaller batch with more
// gradient accumulation (the same global batch), more nodes holding a
// larger tp (the same data-parallel degree). bf16 is not among them: the
// engine stores fp32 whatever the precision.
func Suggest(r Request) []Suggestion {
	var out []Suggestion
	try := func(flags string, change func(c *train.Config, nodes *int)) bool {
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
	for tp := cfg.TP * 2; tp <= cfg.NTasks; tp *= 2 {
		if try(fmt.Sprintf("--tp %d", tp), func(c *train.Config, _ *int) { c.TP = tp }) {
			break
		}
	}
	for div := 2; div <= cfg.BatchSize; div *= 2 {
		if cfg.BatchSize%div != 0 {
			break
		}
		bsz, accum := cfg.BatchSize/div, cfg.GradAccum*div
		if try(fmt.Sprintf("--bsz %d --grad-accum %d", bsz, accum), func(c *train.Config, _ *int) { c.BatchSize, c.GradAccum = bsz, accum }) {
			break
		}
	}
	nodes := max(r.Nodes, 1)
	for k := 2; k <= 16; k *= 2 {
		n, tp := cfg.NTasks*k, cfg.TP*k
		if try(fmt.Sprintf("--nodes %d --ntasks %d --tp %d", nodes*k, n, tp), func(c *train.Config, nd *int) {
			c.NTasks, c.TP, *nd = n, tp, nodes*k
		}) {
			break
		}
	}
	return out
}
