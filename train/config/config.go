package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
)

// Config is the full, resolved description of one training run. hpcrun submit
// writes it as train.toml in the run directory; every task of the job reads it
// back, so all ranks train the same thing.
type Config struct {
	Model     string  `toml:"model" json:"model"`         // "bert" (classifier), "gpt" or "llama" (causal LMs)
	Preset    string  `toml:"preset" json:"preset"`       // tiny, small, bert-base, bert-large, gpt2-124m, gpt2-350m; "" = none
	Layers    int     `toml:"layers" json:"layers"`       // transformer blocks
	Dim       int     `toml:"dim" json:"dim"`             // hidden size
	Heads     int     `toml:"heads" json:"heads"`         // attention heads
	Seq       int     `toml:"seq" json:"seq"`             // sequence length in tokens
	Vocab     int     `toml:"vocab" json:"vocab"`         // tokenizer vocabulary before padding; 0 = from the tokenizer
	Tokenizer string  `toml:"tokenizer" json:"tokenizer"` // byte, gpt2, wordpiece, hf (vocab_file's tokenizer.json); "" = the model's default
	BatchSize int     `toml:"bsz" json:"bsz"`             // samples per DP rank per micro-step
	GradAccum int     `toml:"grad_accum" json:"grad_accum"`
	Epochs    int     `toml:"epochs" json:"epochs"`
	Samples   int     `toml:"samples" json:"samples"` // training samples to use; 0 = all
	Steps     int     `toml:"steps" json:"steps"`     // optimizer steps; 0 = from epochs and samples
	LR        float64 `toml:"lr" json:"lr"`
	Warmup    int     `toml:"warmup" json:"warmup"`       // LR warm-up steps
	Precision string  `toml:"precision" json:"precision"` // matrix products: fp32, tf32 (float32 on a GPU's tensor cores) or bf16 (bfloat16 operands: the weights' bfloat16 copies beside fp32 masters, on the CPU too); the CPU computes fp32
	Data      string  `toml:"data" json:"data"`           // "synthetic" (built in: reviews for bert, data.SyntheticText for gpt), an IMDb-format CSV, or (gpt) a text file or token files (a .bin or a glob of shards)
	Seed      int64   `toml:"seed" json:"seed"`
	EvalEvery int     `toml:"eval_every" json:"eval_every"` // steps between validations; 0 = at the end only
	Device    string  `toml:"device" json:"device"`         // auto, cpu, cuda
	Comm      string  `toml:"comm" json:"comm"`             // auto, tcp, nccl: how collectives run (see CommBackend)

	VocabFile   string  `toml:"vocab_file,omitempty" json:"vocab_file,omitempty"` // BERT vocab.txt for wordpiece ("" = build one from the training texts); a tokenizer.json or its directory for hf
	EvalSamples int     `toml:"eval_samples" json:"eval_samples"`                 // validation samples per evaluation; 0 = 512
	WeightDecay float64 `toml:"weight_decay" json:"weight_decay"`                 // AdamW decoupled weight decay (matrices only)
	GradClip    float64 `toml:"grad_clip" json:"grad_clip"`                       // clip the global gradient norm to this (gradients times clip/(norm+1e-6) when the norm exceeds it); 0 = no clipping

	// Llama-family decoders (model llama; see llama.go).
	KVHeads   int     `toml:"kv_heads,omitempty" json:"kv_heads,omitempty"`     // key/value heads (num_key_value_heads); 0 = heads
	FFN       int     `toml:"ffn,omitempty" json:"ffn,omitempty"`               // SwiGLU width (intermediate_size); 0 = Llama's rule from dim
	NormEps   float64 `toml:"norm_eps,omitempty" json:"norm_eps,omitempty"`     // RMSNorm epsilon (rms_norm_eps); 0 = 1e-5
	RopeTheta float64 `toml:"rope_theta,omitempty" json:"rope_theta,omitempty"` // rotary base; 0 = 10000
	// Llama 3's rope_scaling (rope_type llama3; see parallel.RoPEScaling):
	// rope_factor 0 = none.
	RopeFactor      float64 `toml:"rope_factor,omitempty" json:"rope_factor,omitempty"`
	RopeLowFreq     float64 `toml:"rope_low_freq,omitempty" json:"rope_low_freq,omitempty"`         // low_freq_factor
	RopeHighFreq    float64 `toml:"rope_high_freq,omitempty" json:"rope_high_freq,omitempty"`       // high_freq_factor
	RopeOriginalSeq int     `toml:"rope_original_seq,omitempty" json:"rope_original_seq,omitempty"` // original_max_position_embeddings
	UntiedHead      bool    `toml:"untied_head,omitempty" json:"untied_head,omitempty"`             // an LM head of its own (tie_word_embeddings false)

	// Pretrained weights, positions, optimizer and schedule.
	Positions int     `toml:"positions,omitempty" json:"positions,omitempty"`   // rows of the position table (n_positions); 0 = seq
	Arch      string  `toml:"arch,omitempty" json:"arch,omitempty"`             // bert only: "" = hpcrun's (pre-LN, mean-pooled head), "hf" = BERT's own (post-LN, token types, pooler), as --init-from a BERT sets
	InitFrom  string  `toml:"init_from,omitempty" json:"init_from,omitempty"`   // start from these weights: a Hugging Face model dir or an llm.c .bin
	AdamBeta1 float64 `toml:"adam_beta1,omitempty" json:"adam_beta1,omitempty"` // 0 = 0.9
	AdamBeta2 float64 `toml:"adam_beta2,omitempty" json:"adam_beta2,omitempty"` // 0 = the model's: 0.95 for gpt and llama, 0.999 for bert
	AdamEps   float64 `toml:"adam_eps,omitempty" json:"adam_eps,omitempty"`     // 0 = 1e-8
	Schedule  string  `toml:"schedule,omitempty" json:"schedule,omitempty"`     // learning rate after warm-up: cosine (""), linear or constant
	MinLR     float64 `toml:"min_lr,omitempty" json:"min_lr,omitempty"`         // where cosine and linear decay end; 0 = lr/10
	Shuffle   bool    `toml:"shuffle" json:"shuffle"`                           // shuffle the training samples every epoch (else in order)

	// Checkpoints (runs/<execid>/ckpt) and requeue on a time limit.
	CkptEvery   int    `toml:"ckpt_every,omitempty" json:"ckpt_every,omitempty"`     // steps between checkpoints; 0 = at the end (and on a stop signal) only; < 0 = never
	CkptKeep    int    `toml:"ckpt_keep,omitempty" json:"ckpt_keep,omitempty"`       // checkpoints kept; 0 = 3
	MaxRequeues int    `toml:"max_requeues,omitempty" json:"max_requeues,omitempty"` // times a job stopped by its time-limit signal requeues itself; 0 = 10
	StopSignal  string `toml:"stop_signal,omitempty" json:"stop_signal,omitempty"`   // signal that asks for save-and-stop: USR1 or USR2; "" = USR1
	// CommTimeout bounds every wait of a rank for a peer (joining, a
	// collective, a silent peer's heartbeat), as a Go duration ("30s",
	// "10m"); "" = nccl.DefaultTimeout. A lost node is noticed within it;
	// a job whose ranks may wait longer at a collective (slow I/O on one
	// rank, very long steps) needs it larger.
	CommTimeout string `toml:"comm_timeout,omitempty" json:"comm_timeout,omitempty"`
	ResumeFrom  string `toml:"resume_from,omitempty" json:"resume_from,omitempty"` // checkpoint (step dir, ckpt root or run dir) a new run starts from, at any tp; the run dir's own latest wins

	// Layout of the job.
	NTasks int `toml:"ntasks" json:"ntasks"`
	TP     int `toml:"tp" json:"tp"`
	// Pipeline parallelism (1F1B, Narayanan et al. 2104.04473): the blocks
	// split into pp stages, each step micro_batches micro-batches of bsz.
	PP           int    `toml:"pp,omitempty" json:"pp,omitempty"`                       // pipeline stages; 0 = 1
	MicroBatches int    `toml:"micro_batches,omitempty" json:"micro_batches,omitempty"` // micro-batches per step through the pipeline (pp > 1, >= pp); 0 = pp
	PPSplit      string `toml:"pp_split,omitempty" json:"pp_split,omitempty"`           // blocks of each stage, e.g. "3,1" (pp numbers summing to layers); "" = layers/pp each
	// Memory-saving parallelism (Megatron-LM 2205.05198, ZeRO 1910.02054).
	SP   bool `toml:"sp" json:"sp"`     // sequence parallelism: layer norms and residuals split along the sequence over tp (seq % tp == 0)
	Zero int  `toml:"zero" json:"zero"` // 1: ZeRO-1, the AdamW moments sharded over the data-parallel group; 2: ZeRO-2, the gradients too; 3: ZeRO-3, the parameters too; 0: replicated
	// ZeroGroup is hybrid sharding (HSDP, ZeRO++'s hpZ): the ZeRO state is
	// sharded over groups of this many consecutive data-parallel ranks and
	// replicated across the groups, "node" for the data-parallel ranks of
	// one node; "" shards over all of them.
	ZeroGroup string `toml:"zero_group,omitempty" json:"zero_group,omitempty"`
	// Activation recomputation (Megatron-LM 2205.05198 §5): "" or none,
	// selective (the attention probabilities) or full (each block from
	// its input); see RecomputeMode.
	Recompute string `toml:"recompute,omitempty" json:"recompute,omitempty"`
	// Attention is how attention runs: auto ("": the device's fused
	// kernels where it has them for the head size and precision, a CUDA
	// GPU at tf32 or bf16), fused (refuse to run without them) or unfused
	// (the (T,T) probabilities in memory, as on the CPU).
	Attention string `toml:"attention,omitempty" json:"attention,omitempty"`
	// GradReduce is the data type of the data-parallel gradient
	// reduction: fp32 ("": the gradients as accumulated) or bf16 (at
	// --precision bf16: each bucket rounded to bfloat16, all-reduced, or
	// under ZeRO reduce-scattered, in bfloat16 and widened back, half the
	// bytes on the wire, as Megatron-LM's --grad-reduce-in-bf16).
	GradReduce string `toml:"grad_reduce,omitempty" json:"grad_reduce,omitempty"`
}

// Checkpoints is the number of checkpoints kept (ckpt_keep, or 3).
func (c Config) Checkpoints() int {
	if c.CkptKeep > 0 {
		return c.CkptKeep
	}
	return 3
}

// Requeues is the number of times a job stopped by its time-limit signal
// requeues itself.
func (c Config) Requeues() int {
	if c.MaxRequeues > 0 {
		return c.MaxRequeues
	}
	return 10
}

// DefaultConfig is the tiny BERT classifier on the built-in synthetic data:
// what `hpcrun submit` trains when given no training flags.
func DefaultConfig() Config {
	return Config{
		Model:       "bert",
		Preset:      "tiny",
		Layers:      2,
		Dim:         64,
		Heads:       4,
		Seq:         32,
		BatchSize:   16,
		GradAccum:   1,
		Epochs:      1,
		LR:          1e-3,
		Warmup:      10,
		Precision:   "fp32",
		Data:        "synthetic",
		Seed:        1234,
		Device:      "auto",
		Comm:        "auto",
		EvalEvery:   50,
		WeightDecay: 0.01,
		GradClip:    1.0,
		Shuffle:     true,
		NTasks:      1,
		TP:          1,
	}
}

// DP is the data-parallel degree: how many model replicas the job holds
// (ntasks = pp x dp x tp).
func (c Config) DP() int {
	if c.TP <= 0 || c.PP < 0 {
		return 0
	}
	return c.NTasks / c.TP / c.Stages()
}

// Stages is the pipeline-parallel degree: pp, or 1 when unset.
func (c Config) Stages() int { return max(c.PP, 1) }

// Micro is the number of micro-batches of bsz samples in one optimizer
// step: micro_batches (or pp when 0) through a pipeline, else grad_accum.
func (c Config) Micro() int {
	if c.Stages() == 1 {
		return c.GradAccum
	}
	if c.MicroBatches > 0 {
		return c.MicroBatches
	}
	return c.Stages()
}

// Validate checks the shapes and values that every rank depends on, so that a
// bad request fails at submit time with one error per problem.
func (c Config) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	switch c.Model {
	case "bert", "gpt":
	case "llama":
		c.validateLlama(bad)
	default:
		bad("model %q: use bert, gpt or llama", c.Model)
	}
	if c.Model != "llama" && (c.KVHeads != 0 || c.FFN != 0 || c.NormEps != 0 || c.RopeTheta != 0 || c.RopeFactor != 0 || c.UntiedHead) {
		bad("kv_heads, ffn, norm_eps, rope_theta, rope_factor and untied_head are model llama's: leave them out for %s", c.Model)
	}
	positive := []struct {
		name string
		v    int
	}{
		{"layers", c.Layers}, {"dim", c.Dim}, {"heads", c.Heads}, {"seq", c.Seq},
		{"bsz", c.BatchSize}, {"grad_accum", c.GradAccum}, {"epochs", c.Epochs},
		{"ntasks", c.NTasks}, {"tp", c.TP},
	}
	for _, p := range positive {
		if p.v <= 0 {
			bad("%s = %d: must be at least 1", p.name, p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"samples", c.Samples}, {"steps", c.Steps}, {"warmup", c.Warmup}, {"eval_every", c.EvalEvery}, {"vocab", c.Vocab}, {"eval_samples", c.EvalSamples}, {"positions", c.Positions}} {
		if p.v < 0 {
			bad("%s = %d: must not be negative", p.name, p.v)
		}
	}
	if c.NTasks > 0 && c.TP > 0 && c.PP >= 0 && c.NTasks%(c.TP*c.Stages()) != 0 {
		if c.Stages() > 1 {
			bad("ntasks %d is not a multiple of pp %d x tp %d: choose ntasks = pp x data-parallel degree x tp", c.NTasks, c.PP, c.TP)
		} else {
			bad("ntasks %d is not a multiple of tp %d: choose ntasks = tp x data-parallel degree", c.NTasks, c.TP)
		}
	}
	c.validatePipeline(bad)
	if c.Heads > 0 && c.TP > 0 && c.Heads%c.TP != 0 {
		bad("heads %d is not a multiple of tp %d: each tensor-parallel rank needs whole heads", c.Heads, c.TP)
	}
	if c.Dim > 0 && c.Heads > 0 && c.Dim%c.Heads != 0 {
		bad("dim %d is not a multiple of heads %d", c.Dim, c.Heads)
	}
	if c.SP && c.TP == 1 {
		bad("sp needs tp > 1: sequence parallelism splits the sequence over the tensor-parallel group")
	}
	if c.Zero > 0 && c.TP > 0 && c.NTasks > 0 && c.PP >= 0 && c.DP() < 2 {
		bad("zero %d needs a data-parallel degree > 1 (ntasks %d / tp %d / pp %d): ZeRO shards the optimizer state over the data-parallel group", c.Zero, c.NTasks, c.TP, c.Stages())
	}
	if c.SP && c.TP > 0 && c.Seq > 0 && c.Seq%c.TP != 0 {
		bad("sp: seq %d is not a multiple of tp %d: sequence parallelism gives each tensor-parallel rank seq/tp positions", c.Seq, c.TP)
	}
	switch c.Recompute {
	case "", "none", "selective", "full":
	default:
		bad("recompute %q: use none, selective or full", c.Recompute)
	}
	switch c.Attention {
	case "", "auto", "fused", "unfused":
	default:
		bad("attention %q: use auto, fused or unfused", c.Attention)
	}
	switch {
	case c.GradReduce != "" && c.GradReduce != "fp32" && c.GradReduce != "bf16":
		bad("grad_reduce %q: use fp32 or bf16", c.GradReduce)
	case c.GradReduceBF16() && c.Precision != "bf16":
		bad("grad_reduce bf16 goes with precision bf16 (now %s): set --precision bf16 or --grad-reduce fp32", c.Precision)
	}
	if c.Arch == "hf" && c.RecomputeMode() != parallel.RecomputeNone {
		bad("recompute %s: arch hf recomputes nothing (its post-LN layers are not parallel.Block)", c.Recompute)
	}
	if c.Zero < 0 || c.Zero > 3 {
		bad("zero = %d: use 0 (replicated optimizer state), 1 (ZeRO-1: AdamW moments sharded over the data-parallel group), 2 (ZeRO-2: the gradients too) or 3 (ZeRO-3: the parameters too)", c.Zero)
	}
	if c.ZeroGroup != "" {
		if c.Zero == 0 {
			bad("zero_group %q needs zero 1, 2 or 3: it says over which data-parallel ranks ZeRO shards", c.ZeroGroup)
		} else if c.ZeroGroup != "node" {
			n, err := strconv.Atoi(c.ZeroGroup)
			switch {
			case err != nil || n < 2:
				bad("zero_group %q: use node, or a number of data-parallel ranks of at least 2", c.ZeroGroup)
			case c.TP > 0 && c.NTasks > 0 && c.PP >= 0 && c.DP()%n != 0:
				bad("zero_group %d does not divide the data-parallel degree %d: ZeRO shards over groups of that many ranks", n, c.DP())
			}
		}
	}
	if c.Zero >= 2 && c.Arch == "hf" {
		bad("zero %d: arch hf's layers do not hand their gradients over one by one: use zero 1, or arch native", c.Zero)
	}
	if c.Preset != "" {
		if p, err := LookupPreset(c.Preset); err != nil {
			bad("%v", err)
		} else if p.MaxSeq > 0 && c.Seq > p.MaxSeq {
			bad("seq %d is longer than the %d positions of %s: lower --seq", c.Seq, p.MaxSeq, p.Name)
		}
	}
	if c.Positions > 0 && c.Seq > c.Positions {
		bad("seq %d is longer than the %d positions of the model: lower --seq or raise --positions", c.Seq, c.Positions)
	}
	if c.AdamBeta1 < 0 || c.AdamBeta1 >= 1 || c.AdamBeta2 < 0 || c.AdamBeta2 >= 1 {
		bad("adam_beta1 = %g, adam_beta2 = %g: each must be in [0, 1) (0 = the default)", c.AdamBeta1, c.AdamBeta2)
	}
	if c.AdamEps < 0 || c.MinLR < 0 {
		bad("adam_eps = %g, min_lr = %g: must not be negative", c.AdamEps, c.MinLR)
	}
	switch c.Arch {
	case "":
	case "hf":
		if c.Model != "bert" {
			bad("arch hf is BERT's layout: it needs model bert, not %s", c.Model)
		}
		if c.SP {
			bad("arch hf has no sequence parallelism: leave --sp out")
		}
		if c.Seq == 1 {
			bad("arch hf: seq 1 has no room for [CLS] and [SEP]")
		}
	default:
		bad("arch %q: use \"\" (hpcrun's) or hf (BERT's post-LN layout)", c.Arch)
	}
	switch c.Schedule {
	case "", "cosine", "linear", "constant":
	default:
		bad("schedule %q: use cosine, linear or constant", c.Schedule)
	}
	if c.WeightDecay < 0 {
		bad("weight_decay = %g: must not be negative", c.WeightDecay)
	}
	if c.CommTimeout != "" {
		if d, err := time.ParseDuration(c.CommTimeout); err != nil || d < time.Second {
			bad("comm_timeout %q: give a duration of 1s or more, e.g. \"30s\" or \"10m\"", c.CommTimeout)
		}
	}
	switch c.StopSignal {
	case "", "USR1", "USR2":
	default:
		bad("stop_signal %q: use USR1 or USR2", c.StopSignal)
	}
	if c.CkptKeep < 0 || c.MaxRequeues < 0 {
		bad("ckpt_keep = %d, max_requeues = %d: must not be negative", c.CkptKeep, c.MaxRequeues)
	}
	if c.GradClip < 0 {
		bad("grad_clip = %g: must not be negative (0 = no clipping)", c.GradClip)
	}
	switch c.Tokenizer {
	case "", "byte", "gpt2", "wordpiece":
	case "hf":
		if c.VocabFile == "" {
			bad("tokenizer hf reads a Hugging Face tokenizer.json: set vocab_file (--vocab-file) to it or to its directory")
		}
	default:
		bad("tokenizer %q: use byte, gpt2, wordpiece or hf", c.Tokenizer)
	}
	if !(c.LR > 0) {
		bad("lr = %g: must be positive", c.LR)
	}
	c.validateSizes(bad)
	for _, f := range []struct {
		name string
		v    float64
	}{{"lr", c.LR}, {"min_lr", c.MinLR}, {"adam_beta1", c.AdamBeta1}, {"adam_beta2", c.AdamBeta2},
		{"adam_eps", c.AdamEps}, {"weight_decay", c.WeightDecay}, {"grad_clip", c.GradClip}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			bad("%s = %g: must be a finite number", f.name, f.v)
		}
	}
	if p, err := tensor.ParsePrecision(c.Precision); err != nil || p.String() != c.Precision {
		bad("precision %q: use fp32, tf32 or bf16", c.Precision)
	}
	switch c.Device {
	case "auto", "cpu", "cuda":
	default:
		bad("device %q: use auto, cpu or cuda", c.Device)
	}
	switch c.Comm {
	case "auto", "tcp", "nccl":
		if c.Comm == "nccl" && c.Device == "cpu" {
			bad("comm nccl needs device cuda (or auto), not cpu")
		}
	default:
		bad("comm %q: use auto, tcp or nccl", c.Comm)
	}
	if strings.TrimSpace(c.Data) == "" {
		bad("data is empty: use synthetic or a file path")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Bounds on the batch dimensions, far past any real run: with the model's
// (CheckSize) they keep every size the engine computes well inside
// an int, so that a mistyped flag is refused here instead of allocating
// until the rank dies.
const (
	maxBatch      = 1 << 20 // bsz, grad_accum, micro_batches, ntasks
	maxCount      = 1 << 40 // samples, eval_samples, steps, epochs
	maxActivation = 1 << 44 // bsz x seq x dim x layers: one rank's activations, in floats
)

// validateSizes refuses sizes no machine can hold, before anything is
// allocated for them: whether the run fits this machine is the plan's.
func (c Config) validateSizes(bad func(format string, args ...any)) {
	if err := CheckSize(c.Layers, c.Dim, max(c.Positions, c.Seq), c.Vocab, func(n string) string {
		if n == "positions" {
			return "seq (or positions)"
		}
		return n
	}); err != nil {
		bad("%v", err)
		return
	}
	for _, b := range []struct {
		name    string
		v, most int
	}{{"bsz", c.BatchSize, maxBatch}, {"grad_accum", c.GradAccum, maxBatch}, {"micro_batches", c.MicroBatches, maxBatch},
		{"ntasks", c.NTasks, maxBatch},
		{"samples", c.Samples, maxCount}, {"eval_samples", c.EvalSamples, maxCount}, {"steps", c.Steps, maxCount}, {"epochs", c.Epochs, maxCount}} {
		if b.v > b.most {
			bad("%s = %d: more than the %d hpcrun accepts", b.name, b.v, b.most)
			return
		}
	}
	if a := float64(c.BatchSize) * float64(c.Seq) * float64(c.Dim) * float64(c.Layers); a > maxActivation {
		bad("bsz %d x seq %d x dim %d x layers %d: %.3g activations a rank, more than hpcrun accepts", c.BatchSize, c.Seq, c.Dim, c.Layers, a)
	}
}

// TokenizerName is the tokenizer the run uses: the config's, else GPT-2's
// BPE for token files (hpcrun data tokenize writes them with it), else the
// model's default. A run records it in train.toml, so that eval, generate
// and export decode with what the training encoded.
func (c Config) TokenizerName() string {
	switch {
	case c.Tokenizer != "":
		return c.Tokenizer
	case c.LM() && IsTokenData(c.Data):
		return "gpt2"
	}
	return DefaultTokenizer(c.Model)
}

// PositionRows is the number of rows of the position table: positions
// when set (a pretrained model's n_positions), else seq.
func (c Config) PositionRows() int {
	if c.Positions > 0 {
		return c.Positions
	}
	return c.Seq
}

// Adam returns AdamW's beta1, beta2 and epsilon: the config's, or the
// defaults (beta2 0.95 for gpt and llama as GPT-3, nanoGPT, llm.c and
// Llama train, 0.999 for bert as BERT and PyTorch's default).
func (c Config) Adam() (beta1, beta2, eps float64) {
	beta1, beta2, eps = 0.9, 0.95, 1e-8
	if c.Model == "bert" {
		beta2 = 0.999
	}
	if c.AdamBeta1 > 0 {
		beta1 = c.AdamBeta1
	}
	if c.AdamBeta2 > 0 {
		beta2 = c.AdamBeta2
	}
	if c.AdamEps > 0 {
		eps = c.AdamEps
	}
	return beta1, beta2, eps
}

// ValSamples is the number of validation samples an evaluation uses.
func (c Config) ValSamples() int {
	if c.EvalSamples > 0 {
		return c.EvalSamples
	}
	return 512
}

// validatePipeline reports the pipeline settings that cannot run: the
// stage counts and what pipelining does not support yet.
func (c Config) validatePipeline(bad func(format string, args ...any)) {
	if c.PP < 0 || c.MicroBatches < 0 {
		bad("pp = %d, micro_batches = %d: must not be negative", c.PP, c.MicroBatches)
		return
	}
	p := c.Stages()
	if p == 1 {
		if c.MicroBatches > 0 {
			bad("micro_batches needs pp > 1: without a pipeline use --grad-accum")
		}
		if c.PPSplit != "" {
			bad("pp_split needs pp > 1")
		}
		return
	}
	if c.PPSplit != "" {
		if _, err := c.StageLayers(); err != nil {
			bad("%v", err)
		}
	} else if c.Layers > 0 && c.Layers%p != 0 {
		bad("layers %d is not a multiple of pp %d: each pipeline stage holds layers/pp blocks, or give each stage's with --pp-split", c.Layers, p)
	}
	if c.MicroBatches > 0 && c.MicroBatches < p {
		bad("micro_batches %d is fewer than pp %d: 1F1B needs at least one micro-batch per stage in flight", c.MicroBatches, p)
	}
	if c.GradAccum > 1 {
		bad("grad_accum %d with pp %d: a pipeline accumulates over its micro-batches, use --micro-batches", c.GradAccum, p)
	}
	if c.Arch == "hf" {
		bad("arch hf (BERT's own layout) has no pipeline split: use pp 1")
	}
}

// StageLayers is the number of blocks of each pipeline stage: pp_split's,
// or layers/pp each.
func (c Config) StageLayers() ([]int, error) {
	p := c.Stages()
	if c.PPSplit == "" {
		if c.Layers%p != 0 {
			return nil, fmt.Errorf("layers %d is not a multiple of pp %d: each pipeline stage holds layers/pp blocks, or give each stage's with --pp-split", c.Layers, p)
		}
		out := make([]int, p)
		for i := range out {
			out[i] = c.Layers / p
		}
		return out, nil
	}
	parts := strings.Split(c.PPSplit, ",")
	if len(parts) != p {
		return nil, fmt.Errorf("pp_split %q names %d stages, pp is %d: give one block count a stage", c.PPSplit, len(parts), p)
	}
	out := make([]int, p)
	sum := 0
	for i, f := range parts {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("pp_split %q: stage %d has %q blocks: each stage needs a whole number of at least 1", c.PPSplit, i, f)
		}
		out[i], sum = n, sum+n
	}
	if sum != c.Layers {
		return nil, fmt.Errorf("pp_split %q holds %d blocks, the model has layers %d", c.PPSplit, sum, c.Layers)
	}
	return out, nil
}

// Effective is c with every "0 = the default" field set to the value a run
// of c uses (the tokenizer, AdamW's betas and epsilon, the schedule and
// its min_lr, evaluation samples, positions, checkpoints kept, requeues,
// the stop signal, the comm timeout, recompute, pipeline stages and
// micro-batches; a Llama's kv_heads, ffn, norm_eps and rope_theta), for
// showing a config; train.toml keeps the zeros, so that the defaults stay
// the model's.
func (c Config) Effective() Config {
	e := c
	e.Tokenizer = c.TokenizerName()
	e.AdamBeta1, e.AdamBeta2, e.AdamEps = c.Adam()
	if e.Schedule == "" {
		e.Schedule = "cosine"
	}
	if e.MinLR == 0 && e.Schedule != "constant" {
		e.MinLR = c.LR / 10
	}
	e.EvalSamples = c.ValSamples()
	e.Positions = c.PositionRows()
	e.CkptKeep, e.MaxRequeues = c.Checkpoints(), c.Requeues()
	if e.StopSignal == "" {
		e.StopSignal = "USR1"
	}
	if e.CommTimeout == "" {
		e.CommTimeout = nccl.DefaultTimeout.String()
	}
	e.Recompute = cmp.Or(c.Recompute, "none")
	e.PP = c.Stages()
	if e.PP > 1 {
		e.MicroBatches = c.Micro()
	}
	if c.Model == "llama" {
		e.KVHeads, e.FFN, e.NormEps = c.KVHeadCount(), c.Hidden(), c.NormEpsilon()
		e.RopeTheta = cmp.Or(c.RopeTheta, DefaultRopeTheta)
	}
	return e
}

// ZeroShards is the number of data-parallel ranks the ZeRO state is
// sharded over (zero_group): all of them, a number, or for "node" those of
// one node when each node runs ranksPerNode ranks (the data-parallel ranks
// of a node are consecutive: rank = tp + tp*(dp + dp*pp)). Hybrid sharding
// replicates the state across dp/ZeroShards groups.
func (c Config) ZeroShards(ranksPerNode int) (int, error) {
	dp := c.DP()
	switch c.ZeroGroup {
	case "":
		return dp, nil
	case "node":
		tp := max(c.TP, 1)
		if ranksPerNode < tp || ranksPerNode%tp != 0 {
			return 0, fmt.Errorf("zero_group node: %d ranks a node do not hold whole tensor-parallel groups of %d", ranksPerNode, tp)
		}
		n := min(ranksPerNode/tp, dp)
		if n < 2 {
			return 0, fmt.Errorf("zero_group node: a node holds one data-parallel rank (%d ranks of tp %d): nothing to shard within it; leave out zero_group to shard over all %d", ranksPerNode, tp, dp)
		}
		if dp%n != 0 {
			return 0, fmt.Errorf("zero_group node: the %d data-parallel ranks of a node do not divide the data-parallel degree %d", n, dp)
		}
		return n, nil
	}
	n, err := strconv.Atoi(c.ZeroGroup)
	if err != nil || n < 2 || dp%n != 0 {
		return 0, fmt.Errorf("zero_group %q: use node, or a number of at least 2 that divides the data-parallel degree %d", c.ZeroGroup, dp)
	}
	return n, nil
}

// GradReduceBF16 says the data-parallel gradient reduction carries
// bfloat16 (grad_reduce bf16).
func (c Config) GradReduceBF16() bool { return c.GradReduce == "bf16" }

// AttentionFusedOnGPU says whether the attention runs in the fused
// kernels on a CUDA GPU with bf16 tensor cores (sm_80 or newer), as the
// training decides it there with attention auto or fused: at tf32 or
// bf16, for a head size they are built for.
func (c Config) AttentionFusedOnGPU() bool {
	return c.Attention != "unfused" && c.Precision != "fp32" && slices.Contains(tensor.FusedAttentionHeadSizes, c.Dim/max(c.Heads, 1))
}

// RecomputeMode is Recompute as the engine takes it: what each block's
// backward computes again instead of keeping (parallel.Recompute).
func (c Config) RecomputeMode() parallel.Recompute {
	switch c.Recompute {
	case "selective":
		return parallel.RecomputeSelective
	case "full":
		return parallel.RecomputeFull
	}
	return parallel.RecomputeNone
}

// AbsPaths makes the config's file paths (data, vocab_file, resume_from,
// init_from) absolute, so that a job that starts in another directory (a
// template's cd, a requeue) reads the same files.
func (c *Config) AbsPaths() error {
	for _, path := range []*string{&c.Data, &c.VocabFile, &c.ResumeFrom, &c.InitFrom} {
		if *path != "" && *path != "synthetic" && !filepath.IsAbs(*path) {
			abs, err := filepath.Abs(*path)
			if err != nil {
				return err
			}
			*path = abs
		}
	}
	return nil
}

// CommTimeoutDuration is CommTimeout as a duration; 0 when unset (the
// communicator's default).
func (c Config) CommTimeoutDuration() time.Duration {
	d, _ := time.ParseDuration(c.CommTimeout)
	return d
}

// LocalSeq is the positions of a sequence one rank holds outside attention
// and MLP: Seq, or Seq/TP under sequence parallelism.
func (c Config) LocalSeq() int {
	if c.SP && c.TP > 1 {
		return c.Seq / c.TP
	}
	return c.Seq
}
