package plan

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// WriteText prints the plan as hpcrun plan's table: the model and the
// job, memory per rank line by line, whether it fits (and sug, what
// would, when it does not), the pipeline's stages, and the step time.
func (pl *Plan) WriteText(w io.Writer, sug []Suggestion) error {
	name := pl.Model
	if pl.Preset != "" {
		name += " (preset " + pl.Preset + ")"
	}
	accum := "grad_accum"
	if pl.PP > 1 {
		accum = "micro_batches"
	}
	fmt.Fprintf(w, "plan: %s, %d layers dim %d heads %d seq %d, vocab %d (padded %d), %.1fM params, bsz %d x %s %d, %s\n",
		name, pl.Layers, pl.Dim, pl.Heads, pl.Seq, pl.Vocab, pl.PaddedVocab, float64(pl.Params)/1e6, pl.BatchSize, accum, pl.GradAccum, pl.Precision)
	modes := ""
	if pl.SP {
		modes += " + sequence parallel"
	}
	if pl.Zero > 0 {
		modes += fmt.Sprintf(" + ZeRO-%d", pl.Zero)
		if pl.ZeroShards > 0 && pl.ZeroShards < pl.DP {
			modes += fmt.Sprintf(" over groups of %d (hybrid)", pl.ZeroShards)
		}
	}
	if pl.Recompute != "" {
		modes += " + recompute " + pl.Recompute
	}
	pp := ""
	if pl.PP > 1 {
		pp = fmt.Sprintf("pp %d x ", pl.PP)
	}
	fmt.Fprintf(w, "job:  %s = %stp %d x dp %d%s on %s; device %s, %s a rank\n", units.Count(pl.NTasks, "task"), pp, pl.TP, pl.DP, modes, units.Count(pl.Nodes, "node"), pl.Device.Name, bytesIEC(pl.Device.MemBytes))
	m := pl.Memory
	row := func(what string, n int64, note string) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-22s %12s  %s", what, bytesIEC(n), note), " "))
	}
	if pl.PP > 1 {
		fmt.Fprintln(w, "\nmemory per rank (of the stage that needs the most)")
	} else {
		fmt.Fprintln(w, "\nmemory per rank (every rank alike)")
	}
	params, grads := "this rank's shard, fp32", ""
	if pl.Zero >= 2 && pl.ZeroShards > 0 {
		grads = fmt.Sprintf("ZeRO-%d: this rank's 1/%d of the blocks', one block's whole", pl.Zero, pl.ZeroShards)
		if pl.Zero == 3 {
			params += fmt.Sprintf("; ZeRO-3: this rank's 1/%d of the blocks', one block gathered whole", pl.ZeroShards)
		}
	}
	row("parameters", m.Params, params)
	row("gradients", m.Grads, grads)
	moments := "m and v, fp32"
	if pl.Zero > 0 && pl.ZeroShards > 0 {
		moments += fmt.Sprintf(", ZeRO-%d: this rank's 1/%d of each bucket", pl.Zero, pl.ZeroShards)
	}
	row("AdamW moments", m.Optimizer, moments)
	row("fp32 masters", m.Masters, "none: the weights are fp32")
	split := fmt.Sprintf("split over tp %d", pl.TP)
	if pl.SP {
		split += ", layer norms and residuals along the sequence"
	}
	rc := "(no recompute)"
	if pl.Recompute != "" {
		rc = "(recompute " + pl.Recompute + ")"
	}
	act := fmt.Sprintf("%s saved a block x %d blocks, %s of scratch shared by them, %s %s", bytesIEC(m.SavedPerBlock), pl.Layers, bytesIEC(m.ActivationsPerBlock-m.SavedPerBlock), split, rc)
	for _, st := range pl.Stages {
		if st.Memory == m {
			act = fmt.Sprintf("stage %d's %d blocks: %s saved a block for each of %d micro-batches in flight, %s of scratch, %s %s",
				st.Stage, st.Blocks, bytesIEC(m.SavedPerBlock), st.InFlight, bytesIEC(m.ActivationsPerBlock-m.SavedPerBlock), split, rc)
			break
		}
	}
	row("activations", m.Blocks, act)
	row("embeddings, residual", m.Embeddings, "embedding outputs, residual-stream gradients, ln_f")
	row("logits, loss", m.Logits, "head output (an LM: its gradient written over it), cross-entropy buffers")
	if pl.SP {
		row("sequence-parallel bufs", m.SPBuffers, "shared full-sequence buffers, layer-norm/position gradient bucket")
	}
	row("workspace", m.Workspace, "GPU kernels' scratch")
	row("gradient bucket", m.GradBucket, "device buffer of the dp all-reduce")
	row("= engine peak", m.EnginePeak, "what mem_peak_bytes counts")
	row("comm buffers", m.CommBuffers, "NCCL's, or the host staging of packed bf16 collectives")
	row("CUDA context", m.Context, "")
	verdict := fmt.Sprintf("fits %s, %s to spare", pl.Device.Name, bytesIEC(pl.Headroom))
	if !pl.Fits {
		verdict = fmt.Sprintf("DOES NOT FIT %s: %s over", pl.Device.Name, bytesIEC(-pl.Headroom))
	}
	row("= total", m.Total, fmt.Sprintf("of %s: %s", bytesIEC(pl.Device.MemBytes), verdict))
	if !pl.Fits {
		fmt.Fprintln(w, WhatFits(sug))
	}
	if len(pl.Stages) > 0 {
		fmt.Fprintln(w, "\npipeline stages (the memory above is the largest, the step below the slowest)")
		for _, st := range pl.Stages {
			fmt.Fprintf(w, "  stage %-3d %3d blocks, %d in flight  activations %10s  engine peak %10s  total %10s  step %.4f s\n",
				st.Stage, st.Blocks, st.InFlight, bytesIEC(st.Memory.Blocks), bytesIEC(st.Memory.EnginePeak), bytesIEC(st.Memory.Total), st.Time.StepS)
		}
	}
	t := pl.Time
	fmt.Fprintln(w, "\nstep (predicted)")
	fmt.Fprintf(w, "  %-10s %9.4f s  %.2f GFLOP of GEMMs a rank at %.1f GFLOP/s\n", "compute", t.ComputeS, t.GemmFlops/1e9, t.Rate/1e9)
	fmt.Fprintf(w, "  %-10s %9.4f s  elementwise kernels at %.1f GB/s, AdamW at %.1f GB/s\n", "memory", t.MemoryS, pl.Device.MemBandwidth/1e9, pl.Device.optBandwidth()/1e9)
	p2p := ""
	if pl.PP > 1 {
		p2p = fmt.Sprintf(", pp %s point-to-point (%d transfers)", bytesIEC(int64(t.PPBytes)), t.Transfers)
	}
	fmt.Fprintf(w, "  %-10s %9.4f s  tp %s, dp %s sent a rank; %d collectives%s\n", "comm", t.CommS, bytesIEC(int64(t.TPBytes)), bytesIEC(int64(t.DPBytes)), t.Collectives, p2p)
	if t.TurnS > 0 {
		fmt.Fprintf(w, "  %-10s %9.4f s  of the comm above, waiting while the ranks that share these cores run: it overlaps their work, so the step does not count it\n", "turns", t.TurnS)
	}
	if pl.PP > 1 {
		fmt.Fprintf(w, "  %-10s %9.4f s  1F1B: the micro-batches' work stretched by (m+p-1)/m, idle share (p-1)/(m+p-1) = %.2f\n", "bubble", t.BubbleS, t.Bubble)
	}
	share := fmt.Sprintf("comm %.0f%% of it", 100*t.CommShare)
	if t.BubbleS > 0 {
		// The engine's comm_s holds the stages' waits in the bubble.
		share += fmt.Sprintf(", %.0f%% with the bubble's waits (the comm share hpcrun metrics measures)", 100*t.EngineCommS()/t.StepS)
	}
	fmt.Fprintf(w, "  %-10s %9.4f s  %s\n", "step", t.StepS, share)
	fmt.Fprintf(w, "  %-10s %9.0f    MFU %.1f%% of %.4g GFLOP/s x %s\n", "tokens/s", t.TokensPerS, 100*t.MFU, t.PeakFlops/1e9, units.Count(pl.NTasks, "rank"))
	if t.HardwareFlopsPerToken > t.FlopsPerToken {
		fmt.Fprintf(w, "  %-10s %8.1f%%    the forward that recompute %s runs again counted\n", "HFU", 100*t.HFU, pl.Recompute)
	}
	fmt.Fprintf(w, "rates: %s\n", pl.Device.Source)
	if t.CommRates != "" {
		fmt.Fprintf(w, "comm rates: %s\n", t.CommRates)
	}
	for _, x := range append(slices.Clone(pl.Device.Warnings), t.Warnings...) {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
	for _, n := range pl.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// WhatFits is one line listing the suggestions (Suggest's), or saying
// that nothing would fit.
func WhatFits(sug []Suggestion) string {
	if len(sug) == 0 {
		return "what would fit: nothing within 16x more nodes, tp or grad-accum, sequence parallelism, ZeRO, recomputation or bf16; choose a smaller model or a larger device"
	}
	parts := make([]string, len(sug))
	for i, s := range sug {
		parts[i] = fmt.Sprintf("%s (%s)", s.Flags, bytesIEC(s.Total))
	}
	return "what would fit: " + strings.Join(parts, ", ")
}

// Refusal says that the plan does not fit, by how much, and what would
// (sug); force is how to go on anyway ("submit --force to submit it anyway").
func (pl *Plan) Refusal(sug []Suggestion, force string) string {
	return fmt.Sprintf("the run needs %s a rank, %s over the %s of %s (%s); %s",
		bytesIEC(pl.Memory.Total), bytesIEC(-pl.Headroom), bytesIEC(pl.Device.MemBytes), pl.Device.Name, WhatFits(sug), force)
}

// bytesIEC writes n bytes as hpcrun's tables do, with two decimals.
func bytesIEC(n int64) string { return units.Bytes(n, 2) }

// Check is a run's plan beside what the run measured: hpcrun metrics'
// "plan vs run" rows.
type Check struct {
	Rows []CheckRow `json:"rows"`
	// Note says when the plan was for another device than the run had.
	Note string `json:"note,omitempty"`
}

// CheckRow is one figure predicted and measured; ErrorPct is ErrorPct's,
// null when unknown.
type CheckRow struct {
	What      string        `json:"what"`
	Predicted metrics.Float `json:"predicted"`
	Measured  metrics.Float `json:"measured"`
	ErrorPct  metrics.Float `json:"error_pct"`
	// Caveat says why a time's prediction may be far off: the plan's CPU
	// rates were the defaults, or the machine was busy as it planned.
	Caveat string `json:"caveat,omitempty"`
}

// checkWhat names Compare's figures in hpcrun metrics' table (its
// summary above has the MFU).
var checkWhat = map[string]string{
	"engine_peak": "engine peak B/rank", "device_total": "GPU peak B/rank",
	"step_s": "step s", "comm_share": "comm share", "tokens_per_s": "tokens/s",
}

// CheckRun sets the plan (as meta.json keeps it: JSON) beside the run's
// summary; nil when there is no plan, or it does not read.
func CheckRun(planJSON []byte, s metrics.Summary) *Check {
	if len(planJSON) == 0 {
		return nil
	}
	var pl Plan
	if json.Unmarshal(planJSON, &pl) != nil {
		return nil
	}
	var rows []CheckRow
	caveat := pl.Device.timeCaveat()
	for _, f := range Compare(&pl, s) {
		if what, ok := checkWhat[f.Key]; ok {
			r := CheckRow{What: what, Predicted: f.Predicted, Measured: f.Measured, ErrorPct: f.ErrorPct}
			if f.Key != "engine_peak" && f.Key != "device_total" {
				r.Caveat = caveat
			}
			rows = append(rows, r)
		}
	}
	pc := &Check{Rows: rows}
	if pl.Device.CUDA != strings.HasPrefix(s.Config.Device, "cuda") && s.Config.Device != "" {
		pc.Note = fmt.Sprintf("the plan was made for %s, the run had %s: the figures do not compare", pl.Device.Name, s.Config.Device)
	}
	return pc
}

// WriteText prints the rows as hpcrun metrics does under a run's summary;
// nothing for a nil Check.
func (pc *Check) WriteText(w io.Writer) {
	if pc == nil {
		return
	}
	fmt.Fprintf(w, "\n%-20s %14s %14s %8s\n", "plan vs run", "predicted", "measured", "error")
	num := func(v metrics.Float) string {
		if !v.Known() {
			return "-"
		}
		if math.Abs(float64(v)) >= 1e4 {
			return strconv.FormatFloat(float64(v), 'f', 0, 64)
		}
		return strconv.FormatFloat(float64(v), 'g', 4, 64)
	}
	for _, r := range pc.Rows {
		e := "-"
		if r.ErrorPct.Known() {
			e = fmt.Sprintf("%+.1f%%", float64(r.ErrorPct))
		}
		line := fmt.Sprintf("%-20s %14s %14s %8s", r.What, num(r.Predicted), num(r.Measured), e)
		if r.Caveat != "" {
			line += "  (" + r.Caveat + ")"
		}
		fmt.Fprintln(w, line)
	}
	if pc.Note != "" {
		fmt.Fprintf(w, "note: %s\n", pc.Note)
	}
}

// timeCaveat says why d's times may be far from a run's: its CPU rates
// were the defaults (hostCPU's Source), the machine was busy as it planned
// (its warning); "" for a GPU, or measured rates on an idle machine.
func (d Device) timeCaveat() string {
	if d.CUDA {
		return ""
	}
	var why []string
	if strings.HasPrefix(d.Source, defaultRatesSource) {
		why = append(why, "planned with default CPU rates, not measured: hpcrun bench gemm")
	}
	for _, w := range d.Warnings {
		if rest, ok := strings.CutPrefix(w, busyWarning); ok {
			load, _, _ := strings.Cut(rest, ":")
			why = append(why, "planned on a busy machine "+strings.TrimSpace(load))
		}
	}
	return strings.Join(why, "; ")
}
