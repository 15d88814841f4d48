package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

// notPlanFlags are submit's flags that make no sense for a plan: plan
// takes submit's other flags.
var notPlanFlags = []string{"dry-run", "wait", "resume", "check", "force", "template"}

func planCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range submitCommand().Flags {
		if !slices.Contains(notPlanFlags, f.Names()[0]) {
			flags = append(flags, f)
		}
	}
	flags = append(flags,
		&cli.BoolFlag{Name: "auto", Usage: "rank every layout of --ntasks (tp x pp x dp, sp, zero, micro-batches) that fits, keeping the global batch (bsz x micro-batches x dp of the flags' layout)"},
		&cli.IntFlag{Name: "top", Value: 5, Usage: "with --auto, print the best `N` layouts (0: all)"},
		&cli.StringFlag{Name: "cluster", Usage: "plan at scale on a preset `CLUSTER` (" + strings.Join(plan.ClusterNames(), ", ") + "; default: the profile's cluster key; none: the engine's plan): a GPT trained as Megatron-LM does, simulated (plan-only)"},
		&cli.IntFlag{Name: "interleave", Usage: "with --cluster, the interleaved 1F1B schedule's virtual stages a rank holds (plan-only: the engine runs plain 1F1B)"})
	return &cli.Command{
		Name:  "plan",
		Usage: "predict a run's memory per rank, whether it fits, and its step time, before submitting it",
		Description: "Takes submit's flags and prints, per rank: parameters, gradients, AdamW moments,\n" +
			"activations per block (tensor-parallel split; --sp splits the layer norms and residuals\n" +
			"along the sequence; --zero 1 shards the moments over dp), logits and loss buffers, GPU\n" +
			"workspace, comm buffers and the CUDA context; the device's memory and whether the run\n" +
			"fits (and what would, when it does not: --sp, --zero 1, a larger tp, a smaller batch\n" +
			"with grad-accum, more nodes); a step time from the GEMM FLOPs at the device's rate\n" +
			"plus the collectives' bytes at the link's bandwidth; tokens/s and MFU.\n" +
			"The device is --gpu, else the profile's gpu key, else the CPU (its GEMM rate from the\n" +
			"last `hpcrun bench gemm`, else a stated default). submit --dry-run prints the same.\n" +
			"--auto plans every layout of the tasks instead and prints the --top fastest that fit.",
		Flags:  flags,
		Action: runPlan,
	}
}

func runPlan(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("plan takes no arguments, got %q", c.Args().First()), 2)
	}
	if done, err := planAtScale(c); done {
		return err
	}
	p, err := planSubmit(c, false)
	if err != nil {
		return err
	}
	if p.plan == nil {
		return errors.New(p.planNote)
	}
	if c.Bool("auto") {
		res, err := planAuto(p)
		if err != nil {
			return cli.Exit("plan --auto: "+oneLineErr(err), 1)
		}
		if wantJSON(c) {
			enc := json.NewEncoder(c.App.Writer)
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		}
		return plan.WriteAuto(c.App.Writer, res, c.Int("top"))
	}
	if c.IsSet("top") {
		return cli.Exit("plan: --top needs --auto", 2)
	}
	if wantJSON(c) {
		return writePlanJSON(c.App.Writer, p)
	}
	return writePlan(c.App.Writer, p.plan, p.suggest)
}

// planAtScale is hpcrun plan --cluster (plan.ScaleCommand): the train
// flags' model and layout on a preset cluster (--cluster, else the
// profile's; none: neither), no executor involved. done is false when
// there is no cluster: the engine's plan follows.
func planAtScale(c *cli.Context) (done bool, err error) {
	cfg, err := resolveConfig(c)
	if err != nil {
		return true, err
	}
	name := cmp.Or(c.String("cluster"), cfg.Profile.Cluster)
	if name == "" || name == "none" {
		if c.IsSet("interleave") {
			return true, cli.Exit("plan: --interleave needs --cluster", 2)
		}
		return false, nil
	}
	tc := cfg.Train
	if err := applyTrainFlags(c, &tc); err != nil {
		return true, err
	}
	vocab, _, err := train.PlanVocab(tc)
	if err == nil {
		err = plan.ScaleCommand(c.App.Writer, plan.ScaleOptions{Config: tc, Vocab: vocab, Cluster: name,
			Interleave: c.Int("interleave"), Auto: c.Bool("auto"), Top: c.Int("top"), JSON: wantJSON(c)})
	}
	if err != nil {
		return true, cli.Exit("plan --cluster: "+oneLineErr(err), 1)
	}
	return true, nil
}

// predictRun makes the plan of p's training run. It returns a nil plan and
// why when the device is a GPU that nobody named.
func predictRun(p *submitPlan) (*plan.Plan, []plan.Suggestion, string, error) {
	r, note, why, err := planRequest(p)
	if err != nil || why != "" {
		return nil, nil, why, err
	}
	pl, err := plan.New(r)
	if err != nil {
		return nil, nil, "", err
	}
	if note != "" {
		pl.Notes = append(pl.Notes, note)
	}
	var sug []plan.Suggestion
	if !pl.Fits {
		sug = plan.Suggest(r)
	}
	return pl, sug, "", nil
}

// planRequest is what the plan of p's run is made for, with a note when
// the vocabulary is a bound; why (no request) when the device is a GPU
// that nobody named.
func planRequest(p *submitPlan) (r plan.Request, note, why string, err error) {
	lay, err := p.spec.Layout()
	if err != nil {
		return r, "", "", err
	}
	dev, why, err := plan.RankDevice(p.gpu, p.train, rankShare(lay, p.spec.CPUsPerTask))
	if err != nil || why != "" {
		return r, "", why, err
	}
	// The vocabulary without the data when it can be known so; a
	// WordPiece built from a data file only from the data, which plan
	// does not read (it plans for the most the vocabulary can hold).
	vocab, exact, err := train.PlanVocab(p.train)
	if err != nil {
		return r, "", "", err
	}
	if !exact && p.readData {
		data, err := train.Prepare(p.train)
		if err != nil {
			return r, "", "", err
		}
		vocab = data.Vocab
	}
	if !exact && !p.readData {
		note = fmt.Sprintf("vocab: at most %d, the WordPiece vocabulary built from the data at the start (plan does not read the data; submit --dry-run does)", vocab)
	}
	return plan.Request{Config: p.train, Vocab: vocab, Nodes: lay.Nodes, Device: dev}, note, "", nil
}

// planAuto searches the layouts of p's tasks and global batch
// (plan.Auto).
func planAuto(p *submitPlan) (*plan.AutoResult, error) {
	r, _, why, err := planRequest(p)
	if err != nil || why != "" {
		return nil, cmp.Or(err, errors.New(why))
	}
	lay, err := p.spec.Layout()
	if err != nil {
		return nil, err
	}
	return plan.Auto(plan.AutoRequest{Request: r, TasksPerNode: lay.TasksPerNode})
}

// rankShare is how the ranks of a run laid out as lay, cpusPerTask cores
// each, share a node.
func rankShare(lay slurm.Layout, cpusPerTask int) plan.Share {
	return plan.Share{TasksPerNode: lay.TasksPerNode, GPUsPerNode: lay.GPUsPerNode, CPUsPerTask: cpusPerTask}
}

// planJSON is hpcrun plan --json.
type planJSON struct {
	*plan.Plan
	Suggestions []plan.Suggestion `json:"suggestions,omitempty"`
}

func writePlanJSON(w io.Writer, p *submitPlan) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(planJSON{Plan: p.plan, Suggestions: p.suggest})
}

// bytesIEC writes n bytes as the CLI does, units.Bytes with two decimals.
func bytesIEC(n int64) string { return units.Bytes(n, 2) }

// writePlan prints the plan as a table.
func writePlan(w io.Writer, pl *plan.Plan, sug []plan.Suggestion) error {
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
	if pl.Zero == 1 {
		modes += " + ZeRO-1"
	}
	if pl.Recompute != "" {
		modes += " + recompute " + pl.Recompute
	}
	pp := ""
	if pl.PP > 1 {
		pp = fmt.Sprintf("pp %d x ", pl.PP)
	}
	fmt.Fprintf(w, "job:  %s = %stp %d x dp %d%s on %s; device %s, %s a rank\n", nOf(pl.NTasks, "task"), pp, pl.TP, pl.DP, modes, nOf(pl.Nodes, "node"), pl.Device.Name, bytesIEC(pl.Device.MemBytes))
	m := pl.Memory
	row := func(what string, n int64, note string) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-22s %12s  %s", what, bytesIEC(n), note), " "))
	}
	if pl.PP > 1 {
		fmt.Fprintln(w, "\nmemory per rank (of the stage that needs the most)")
	} else {
		fmt.Fprintln(w, "\nmemory per rank (every rank alike)")
	}
	row("parameters", m.Params, "this rank's shard, fp32")
	row("gradients", m.Grads, "")
	moments := "m and v, fp32"
	if pl.Zero == 1 {
		moments += fmt.Sprintf(", ZeRO-1: this rank's 1/%d of each bucket", pl.DP)
	}
	row("AdamW moments", m.Optimizer, moments)
	row("fp32 masters", m.Masters, "none: the weights are fp32")
	split := fmt.Sprintf("split over tp %d", pl.TP)
	if pl.SP {
		split += ", layer norms and residuals along the sequence"
	}
	rc := "(no recompute)"
	if pl.Recompute != "" {
		rc = "(recompute " + pl.Recompute + ": one backward scratch for all the blocks)"
	}
	act := fmt.Sprintf("%s a block x %d blocks, %s %s", bytesIEC(m.ActivationsPerBlock), m.Blocks/max(m.ActivationsPerBlock, 1), split, rc)
	if pl.Recompute != "" {
		act = fmt.Sprintf("%s saved a block x %d blocks, %s of backward scratch, %s %s", bytesIEC(m.SavedPerBlock), pl.Layers, bytesIEC(m.ActivationsPerBlock-m.SavedPerBlock), split, rc)
	}
	for _, st := range pl.Stages {
		if st.Memory == m {
			act = fmt.Sprintf("stage %d's %d blocks: %s saved a block for each of %d micro-batches in flight, %s of backward scratch, %s %s",
				st.Stage, st.Blocks, bytesIEC(m.SavedPerBlock), st.InFlight, bytesIEC(m.ActivationsPerBlock-m.SavedPerBlock), split, rc)
			break
		}
	}
	row("activations", m.Blocks, act)
	row("embeddings, residual", m.Embeddings, "embedding outputs, residual-stream gradients, ln_f")
	row("logits, loss", m.Logits, "head output and gradient, cross-entropy buffers")
	if pl.SP {
		row("sequence-parallel bufs", m.SPBuffers, "shared full-sequence buffers, layer-norm/position gradient bucket")
	}
	row("workspace", m.Workspace, "GPU kernels' scratch")
	row("gradient bucket", m.GradBucket, "device buffer of the dp all-reduce")
	row("= engine peak", m.EnginePeak, "what mem_peak_bytes counts")
	row("comm buffers", m.CommBuffers, "NCCL's, or the host staging of the dp bucket")
	row("CUDA context", m.Context, "")
	verdict := fmt.Sprintf("fits %s, %s to spare", pl.Device.Name, bytesIEC(pl.Headroom))
	if !pl.Fits {
		verdict = fmt.Sprintf("DOES NOT FIT %s: %s over", pl.Device.Name, bytesIEC(-pl.Headroom))
	}
	row("= total", m.Total, fmt.Sprintf("of %s: %s", bytesIEC(pl.Device.MemBytes), verdict))
	if !pl.Fits {
		fmt.Fprintln(w, whatFits(sug))
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
	fmt.Fprintf(w, "  %-10s %9.4f s  elementwise kernels and AdamW at %.0f GB/s\n", "memory", t.MemoryS, pl.Device.MemBandwidth/1e9)
	p2p := ""
	if pl.PP > 1 {
		p2p = fmt.Sprintf(", pp %s point-to-point (%d transfers)", bytesIEC(int64(t.PPBytes)), t.Transfers)
	}
	fmt.Fprintf(w, "  %-10s %9.4f s  tp %s, dp %s sent a rank; %d collectives%s\n", "comm", t.CommS, bytesIEC(int64(t.TPBytes)), bytesIEC(int64(t.DPBytes)), t.Collectives, p2p)
	if pl.PP > 1 {
		fmt.Fprintf(w, "  %-10s %9.4f s  1F1B: the micro-batches' work stretched by (m+p-1)/m, idle share (p-1)/(m+p-1) = %.2f\n", "bubble", t.BubbleS, t.Bubble)
	}
	fmt.Fprintf(w, "  %-10s %9.4f s  comm %.0f%% of it\n", "step", t.StepS, 100*t.CommShare)
	fmt.Fprintf(w, "  %-10s %9.0f    MFU %.1f%% of %.4g GFLOP/s x %d ranks\n", "tokens/s", t.TokensPerS, 100*t.MFU, t.PeakFlops/1e9, pl.NTasks)
	fmt.Fprintf(w, "rates: %s\n", pl.Device.Source)
	for _, n := range pl.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// whatFits is one line listing the suggestions.
func whatFits(sug []plan.Suggestion) string {
	if len(sug) == 0 {
		return "what would fit: nothing within 16x more nodes, tp or grad-accum, sequence parallelism or ZeRO-1; bf16 would not help (the engine stores fp32); choose a smaller model or a larger device"
	}
	parts := make([]string, len(sug))
	for i, s := range sug {
		parts[i] = fmt.Sprintf("%s (%s)", s.Flags, bytesIEC(s.Total))
	}
	return "what would fit: " + strings.Join(parts, ", ") + "; bf16 would not help (the engine stores fp32)"
}

// refuseUnfitHere refuses, as submit does without --force, a run of
// ntasks ranks on this machine (hpcrun run) that the plan says does not fit
// a rank's share of this machine's memory. A run on GPUs, which the plan
// cannot name here, is not refused.
func refuseUnfitHere(cfg trainconfig.Config) error {
	lay := slurm.Layout{Nodes: 1, TasksPerNode: cfg.NTasks}
	dev, why, err := plan.RankDevice("", cfg, rankShare(lay, max(1, runtime.NumCPU()/max(cfg.NTasks, 1))))
	if err != nil || why != "" || dev.MemBytes <= 0 {
		return nil
	}
	data, err := train.Prepare(cfg)
	if err != nil {
		return err
	}
	r := plan.Request{Config: cfg, Vocab: data.Vocab, Nodes: 1, Device: dev}
	pl, err := plan.New(r)
	if err != nil || pl.Fits {
		return err
	}
	return cli.Exit(fmt.Sprintf("the run needs %s a rank, %s over the %s of %s (%s); run --force to start it anyway",
		bytesIEC(pl.Memory.Total), bytesIEC(-pl.Headroom), bytesIEC(pl.Device.MemBytes), pl.Device.Name, whatFits(plan.Suggest(r))), 1)
}

// refuseUnfit is submit's error for a run that does not fit.
func refuseUnfit(p *submitPlan) error {
	pl := p.plan
	return cli.Exit(fmt.Sprintf("the run needs %s a rank, %s over the %s of %s (%s); submit --force to submit it anyway",
		bytesIEC(pl.Memory.Total), bytesIEC(-pl.Headroom), bytesIEC(pl.Device.MemBytes), pl.Device.Name, whatFits(p.suggest)), 1)
}

// planCheck is the run's plan beside what it measured.
type planCheck struct {
	Rows []planRow `json:"rows"`
	// Note says when the plan was for another device than the run had.
	Note string `json:"note,omitempty"`
}

// planRow is one figure predicted and measured; ErrorPct is
// plan.ErrorPct's, null when unknown.
type planRow struct {
	What      string        `json:"what"`
	Predicted metrics.Float `json:"predicted"`
	Measured  metrics.Float `json:"measured"`
	ErrorPct  metrics.Float `json:"error_pct"`
}

// planWhat names plan.Compare's figures in hpcrun metrics' table (its
// summary above has the MFU).
var planWhat = map[string]string{
	"engine_peak": "engine peak B/rank", "device_total": "GPU peak B/rank",
	"step_s": "step s", "comm_share": "comm share", "tokens_per_s": "tokens/s",
}

// comparePlan sets the run's plan (from meta.json) beside its summary;
// nil when the run has no plan.
func comparePlan(m *slurm.Meta, s metrics.Summary) *planCheck {
	if m == nil || len(m.Plan) == 0 {
		return nil
	}
	var pl plan.Plan
	if json.Unmarshal(m.Plan, &pl) != nil {
		return nil
	}
	var rows []planRow
	for _, f := range plan.Compare(&pl, s) {
		if what, ok := planWhat[f.Key]; ok {
			rows = append(rows, planRow{What: what, Predicted: f.Predicted, Measured: f.Measured, ErrorPct: f.ErrorPct})
		}
	}
	pc := &planCheck{Rows: rows}
	if pl.Device.CUDA != strings.HasPrefix(s.Config.Device, "cuda") && s.Config.Device != "" {
		pc.Note = fmt.Sprintf("the plan was made for %s, the run had %s: the figures do not compare", pl.Device.Name, s.Config.Device)
	}
	return pc
}

// writePlanCheck prints the plan's rows under a run's summary.
func writePlanCheck(w io.Writer, pc *planCheck) {
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
		fmt.Fprintf(w, "%-20s %14s %14s %8s\n", r.What, num(r.Predicted), num(r.Measured), e)
	}
	if pc.Note != "" {
		fmt.Fprintf(w, "note: %s\n", pc.Note)
	}
}
