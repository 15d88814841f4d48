package metrics

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rankgrid"
)

// Float is a figure that may be unknown: NaN, written as null in JSON.
type Float float64

// MarshalJSON writes NaN and infinities as null.
func (f Float) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return appendNumber(nil, v), nil
}

// Known reports whether f is a number.
func (f Float) Known() bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// RunConfig is the part of the training config a summary shows.
type RunConfig struct {
	Model     string `json:"model"`
	Preset    string `json:"preset,omitempty"`
	Layers    int    `json:"layers"`
	Dim       int    `json:"dim"`
	Heads     int    `json:"heads"`
	Seq       int    `json:"seq"`
	BatchSize int    `json:"bsz"`
	GradAccum int    `json:"grad_accum"`
	Steps     int    `json:"steps"`
	Precision string `json:"precision"`
	Device    string `json:"device"` // the device the ranks report ("cpu", "cuda:0 ..."), else the config's
	NTasks    int    `json:"ntasks"`
	TP        int    `json:"tp"`
	DP        int    `json:"dp"`
	PP        int    `json:"pp,omitempty"` // pipeline stages (0 or 1: none)
	// MicroBatches is the micro-batches a pipeline step runs (0: pp).
	MicroBatches int  `json:"micro_batches,omitempty"`
	SP           bool `json:"sp,omitempty"`   // sequence parallelism
	Zero         int  `json:"zero,omitempty"` // the ZeRO stage (1: optimizer state sharded; 2: gradients too)
	// Recompute is the activation recomputation: selective or full ("" or
	// none: none).
	Recompute string `json:"recompute,omitempty"`
}

// Layout is the job's parallel layout in words: "pp 2 x tp 2 x dp 1"
// (no pp for one stage), then "+ sp", "+ ZeRO-1" (to -3) and "+ recompute full"
// when used; "-" when unknown.
func (c RunConfig) Layout() string {
	if c.TP == 0 {
		return "-"
	}
	s := fmt.Sprintf("tp %d x dp %d", c.TP, max(c.DP, 1))
	if c.PP > 1 {
		s = fmt.Sprintf("pp %d x %s", c.PP, s)
	}
	if c.SP {
		s += " + sp"
	}
	if c.Zero > 0 {
		s += fmt.Sprintf(" + ZeRO-%d", c.Zero)
	}
	if c.Recompute != "" && c.Recompute != "none" {
		s += " + recompute " + c.Recompute
	}
	return s
}

// Accum says how a step accumulates: "grad_accum N", or for a pipeline
// "micro_batches N".
func (c RunConfig) Accum() string {
	if c.PP > 1 {
		return fmt.Sprintf("micro_batches %d", max(c.MicroBatches, c.PP))
	}
	return fmt.Sprintf("grad_accum %d", max(c.GradAccum, 1))
}

// StageBubble is one pipeline stage's measured bubble and the theory.
type StageBubble struct {
	Stage    int   `json:"stage"`
	Measured Float `json:"measured"`
	Theory   Float `json:"theory"`
}

// RankMemory is the peak memory of one rank.
type RankMemory struct {
	Rank int `json:"rank"`
	// EnginePeakBytes is the engine's own accounting of tensor memory.
	EnginePeakBytes int64 `json:"engine_peak_bytes"`
	// GPUPeakBytes and GPUTotalBytes come from NVML (the whole device, all
	// processes); 0 when the rank recorded no GPU samples.
	GPUPeakBytes  int64 `json:"gpu_peak_bytes,omitempty"`
	GPUTotalBytes int64 `json:"gpu_total_bytes,omitempty"`
	GPUUtilPct    Float `json:"gpu_util_mean_pct"`
}

// Summary is what hpcrun metrics shows about one run.
type Summary struct {
	ExecID string    `json:"execid"`
	JobID  string    `json:"jobid,omitempty"`
	Config RunConfig `json:"config"`
	// Status is pending (no metrics yet), starting (empty rank files),
	// running, completed, failed or interrupted.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"` // the first failed rank's error, "rank N: ..."
	Ranks  int    `json:"ranks"`           // rank files found
	Ended  int    `json:"ranks_ended"`     // of which have written their end line
	// NoEnd are the ranks of the world that have written no end line (no
	// file at all included), in rank order.
	NoEnd []int `json:"-"`
	// Step is the last step every rank has finished; TotalSteps the
	// planned number (0 when unknown).
	Step       int   `json:"step"`
	TotalSteps int   `json:"total_steps,omitempty"`
	WallS      Float `json:"wall_s"`
	LastTS     Float `json:"last_ts"` // Unix time of the newest line

	// The first WarmupSteps steps (compilation, caches, allocator) are kept
	// out of the figures below; WarmupStepS is their mean step time.
	WarmupSteps int   `json:"warmup_steps"`
	WarmupStepS Float `json:"warmup_step_s"`
	// Step time of the job: for each step the slowest rank's, then the
	// percentiles over the steps after warm-up.
	StepP50S Float `json:"step_p50_s"`
	StepP90S Float `json:"step_p90_s"`

	SamplesPerS        Float `json:"samples_per_s"`
	TokensPerS         Float `json:"tokens_per_s"`
	SamplesPerSPerRank Float `json:"samples_per_s_per_rank"`
	TokensPerSPerRank  Float `json:"tokens_per_s_per_rank"`
	// CommShare is the share of step time spent in communication, over all
	// ranks.
	CommShare Float `json:"comm_share"`
	// CommP50S is the median over the steps after warm-up of the ranks'
	// mean seconds in communication a step: the typical step's, as
	// StepP50S is, where CommShare counts the steps a rank was held up.
	CommP50S Float `json:"comm_p50_s"`
	// Bubble is, for a pipeline (pp > 1), each stage's share of its
	// schedule spent waiting on a neighbour, the mean over the stage's
	// ranks and the steps after warm-up, beside the 1F1B theory.
	Bubble []StageBubble `json:"bubble,omitempty"`

	// MemorySource says where Memory comes from: "nvml" when the ranks
	// recorded GPU samples, else "engine" (the engine's own accounting).
	MemorySource string       `json:"memory_source"`
	Memory       []RankMemory `json:"memory"`

	ModelFlopsPerS Float `json:"model_flops_per_s"` // unknown without the run line's flops_per_token
	// PeakFlops is the peak FLOP/s of one device that MFU is over: the
	// one the run's plan used (meta.json's plan), else the run line's;
	// unknown without either (MFU is then unknown too).
	PeakFlops Float `json:"peak_flops"`
	MFU       Float `json:"mfu"` // ModelFlopsPerS / (PeakFlops x world), metrics.MFU
	// HFU is metrics.HFU, over the same peak: MFU with recomputation's
	// forward counted. Unknown without the run line's
	// hardware_flops_per_token.
	HFU Float `json:"hfu"`

	LastLoss     Float `json:"last_loss"` // mean over data-parallel replicas at Step
	LastEvalLoss Float `json:"last_eval_loss"`
	BestAccuracy Float `json:"best_accuracy"`
	LastAccuracy Float `json:"last_accuracy"`

	// Versions are the format versions of the run lines (0: before
	// versioning); more than one means ranks of different hpcrun builds.
	Versions []int `json:"versions,omitempty"`
	// Problems are unreadable lines and files ("path:line: why").
	Problems []string `json:"problems,omitempty"`
	// Notes say what the reader should know to trust the figures.
	Notes []string `json:"notes,omitempty"`
}

// JobState is what the scheduler says of a run's job, as Settle reads it.
type JobState struct {
	State  string // a Slurm state, NOT_SUBMITTED, or "" when nothing is known
	Over   bool   // the job will not run again
	Reason string // why it is in State (sbatch's own words for NOT_SUBMITTED)
	Check  bool   // the job runs a parallel check (hpcrun check): it writes no metrics
	ExecID string
	// Restarts is how many times the job was requeued, MaxRestarts how
	// many times the run lets it be (0: not known).
	Restarts, MaxRestarts int
}

// Settle reconciles the ranks' account of the run with its job's state. A
// run never submitted is "not submitted", with sbatch's words; a run whose
// job is over is not pending, and its ranks that wrote no end line were
// killed (kill -9, the OOM killer, a lost node) and are named before any
// peer that failed for want of them; a run interrupted by the time-limit
// signal whose job is queued again is requeued, not over. Every reader of a
// run's state (metrics, queue, watch, the dashboard) settles it here.
func (s *Summary) Settle(j JobState) {
	state, execID := j.State, j.ExecID
	switch {
	case state == "":
		return
	case state == "NOT_SUBMITTED":
		s.Status, s.Error = StatusNotSubmitted, firstLine(j.Reason)
		return
	case !j.Over:
		if s.Status == StatusInterrupted {
			restart := "requeued"
			if j.Restarts > 0 {
				restart = fmt.Sprintf("restart %d", j.Restarts)
				if j.MaxRestarts > 0 {
					restart += fmt.Sprintf(" of at most %d", j.MaxRestarts)
				}
			}
			s.Status = StatusRequeued
			s.Error = fmt.Sprintf("%s, job %s: it resumes from its checkpoint", restart, strings.ToLower(state))
		}
		return
	}
	switch s.Status {
	case "pending":
		s.Status = strings.ToLower(state)
		if j.Check {
			s.Notes = []string{"a parallel check, not a training: its pass/fail table is in hpcrun logs " + execID}
			return
		}
		s.Notes = []string{"the job ended " + state + " before any rank wrote metrics: see hpcrun logs --err " + execID}
		return
	case StatusCompleted:
		return
	}
	if len(s.NoEnd) == 0 {
		return
	}
	killed := fmt.Sprintf("%s wrote no end line before the job ended %s: killed, or stopped before it could", rankList(s.NoEnd), state)
	if s.Status == StatusFailed && s.Error != "" {
		killed += "; then " + s.Error
	}
	s.Status, s.Error = StatusFailed, killed
	s.Notes = append(s.Notes, "see hpcrun logs --err "+execID+" for how the ranks were stopped")
}

// The statuses Settle gives from the job's state: a run stopped by the
// time-limit signal whose job is queued again, and a run whose submission
// failed.
const (
	StatusRequeued     = "requeued"
	StatusNotSubmitted = "not submitted"
)

// firstLine is s up to its first newline.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// rankList is "rank 3", "ranks 0-3, 7": the ranks, in order, as ranges.
func rankList(ranks []int) string {
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ranks[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		}
		i = j + 1
	}
	if len(ranks) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

// WarmupSteps is how many first steps a summary of n steps treats as
// warm-up: 3, or a quarter of the steps when there are fewer than 12.
func WarmupSteps(n int) int {
	return min(3, n/4)
}

// Curves are the per-step series a plot draws.
type Curves struct {
	Steps       []Float `json:"steps"`
	Loss        []Float `json:"loss"`          // mean over replicas
	SamplesPerS []Float `json:"samples_per_s"` // the job's, from the slowest rank's step time
	EvalSteps   []Float `json:"eval_steps"`
	EvalLoss    []Float `json:"eval_loss"`
	Accuracy    []Float `json:"accuracy"` // NaN for models without one
}

// Summarize computes the summary of a run read whole by ReadRun or a
// Follower, and the curves to plot. ReadSummary computes the same from the
// files without keeping their steps.
func Summarize(run *Run) (Summary, Curves) {
	its := make([]stepIter, len(run.Ranks))
	for i, r := range run.Ranks {
		its[i] = &sliceIter{steps: r.Steps}
	}
	// Slices do not fail.
	most := 0
	for _, r := range run.Ranks {
		most = max(most, len(r.Steps))
	}
	seen, agg, _ := join(its, tpZero(run), AllPoints, most)
	return summarize(run, seen, agg)
}

// stepIter yields one rank's steps in ascending step order, each step
// once: those a resume replaced are left out.
type stepIter interface {
	next() (Step, bool)
	// err is why next stopped early, nil at the end of the steps.
	err() error
}

// sliceIter iterates over a RankLog's steps.
type sliceIter struct {
	steps []Step
	i     int
}

func (it *sliceIter) next() (Step, bool) {
	if it.i == len(it.steps) {
		return Step{}, false
	}
	it.i++
	return it.steps[it.i-1], true
}

func (it *sliceIter) err() error { return nil }

// tpZero marks the ranks whose data-parallel replica is counted by them
// (CountsReplica).
func tpZero(run *Run) []bool {
	c := runConfig(run, firstInfo(run))
	out := make([]bool, len(run.Ranks))
	for i, r := range run.Ranks {
		out[i] = CountsReplica(r.Rank, r.Info, c)
	}
	return out
}

// CountsReplica says whether rank counts its data-parallel replica's
// samples, tokens and loss, so that each replica is counted once: tp rank
// 0 of the first pipeline stage (every stage sees the same tokens), from
// its run line info, else from its place on the grid of c.
func CountsReplica(rank int, info *RunInfo, c RunConfig) bool {
	at := rankgrid.Of(rank, c.TP, c.DP)
	if info != nil {
		at.TP, at.PP = info.TPRank, info.PPRank
	}
	return at.TP == 0 && at.PP == 0
}

// rankSeen is what the join saw of one rank's steps.
type rankSeen struct {
	steps   int     // steps, after resumes
	lastTS  float64 // of the last step; NaN without steps
	memPeak int64   // engine peak over the steps
	// bubble sums the steps' bubble from step index k on (k = 0..3, as
	// jobAgg's sums); theory is the last step's bubble_theory.
	bubble [4]float64
	theory float64
}

// jobAgg is the job's steps as a summary needs them, accumulated in
// ascending step order over the done steps (those every rank finished),
// the same sums in the same order as a pass over all steps at the end.
type jobAgg struct {
	done  int       // done steps
	times []float64 // slowest rank's step time of each done step
	comms []float64 // the ranks' mean comm time of each done step
	// last done step and its loss, summed over replicas
	lastStep  int
	lastLoss  float64
	lastLossN int
	// sums over the done steps from index k on, for k = 0..3 (the warm-up
	// is at most 3 steps and known only at the end)
	total, sumStep, sumComm [4]float64
	samples, tokens         [4]int64
	curves                  *Curves // nil: not kept
	// maxPoints > 0 bounds the curves: they keep every stride-th done
	// step, the stride doubling whenever they reach 2*maxPoints points,
	// and the last done step.
	maxPoints, stride int
	lastPoint         [3]Float
}

// Arguments of ReadSummary's points.
const (
	// NoCurves keeps no step curves (the summary alone).
	NoCurves = 0
	// AllPoints keeps a point of the step curves for every step.
	AllPoints = -1
	// PlotPoints is enough points for a plot in a terminal or an image.
	PlotPoints = 4096
)

// StepAcross is one step across the ranks that reported it, as every
// reader of a run aggregates one (the summary, the dashboard's charts):
// the slowest rank's step time, the ranks' summed step and comm times, and
// the samples, tokens and loss of the data-parallel replicas, each counted
// once, by the rank CountsReplica marks.
type StepAcross struct {
	Step                         int
	Ranks                        int
	MaxStepS, SumStepS, SumCommS float64
	Samples, Tokens              int64
	LossSum                      float64 // NaN once a replica's loss is
	LossN                        int
}

// Add takes one rank's step; counts says the rank counts its replica
// (CountsReplica).
func (j *StepAcross) Add(st Step, counts bool) {
	j.Ranks++
	j.MaxStepS = max(j.MaxStepS, st.StepS)
	j.SumStepS += st.StepS
	j.SumCommS += st.CommS
	if counts {
		j.Samples += st.Samples
		j.Tokens += st.Tokens
		if !math.IsNaN(st.Loss) {
			j.LossSum += st.Loss
		} else {
			j.LossSum = math.NaN()
		}
		j.LossN++
	}
}

// Loss is the mean loss over the replicas (NaN without one).
func (j StepAcross) Loss() float64 { return mean(j.LossSum, j.LossN) }

// CommS is the ranks' mean comm time.
func (j StepAcross) CommS() float64 { return j.SumCommS / float64(j.Ranks) }

// join lines the ranks' steps up by step number, walking all ranks in
// step order at once: a step every rank has finished goes into the
// aggregate, in rank order. Data-parallel replicas are counted once, by
// the ranks tp0 marks. It keeps two float64s per done step (the step and
// comm times), room for about steps of them made at once, and points of
// the curves as asked (AllPoints, NoCurves or at most about that many).
func join(its []stepIter, tp0 []bool, points, steps int) ([]rankSeen, jobAgg, error) {
	seen := make([]rankSeen, len(its))
	heads := make([]Step, len(its))
	live := make([]bool, len(its))
	// One allocation, not a slice grown by copying: a million steps would
	// allocate five times their 8 MB, and the collector would run as
	// often.
	agg := jobAgg{times: make([]float64, 0, steps), comms: make([]float64, 0, steps)}
	if points != NoCurves {
		agg.curves, agg.maxPoints, agg.stride = &Curves{}, points, 1
	}
	advance := func(i int) error {
		s, ok := its[i].next()
		if !ok {
			live[i] = false
			return its[i].err()
		}
		heads[i], live[i] = s, true
		r := &seen[i]
		r.steps++
		r.lastTS = s.TS
		r.memPeak = max(r.memPeak, s.MemPeakBytes, s.MemBytes)
		if s.BubbleTheory > 0 {
			for k := 0; k < min(r.steps, 4); k++ {
				r.bubble[k] += s.Bubble
			}
			r.theory = s.BubbleTheory
		}
		return nil
	}
	for i := range its {
		seen[i].lastTS = math.NaN()
		if err := advance(i); err != nil {
			return nil, agg, err
		}
	}
	for {
		step, any := 0, false
		for i, h := range heads {
			if live[i] && (!any || h.Step < step) {
				step, any = h.Step, true
			}
		}
		if !any {
			return seen, agg, nil
		}
		js := StepAcross{Step: step}
		for i := range heads {
			if !live[i] || heads[i].Step != step {
				continue
			}
			js.Add(heads[i], tp0[i])
			if err := advance(i); err != nil {
				return nil, agg, err
			}
		}
		if js.Ranks >= len(its) {
			agg.add(&js)
		}
	}
}

// add takes one done step.
func (a *jobAgg) add(js *StepAcross) {
	for k := 0; k <= min(a.done, 3); k++ {
		a.total[k] += js.MaxStepS
		a.sumStep[k] += js.SumStepS
		a.sumComm[k] += js.SumCommS
		a.samples[k] += js.Samples
		a.tokens[k] += js.Tokens
	}
	a.done++
	a.times = append(a.times, js.MaxStepS)
	a.comms = append(a.comms, js.CommS())
	a.lastStep, a.lastLoss, a.lastLossN = js.Step, js.LossSum, js.LossN
	if c := a.curves; c != nil {
		pt := [3]Float{Float(js.Step), Float(js.Loss()), Float(float64(js.Samples) / js.MaxStepS)}
		a.lastPoint = pt
		if (a.done-1)%a.stride != 0 {
			return
		}
		c.Steps, c.Loss, c.SamplesPerS = append(c.Steps, pt[0]), append(c.Loss, pt[1]), append(c.SamplesPerS, pt[2])
		if a.maxPoints > 0 && len(c.Steps) >= 2*a.maxPoints {
			c.Steps, c.Loss, c.SamplesPerS = everyOther(c.Steps), everyOther(c.Loss), everyOther(c.SamplesPerS)
			a.stride *= 2
		}
	}
}

// everyOther keeps the elements of f at even indices, in place.
func everyOther(f []Float) []Float {
	n := 0
	for i := 0; i < len(f); i += 2 {
		f[n] = f[i]
		n++
	}
	return f[:n]
}

// curvesOut returns the curves kept, with the last done step when the
// stride skipped it.
func (a *jobAgg) curvesOut() (steps, loss, samplesPerS []Float) {
	c := a.curves
	if c == nil {
		return nil, nil, nil
	}
	if n := len(c.Steps); n > 0 && c.Steps[n-1] != a.lastPoint[0] {
		c.Steps, c.Loss, c.SamplesPerS = append(c.Steps, a.lastPoint[0]), append(c.Loss, a.lastPoint[1]), append(c.SamplesPerS, a.lastPoint[2])
	}
	return c.Steps, c.Loss, c.SamplesPerS
}

// summarize computes the summary from the run's ranks (their steps need
// not be kept) and what the join saw of their steps.
func summarize(run *Run, seen []rankSeen, agg jobAgg) (Summary, Curves) {
	s := Summary{ExecID: run.ExecID, JobID: run.Meta.JobID, Ranks: len(run.Ranks),
		WallS: nanF, LastTS: nanF, WarmupStepS: nanF, StepP50S: nanF, StepP90S: nanF,
		SamplesPerS: nanF, TokensPerS: nanF, SamplesPerSPerRank: nanF, TokensPerSPerRank: nanF,
		CommShare: nanF, CommP50S: nanF, ModelFlopsPerS: nanF, PeakFlops: nanF, MFU: nanF, HFU: nanF, LastLoss: nanF, LastEvalLoss: nanF,
		BestAccuracy: nanF, LastAccuracy: nanF, MemorySource: "engine"}
	for _, p := range run.Problems {
		s.Problems = append(s.Problems, p.String())
	}
	first := firstInfo(run)
	s.Config = runConfig(run, first)
	world := s.Config.NTasks
	if first != nil && first.World > 0 {
		world = first.World
	}
	if world == 0 {
		world = len(run.Ranks)
	}
	if first != nil {
		s.TotalSteps = first.TotalSteps
	}
	if s.TotalSteps == 0 {
		s.TotalSteps = s.Config.Steps
	}
	var c Curves
	if len(run.Ranks) == 0 {
		s.Status = "pending"
		s.Notes = append(s.Notes, "no metrics yet: the job has not started training")
		return s, c
	}
	if len(run.Ranks) < world {
		s.Notes = append(s.Notes, fmt.Sprintf("%d of %d rank files found", len(run.Ranks), world))
	}

	lines := 0
	for _, r := range run.Ranks {
		lines += r.Lines
	}
	if lines == 0 {
		s.Status = "starting"
		s.Notes = append(s.Notes, "the rank files are empty: the ranks are starting, or died before their first line (see hpcrun logs)")
		return s, c
	}
	s.status(run, seen, world)
	s.timing(&agg, world)
	s.bubbles(run, seen)
	s.flops(first, run.Meta, world)
	s.memory(run, seen)
	s.evals(run, &c)
	c.Steps, c.Loss, c.SamplesPerS = agg.curvesOut()
	if math.IsNaN(float64(s.LastLoss)) && s.Step > 0 {
		s.Notes = append(s.Notes, "the last loss is not a number: training diverged")
	}
	return s, c
}

var nanF = Float(math.NaN())

// bubbles averages the pipeline stages' measured bubble over each stage's
// ranks and its steps after the warm-up.
func (s *Summary) bubbles(run *Run, seen []rankSeen) {
	k := s.WarmupSteps
	var sum []float64
	var ranks []int
	var theory []float64
	for i, r := range run.Ranks {
		sn := seen[i]
		if r.Info == nil || r.Info.PP < 2 || r.Info.PPRank >= r.Info.PP || sn.theory == 0 || sn.steps <= k {
			continue
		}
		for len(sum) < r.Info.PP {
			sum, ranks, theory = append(sum, 0), append(ranks, 0), append(theory, 0)
		}
		st := r.Info.PPRank
		sum[st] += sn.bubble[k] / float64(sn.steps-k)
		ranks[st]++
		theory[st] = sn.theory
	}
	for st := range sum {
		b := StageBubble{Stage: st, Measured: nanF, Theory: nanF}
		if ranks[st] > 0 {
			b.Measured, b.Theory = Float(sum[st]/float64(ranks[st])), Float(theory[st])
		}
		s.Bubble = append(s.Bubble, b)
	}
}

func firstInfo(run *Run) *RunInfo {
	for _, r := range run.Ranks {
		if r.Info != nil {
			return r.Info
		}
	}
	return nil
}

func runConfig(run *Run, info *RunInfo) RunConfig {
	var c RunConfig
	raw := run.TrainConfig
	if info != nil && len(info.Config) > 0 {
		raw = info.Config
	}
	if len(raw) > 0 {
		// Fields of an unexpected kind stay zero: the summary shows what it
		// can of a config written by another version.
		var m map[string]json.RawMessage
		_ = json.Unmarshal(raw, &m)
		for k, v := range m {
			one, _ := json.Marshal(map[string]json.RawMessage{k: v})
			_ = json.Unmarshal(one, &c)
		}
	}
	if info != nil {
		if info.Device != "" {
			c.Device = info.Device
		}
		if info.TP > 0 {
			c.TP = info.TP
		}
		if info.World > 0 {
			c.NTasks = info.World
		}
		if info.DP > 0 {
			c.DP = info.DP
		}
		if info.PP > 0 {
			c.PP = info.PP
		}
	}
	if c.DP == 0 && c.TP > 0 {
		c.DP = c.NTasks / c.TP / max(c.PP, 1)
	}
	return c
}

func (s *Summary) status(run *Run, seen []rankSeen, world int) {
	var failed, interrupted *RankLog
	versions := map[int]bool{}
	for i, r := range run.Ranks {
		s.LastTS = Float(fmax(float64(s.LastTS), lastTS(r, seen[i])))
		if r.Info != nil && !versions[r.Info.V] {
			versions[r.Info.V] = true
			s.Versions = append(s.Versions, r.Info.V)
		}
		if r.Info == nil && seen[i].steps > 0 {
			s.Notes = append(s.Notes, fmt.Sprintf("rank %d has no run line: its placement is guessed from its rank", r.Rank))
		}
		if r.End == nil {
			continue
		}
		s.Ended++
		s.WallS = Float(fmax(float64(s.WallS), r.End.WallS+r.PriorWallS))
		switch r.End.Status {
		case StatusFailed:
			if failed == nil {
				failed = r
			}
		case StatusInterrupted:
			// The run stopped for the reason of a rank that got the signal,
			// not of one that stopped with it (whichever wrote first).
			if interrupted == nil || strings.Contains(interrupted.End.Error, RelayedStop) && !strings.Contains(r.End.Error, RelayedStop) {
				interrupted = r
			}
		}
	}
	ended := map[int]bool{}
	for _, r := range run.Ranks {
		if r.End != nil {
			ended[r.Rank] = true
		}
	}
	for r := range world {
		if !ended[r] {
			s.NoEnd = append(s.NoEnd, r)
		}
	}
	slices.Sort(s.Versions)
	if len(s.Versions) > 1 {
		s.Notes = append(s.Notes, fmt.Sprintf("ranks were written by different format versions %v: fields one lacks show as unknown", s.Versions))
	}
	if n := s.Versions; len(n) > 0 && n[len(n)-1] > Version {
		s.Notes = append(s.Notes, fmt.Sprintf("written by a newer hpcrun (format v%d, this one reads v%d): fields it added are not shown", n[len(n)-1], Version))
	}
	switch {
	case failed != nil:
		s.Status = StatusFailed
		s.Error = fmt.Sprintf("rank %d: %s", failed.Rank, failed.End.Error)
	case s.Ended >= world && interrupted != nil:
		s.Status = StatusInterrupted
		s.Error = interrupted.End.Error
	case s.Ended >= world:
		s.Status = StatusCompleted
	default:
		s.Status = "running"
		if s.Ended > 0 {
			s.Notes = append(s.Notes, fmt.Sprintf("%d of %d ranks have ended", s.Ended, world))
		}
	}
	if !s.WallS.Known() {
		// Still running: from the earliest start of this segment to the
		// newest line, after the earlier segments' wall time.
		start, prior := math.Inf(1), 0.0
		for _, r := range run.Ranks {
			if r.Info != nil && r.Info.Start > 0 {
				start = min(start, r.Info.Start)
			}
			prior = max(prior, r.PriorWallS)
		}
		if !math.IsInf(start, 1) && s.LastTS.Known() {
			s.WallS = s.LastTS - Float(start) + Float(prior)
		}
	}
}

// lastTS is the time of a rank's newest line: its last step, end line or
// GPU sample.
func lastTS(r *RankLog, seen rankSeen) float64 {
	t := seen.lastTS
	if r.End != nil {
		t = fmax(t, r.End.TS)
	}
	if n := len(r.GPU); n > 0 {
		t = fmax(t, r.GPU[n-1].TS)
	}
	return t
}

// fmax is max that ignores NaN operands.
func fmax(a, b float64) float64 {
	switch {
	case math.IsNaN(a):
		return b
	case math.IsNaN(b):
		return a
	}
	return max(a, b)
}

func mean(sum float64, n int) float64 {
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

func (s *Summary) timing(a *jobAgg, world int) {
	// Only steps every rank has finished: the newest step of a running job
	// is on some ranks only.
	if a.done == 0 {
		return
	}
	s.Step = a.lastStep
	s.LastLoss = Float(mean(a.lastLoss, a.lastLossN))
	times := a.times
	k := WarmupSteps(a.done)
	s.WarmupSteps = k
	var w float64
	for _, t := range times[:k] {
		w += t
	}
	if k > 0 {
		s.WarmupStepS = Float(w / float64(k))
	}
	times = times[k:]
	slices.Sort(times)
	s.StepP50S = Float(percentile(times, 0.5))
	s.StepP90S = Float(percentile(times, 0.9))
	comms := a.comms[k:]
	slices.Sort(comms)
	s.CommP50S = Float(percentile(comms, 0.5))
	total, sumStep, sumComm := a.total[k], a.sumStep[k], a.sumComm[k]
	if total > 0 {
		s.SamplesPerS = Float(float64(a.samples[k]) / total)
		s.TokensPerS = Float(float64(a.tokens[k]) / total)
		s.SamplesPerSPerRank = s.SamplesPerS / Float(world)
		s.TokensPerSPerRank = s.TokensPerS / Float(world)
	}
	if sumStep > 0 {
		s.CommShare = Float(sumComm / sumStep)
	}
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// flops sets the model FLOP/s, the MFU and the HFU. The peak is the plan's, so
// that the plan's MFU and the run's are over one peak, unless the plan
// was made for another kind of device than the run had (a CPU plan of a
// GPU run): the run line's then, if it has one.
func (s *Summary) flops(info *RunInfo, meta Meta, world int) {
	peak, cuda := meta.PlanPeak()
	if peak > 0 && s.Config.Device != "" && cuda != strings.HasPrefix(s.Config.Device, "cuda") {
		peak = 0
	}
	if peak <= 0 && info != nil {
		peak = info.PeakFlops
	}
	if peak > 0 {
		s.PeakFlops = Float(peak)
	}
	if info == nil || info.FlopsPerToken <= 0 || !s.TokensPerS.Known() {
		return
	}
	s.ModelFlopsPerS = Float(info.FlopsPerToken) * s.TokensPerS
	s.MFU = Float(MFU(info.FlopsPerToken, float64(s.TokensPerS), peak, world))
	if info.HardwareFlopsPerToken > 0 {
		s.HFU = Float(HFU(info.HardwareFlopsPerToken, float64(s.TokensPerS), peak, world))
	}
}

func (s *Summary) memory(run *Run, seen []rankSeen) {
	for i, r := range run.Ranks {
		m := RankMemory{Rank: r.Rank, GPUUtilPct: nanF, EnginePeakBytes: seen[i].memPeak}
		var util float64
		for _, g := range r.GPU {
			m.GPUPeakBytes = max(m.GPUPeakBytes, g.MemUsedBytes)
			m.GPUTotalBytes = max(m.GPUTotalBytes, g.MemTotalBytes)
			util += g.UtilPct
		}
		if len(r.GPU) > 0 {
			m.GPUUtilPct = Float(util / float64(len(r.GPU)))
			s.MemorySource = "nvml"
		}
		s.Memory = append(s.Memory, m)
	}
}

// evals takes the validations of the first rank that has any: every rank
// evaluates the same model.
func (s *Summary) evals(run *Run, c *Curves) {
	for _, r := range run.Ranks {
		if len(r.Evals) == 0 {
			continue
		}
		for _, e := range r.Evals {
			c.EvalSteps = append(c.EvalSteps, Float(e.Step))
			c.EvalLoss = append(c.EvalLoss, Float(e.Loss))
			c.Accuracy = append(c.Accuracy, Float(e.Accuracy))
			if !math.IsNaN(e.Accuracy) {
				s.BestAccuracy = Float(fmax(float64(s.BestAccuracy), e.Accuracy))
			}
		}
		last := r.Evals[len(r.Evals)-1]
		s.LastAccuracy = Float(last.Accuracy)
		s.LastEvalLoss = Float(last.Loss)
		return
	}
}
