package metrics

import (
	"encoding/json"
	"math"
)

// Version is the format version the Writer records in the run line ("v").
// Readers accept files without it (written before versioning, with the
// config spread into the run line) and files with a newer one (unknown
// fields are ignored).
const Version = 1

// Line types, the value of each line's "type" field.
const (
	TypeRun  = "run"
	TypeStep = "step"
	TypeEval = "eval"
	TypeGPU  = "gpu"
	TypeEnd  = "end"
)

// End statuses.
const (
	StatusCompleted   = "completed"   // all steps done
	StatusFailed      = "failed"      // stopped by an error; End.Error says which
	StatusInterrupted = "interrupted" // stopped by a signal (scancel, time limit)
)

// RunInfo is the first line of every rank file: what is trained and where.
type RunInfo struct {
	V int `json:"v"` // format version; the Writer sets it

	// Config is the full resolved training config (config.Config, or anything
	// that marshals to a JSON object with its fields: model, layers, dim,
	// heads, seq, bsz, grad_accum, steps, precision, device, ntasks, tp, ...).
	Config json.RawMessage `json:"config,omitempty"`

	Rank   int    `json:"rank"`
	World  int    `json:"world"`
	TPRank int    `json:"tp_rank"`
	DPRank int    `json:"dp_rank"`
	TP     int    `json:"tp"`
	DP     int    `json:"dp"`
	PPRank int    `json:"pp_rank,omitempty"` // pipeline stage
	PP     int    `json:"pp,omitempty"`      // pipeline stages (0 or 1: none)
	Host   string `json:"host"`
	Device string `json:"device"` // "cpu", "cuda:0 NVIDIA H100 80GB HBM3", ...

	// TotalSteps is the number of optimizer steps the run will make, when
	// known (lets hpcrun watch draw a bar when train.toml says steps = 0).
	TotalSteps int `json:"total_steps,omitempty"`
	// Params is the number of model parameters (whole model, not one shard).
	Params int64 `json:"params,omitempty"`
	// FlopsPerToken is the model's training FLOPs per token, forward plus
	// backward, for the whole model (spec.ModelFlopsPerToken: 6*params +
	// attention, recomputation not counted); 0 if unknown.
	FlopsPerToken float64 `json:"flops_per_token,omitempty"`
	// HardwareFlopsPerToken is FlopsPerToken plus the forward activation
	// recomputation runs again (spec.HardwareFlopsPerToken), what HFU
	// counts; 0 if unknown (a run line of an older hpcrun).
	HardwareFlopsPerToken float64 `json:"hardware_flops_per_token,omitempty"`
	// PeakFlops is one device's peak FLOP/s at the run's precision; 0 if
	// unknown. With FlopsPerToken it gives MFU.
	PeakFlops float64 `json:"peak_flops,omitempty"`
	// Start is the Unix time in seconds the rank started.
	Start float64 `json:"start,omitempty"`
}

// Step is one optimizer step as seen by one rank.
type Step struct {
	Step     int     `json:"step"` // 1-based optimizer step
	Epoch    int     `json:"epoch"`
	Loss     float64 `json:"loss"` // NaN is written as null
	LR       float64 `json:"lr"`
	GradNorm float64 `json:"grad_norm"`
	// Tokens and Samples are what this rank's data-parallel replica consumed
	// in this step (all micro-batches); TP ranks of one replica report the
	// same numbers, and the reader counts each replica once.
	Tokens  int64   `json:"tokens"`
	Samples int64   `json:"samples"`
	StepS   float64 `json:"step_s"` // wall seconds of the step on this rank
	CommS   float64 `json:"comm_s"` // of which seconds spent in communication
	// MemBytes and MemPeakBytes are the engine's own accounting of tensor
	// memory on this rank (now, and peak since start).
	MemBytes     int64 `json:"mem_bytes"`
	MemPeakBytes int64 `json:"mem_peak_bytes"`
	// HostSyncs is how many times the host waited for the GPU in the step:
	// one for a language model (the norm and the loss, read together),
	// more where the loss is read each micro-batch (the classifier, a
	// pipeline stage) or collectives go through the host; 0 and left out
	// on the CPU.
	HostSyncs int64 `json:"host_syncs,omitempty"`
	// Bubble is, on a pipeline stage (pp > 1), the share of the step's
	// schedule (its forwards and backwards, up to the last send) this rank
	// spent waiting on a neighbour stage; BubbleTheory is the 1F1B
	// schedule's (p-1)/(m+p-1) for p stages and m micro-batches. Both are
	// written when BubbleTheory > 0, left out without a pipeline.
	Bubble       float64 `json:"bubble,omitempty"`
	BubbleTheory float64 `json:"bubble_theory,omitempty"`
	TS           float64 `json:"ts"` // Unix seconds at the end of the step; the Writer fills 0
}

// Eval is one validation pass.
type Eval struct {
	Step     int     `json:"step"`
	Loss     float64 `json:"loss"`
	Accuracy float64 `json:"accuracy"` // NaN (written as null) when the model has none (GPT)
	TS       float64 `json:"ts"`
}

// GPUSample is device memory and utilisation read through NVML.
type GPUSample struct {
	Index         int     `json:"index"`           // NVML device index
	MemUsedBytes  int64   `json:"mem_used_bytes"`  // used by all processes on the device
	MemTotalBytes int64   `json:"mem_total_bytes"` // device capacity
	UtilPct       float64 `json:"util_pct"`        // GPU busy share over NVML's last sample period, 0-100
	TS            float64 `json:"ts"`
}

// End is the last line of a rank file.
type End struct {
	Status string  `json:"status"` // StatusCompleted, StatusFailed or StatusInterrupted
	Error  string  `json:"error,omitempty"`
	WallS  float64 `json:"wall_s"`
	TS     float64 `json:"ts"`
}

// nan is the value of a float field written as null.
var nan = math.NaN()
