package plan

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/train/config"
)

// This file is hpcrun plan --auto: every layout of a job's tasks that the
// engine runs, each planned as New plans one, those that fit ranked by
// predicted tokens/s.

// Layout is one way to lay out a job's ranks and its global batch: the
// tp x pp x dp grid (ntasks = tp x pp x dp), sequence parallelism, ZeRO-1,
// and the micro-batches of BatchSize samples each data-parallel replica
// cuts its share of the global batch into (a pipeline's micro-batches,
// else gradient accumulation).
type Layout struct {
	TP        int  `json:"tp"`
	PP        int  `json:"pp"`
	DP        int  `json:"dp"`
	SP        bool `json:"sp"`
	Zero      int  `json:"zero"`
	Micro     int  `json:"micro_batches"`
	BatchSize int  `json:"bsz"`
	// Recompute is the activation recomputation: "" (none), "selective"
	// or "full".
	Recompute string `json:"recompute,omitempty"`
	// Interleave is the virtual pipeline stages a rank holds in the
	// interleaved 1F1B schedule (0 or 1: plain 1F1B): a plan at scale's
	// axis only (AutoRequest.Cluster), which the engine does not run.
	Interleave int `json:"interleave,omitempty"`
}

// String is the layout in a few words: "tp2 pp1 dp2 sp zero1 micro1 bsz8".
func (l Layout) String() string {
	s := fmt.Sprintf("tp%d pp%d dp%d", l.TP, l.PP, l.DP)
	if l.SP {
		s += " sp"
	}
	if l.Zero > 0 {
		s += fmt.Sprintf(" zero%d", l.Zero)
	}
	if l.Recompute != "" {
		s += " rc-" + l.Recompute
	}
	if l.Micro == 0 {
		return s // a grid rejected before its micro-batches
	}
	s += fmt.Sprintf(" micro%d bsz%d", l.Micro, l.BatchSize)
	if l.Interleave > 1 {
		s += fmt.Sprintf(" v%d", l.Interleave)
	}
	return s
}

// Flags are the submit flags that run the layout (beside --ntasks): every
// axis, defaults included, so that nothing of a profile's or config's
// layout (its pp, recompute, ...) leaks into the run.
func (l Layout) Flags() string {
	micro, accum := 0, l.Micro
	if l.PP > 1 {
		micro, accum = l.Micro, 1
	}
	f := fmt.Sprintf("--tp %d --pp %d --pp-split '' --micro-batches %d --grad-accum %d --bsz %d --sp=%t --zero %d --recompute %s",
		l.TP, max(l.PP, 1), micro, accum, l.BatchSize, l.SP, l.Zero, cmp.Or(l.Recompute, "none"))
	if l.Interleave > 1 {
		f += fmt.Sprintf(" --interleave %d", l.Interleave)
	}
	return f
}

// apply is cfg laid out as l.
func (l Layout) apply(cfg config.Config) config.Config {
	cfg.TP, cfg.PP, cfg.SP, cfg.Zero, cfg.BatchSize, cfg.PPSplit = l.TP, 0, l.SP, l.Zero, l.BatchSize, ""
	if l.Zero == 0 {
		cfg.ZeroGroup = "" // hybrid sharding is ZeRO's: a layout without ZeRO has none
	}
	cfg.Recompute = l.Recompute
	cfg.GradAccum, cfg.MicroBatches = l.Micro, 0
	if l.PP > 1 {
		cfg.PP, cfg.GradAccum, cfg.MicroBatches = l.PP, 1, l.Micro
	}
	return cfg
}

// order is the tie-break between two layouts of equal throughput: the
// simpler first, the smaller tp, then pp, sp off, ZeRO off, fewer
// micro-batches (the plan prices a GEMM by its FLOPs whatever its shape,
// so more gradient accumulation costs it nothing; the engine's smaller
// products do run slower).
func (l Layout) order(o Layout) int {
	return cmp.Or(cmp.Compare(l.TP, o.TP), cmp.Compare(l.PP, o.PP), cmp.Compare(b2i(l.SP), b2i(o.SP)),
		cmp.Compare(l.Zero, o.Zero), cmp.Compare(recomputeOrder[l.Recompute], recomputeOrder[o.Recompute]), cmp.Compare(l.Micro, o.Micro),
		cmp.Compare(l.Interleave, o.Interleave))
}

// sig6 is x to 6 significant digits: the ranking's equality.
func sig6(x float64) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	scale := math.Pow(10, 5-math.Floor(math.Log10(math.Abs(x))))
	return math.Round(x*scale) / scale
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// AutoRequest is what Auto searches the layouts of. Request's config
// gives the model, the tasks and the global batch, the samples of one
// optimizer step (its bsz x micro-batches x dp), which every layout
// keeps; Auto replaces the rest of its layout (tp, pp, pp_split,
// micro-batches or grad_accum, bsz, sp, zero).
type AutoRequest struct {
	Request
	// TasksPerNode is the tasks a node runs (0: the tasks spread evenly
	// over the nodes). With more than one node tp must divide it: a
	// tensor-parallel group stays inside a node.
	TasksPerNode int
	// Cluster, when set, makes the search a plan at scale: each layout is
	// planned by AtScale on it (Request.Device and Nodes are the
	// cluster's), a node's GPUs are its tasks, sequence parallelism and
	// ZeRO-1 are not searched and the interleaved schedule's virtual
	// stages are; Interleave is that of the request's own layout, which
	// the result sets beside the first (AutoResult.Given).
	Cluster    *Cluster
	Interleave int
}

// Ranked is a layout with its config and plan: Rank is its place among
// those that fit (1 the fastest; 0 for one that does not fit), Why what
// sets it apart from the first.
type Ranked struct {
	Rank   int           `json:"rank,omitempty"`
	Layout Layout        `json:"layout"`
	Config config.Config `json:"-"`
	Plan   *Plan         `json:"plan"`
	Why    string        `json:"why"`
}

// Rejected is a layout that cannot run at all, and why.
type Rejected struct {
	Layout Layout `json:"layout"`
	Why    string `json:"why"`
}

// AutoResult is Auto's search: what it kept, best first, and what it
// left out.
type AutoResult struct {
	GlobalBatch int      `json:"global_batch"` // samples a step, every layout's
	NTasks      int      `json:"ntasks"`
	Nodes       int      `json:"nodes"`
	Ranked      []Ranked `json:"ranked"`
	// Alternatives are the fitting layouts left out for one that differs
	// only in its micro-batches (see Auto).
	Alternatives int        `json:"alternatives"`
	Unfit        []Ranked   `json:"unfit,omitempty"`   // valid but over the device's memory, smallest first
	Invalid      []Rejected `json:"invalid,omitempty"` // the config does not validate (config.Config.Validate) or cannot be placed
	// Given is, in a plan at scale, the request's own layout planned the
	// same way, for comparison with the first (nil when it does not plan).
	Given *Ranked `json:"given,omitempty"`
	// Flags are the command line's flags other than the layout's (model,
	// data, steps, profile...), shell-quoted, which the caller sets:
	// WriteAuto's command that runs the first is them and its layout.
	Flags string `json:"flags,omitempty"`
}

// ErrNothingFits is Auto's error when no layout fits the device.
var ErrNothingFits = errors.New("no layout fits")

// An axis turns a layout into its variants along one dimension of the
// search, given the samples each data-parallel replica takes a step.
type axis func(l Layout, perReplica int) []Layout

// axesOf are the search's dimensions after the tp x pp x dp grid, each
// applied to every layout the ones before it made: without recomputation
// for arch hf, whose post-LN blocks recompute nothing.
func axesOf(cfg config.Config) []axis {
	if cfg.Arch == "hf" {
		return []axis{spAxis, zeroAxis, microAxis}
	}
	return []axis{spAxis, zeroAxis, recomputeAxis, microAxis}
}

// recomputeAxis: no recomputation, selective (the attention core) and
// full (each block from its input).
func recomputeAxis(l Layout, _ int) []Layout {
	sel, full := l, l
	sel.Recompute, full.Recompute = "selective", "full"
	return []Layout{l, sel, full}
}

// recomputeOrder ranks the recomputation modes from the simplest.
var recomputeOrder = map[string]int{"": 0, "selective": 1, "full": 2}

// interleaveAxis is, for a model of layers layers: plain 1F1B, and
// through a pipeline every number of virtual stages v > 1 that divides a
// stage's layers, where the micro-batches are a multiple of pp
// (Megatron-LM's condition for the interleaved schedule).
func interleaveAxis(layers int) axis {
	return func(l Layout, _ int) []Layout {
		out := []Layout{l}
		if l.PP == 1 || l.Micro%l.PP != 0 || layers%l.PP != 0 {
			return out
		}
		for _, v := range divisors(layers / l.PP)[1:] {
			w := l
			w.Interleave = v
			out = append(out, w)
		}
		return out
	}
}

// spAxis: sequence parallelism off, and on where tp > 1.
func spAxis(l Layout, _ int) []Layout {
	if l.TP == 1 {
		return []Layout{l}
	}
	on := l
	on.SP = true
	return []Layout{l, on}
}

// zeroAxis: ZeRO off, and stages 1, 2 and 3 where dp > 1 (2 and 3 not
// for arch hf, whose layers do not hand their gradients over one by one:
// the config refuses them).
func zeroAxis(l Layout, _ int) []Layout {
	if l.DP == 1 {
		return []Layout{l}
	}
	out := []Layout{l}
	for stage := 1; stage <= 3; stage++ {
		on := l
		on.Zero = stage
		out = append(out, on)
	}
	return out
}

// microAxis: every number of micro-batches that divides a replica's
// samples (at least pp of them through a pipeline).
func microAxis(l Layout, perReplica int) []Layout {
	var out []Layout
	for _, m := range divisors(perReplica) {
		if m >= l.PP {
			v := l
			v.Micro, v.BatchSize = m, perReplica/m
			out = append(out, v)
		}
	}
	return out
}

// divisors are n's divisors, ascending.
func divisors(n int) []int {
	var low, high []int
	for k := 1; k*k <= n; k++ {
		if n%k == 0 {
			low = append(low, k)
			if k*k != n {
				high = append(high, n/k)
			}
		}
	}
	slices.Reverse(high)
	return append(low, high...)
}

// Auto plans every layout of r's tasks and global batch that the engine
// runs: each tp x pp x dp factorisation of the tasks, sequence parallelism
// off and on (tp > 1), ZeRO-1 off and on (dp > 1), no, selective and full
// activation recomputation (not for arch hf), and every number of
// micro-batches that divides a replica's samples (at least pp through a
// pipeline). A layout is invalid when its config does not validate (tp
// must divide the heads, pp the layers, ...), when dp does not divide the
// global batch, or, over several nodes, when tp does not divide a node's
// tasks. Of those that fit the device (Plan.Fits) and differ only in
// their micro-batches, it keeps the fewest micro-batches within 1% of the
// best tokens/s among them (the plan prices a GEMM by its FLOPs whatever
// its shape, where the engine's smaller products run slower); those it
// keeps are ranked by predicted
// tokens/s, the fastest first; throughputs equal to 6 significant digits
// go to the simpler layout (Layout.order). The error wraps
// ErrNothingFits, saying what to change, when none fits.
func Auto(r AutoRequest) (*AutoResult, error) {
	base := r.Config
	if err := base.Validate(); err != nil {
		return nil, err
	}
	res := &AutoResult{GlobalBatch: base.BatchSize * base.Micro() * base.DP(), NTasks: base.NTasks, Nodes: max(r.Nodes, 1)}
	perNode := r.TasksPerNode
	if perNode <= 0 {
		perNode = base.NTasks / res.Nodes
	}
	search := axesOf(base)
	if c := r.Cluster; c != nil {
		search = []axis{microAxis, interleaveAxis(base.Layers)}
		perNode = min(c.Node.GPUs, base.NTasks)
		res.Nodes = (base.NTasks + perNode - 1) / perNode
		r.Device, r.Nodes = c.Node.GPU, res.Nodes
		if p, err := AtScale(ScaleRequest{Config: base, Vocab: r.Vocab, Cluster: *c, Interleave: r.Interleave}); err == nil {
			res.Given = &Ranked{Layout: layoutOf(base, r.Interleave), Config: base, Plan: p}
		}
	}
	for _, tp := range divisors(base.NTasks) {
		for _, pp := range divisors(base.NTasks / tp) {
			grid := Layout{TP: tp, PP: pp, DP: base.NTasks / tp / pp, Micro: 1}
			grid.BatchSize = res.GlobalBatch / grid.DP
			if r.Cluster != nil {
				grid.Recompute = "full" // what the plan at scale models
			}
			switch {
			case res.GlobalBatch%grid.DP != 0:
				res.Invalid = append(res.Invalid, Rejected{Layout{TP: tp, PP: pp, DP: grid.DP}, fmt.Sprintf("dp %d does not divide the global batch of %d samples", grid.DP, res.GlobalBatch)})
				continue
			case pp > 1 && grid.BatchSize < pp:
				res.Invalid = append(res.Invalid, Rejected{Layout{TP: tp, PP: pp, DP: grid.DP}, fmt.Sprintf("a replica's %d samples make fewer micro-batches than pp %d", grid.BatchSize, pp)})
				continue
			case res.Nodes > 1 && perNode%tp != 0:
				res.Invalid = append(res.Invalid, Rejected{Layout{TP: tp, PP: pp, DP: grid.DP}, fmt.Sprintf("tp %d does not divide a node's %d tasks", tp, perNode)})
				continue
			}
			if pp > 1 {
				grid.Micro, grid.BatchSize = pp, 1 // validates the pipeline before the micro-batches vary
			}
			if err := grid.apply(base).Validate(); err != nil {
				res.Invalid = append(res.Invalid, Rejected{Layout{TP: tp, PP: pp, DP: grid.DP}, err.Error()})
				continue
			}
			layouts := []Layout{grid}
			for _, ax := range search {
				var next []Layout
				for _, l := range layouts {
					next = append(next, ax(l, res.GlobalBatch/grid.DP)...)
				}
				layouts = next
			}
			for _, l := range layouts {
				res.add(r, l)
			}
		}
	}
	if r.Cluster == nil {
		res.pickMicro()
	}
	slices.SortStableFunc(res.Ranked, func(a, b Ranked) int {
		return cmp.Or(cmp.Compare(sig6(b.Plan.Time.TokensPerS), sig6(a.Plan.Time.TokensPerS)), a.Layout.order(b.Layout))
	})
	slices.SortStableFunc(res.Unfit, func(a, b Ranked) int {
		return cmp.Or(cmp.Compare(a.Plan.Memory.Total, b.Plan.Memory.Total), a.Layout.order(b.Layout))
	})
	for i := range res.Ranked {
		res.Ranked[i].Rank = i + 1
		res.Ranked[i].Why = why(res.Ranked[0].Plan, res.Ranked[i].Plan)
	}
	for i := range res.Unfit {
		u := &res.Unfit[i]
		u.Why = fmt.Sprintf("needs %s a rank, %s over %s", bytesIEC(u.Plan.Memory.Total), bytesIEC(-u.Plan.Headroom), u.Plan.Device.Name)
	}
	if len(res.Ranked) == 0 {
		return res, res.nothingFits(r.Device)
	}
	return res, nil
}

// layoutOf is cfg's own layout at scale, with v virtual stages (and the
// full recomputation the plan at scale models).
func layoutOf(cfg config.Config, v int) Layout {
	l := Layout{TP: cfg.TP, PP: cfg.Stages(), DP: cfg.DP(), Micro: cfg.Micro(), BatchSize: cfg.BatchSize, Recompute: "full"}
	if v > 1 {
		l.Interleave = v
	}
	return l
}

// add plans l on r's config (at scale on r's cluster, when it has one)
// and files it as ranked, unfit or invalid.
func (res *AutoResult) add(r AutoRequest, l Layout) {
	req := r.Request
	req.Config = l.apply(req.Config)
	if err := req.Config.Validate(); err != nil {
		res.Invalid = append(res.Invalid, Rejected{l, err.Error()})
		return
	}
	var p *Plan
	var err error
	if r.Cluster != nil {
		p, err = AtScale(ScaleRequest{Config: req.Config, Vocab: req.Vocab, Cluster: *r.Cluster, Interleave: l.Interleave})
	} else {
		p, err = New(req)
	}
	if err != nil {
		res.Invalid = append(res.Invalid, Rejected{l, err.Error()})
		return
	}
	rk := Ranked{Layout: l, Config: req.Config, Plan: p}
	if p.Fits {
		res.Ranked = append(res.Ranked, rk)
	} else {
		res.Unfit = append(res.Unfit, rk)
	}
}

// microSlack is how far below the best tokens/s of its layout a smaller
// number of micro-batches may be and still be chosen.
const microSlack = 0.01

// pickMicro keeps, of the fitting layouts that differ only in their
// micro-batches, the fewest micro-batches whose tokens/s is within
// microSlack of the best of them: the plan prices a GEMM by its FLOPs
// whatever its shape, where the engine's smaller products run slower.
func (res *AutoResult) pickMicro() {
	best := map[Layout]float64{}
	key := func(l Layout) Layout {
		l.Micro, l.BatchSize = 0, 0
		return l
	}
	for _, r := range res.Ranked {
		k := key(r.Layout)
		best[k] = max(best[k], r.Plan.Time.TokensPerS)
	}
	chosen := map[Layout]int{} // index in res.Ranked
	for i, r := range res.Ranked {
		k := key(r.Layout)
		if r.Plan.Time.TokensPerS < (1-microSlack)*best[k] {
			continue
		}
		if j, ok := chosen[k]; !ok || r.Layout.Micro < res.Ranked[j].Layout.Micro {
			chosen[k] = i
		}
	}
	kept := res.Ranked[:0:0]
	for i, r := range res.Ranked {
		if chosen[key(r.Layout)] == i {
			kept = append(kept, r)
		}
	}
	res.Alternatives = len(res.Ranked) - len(kept)
	res.Ranked = kept
}

// nothingFits is the one-line error of a search where no layout fits dev.
func (res *AutoResult) nothingFits(dev Device) error {
	tasks := plural(res.NTasks, "task") + " on " + plural(res.Nodes, "node")
	if len(res.Unfit) == 0 {
		why := "none"
		if len(res.Invalid) > 0 {
			why = res.Invalid[0].Layout.String() + ": " + res.Invalid[0].Why
		}
		return fmt.Errorf("%w: no layout of %s is valid (%s); change --ntasks or the model's heads or layers", ErrNothingFits, tasks, why)
	}
	u := res.Unfit[0]
	return fmt.Errorf("%w: none of the %d valid layouts of %s fits the %s of %s a rank, the smallest (%s) needs %s; add tasks and nodes (--ntasks, --nodes), lower the global batch of %d (--bsz), or choose a larger device (--gpu)",
		ErrNothingFits, len(res.Unfit), tasks, bytesIEC(dev.MemBytes), dev.Name, u.Layout, bytesIEC(u.Plan.Memory.Total), res.GlobalBatch)
}

// why says what sets p apart from the fastest plan, best: for best itself
// what its step is made of, for the others where their extra time goes.
func why(best, p *Plan) string {
	t, b := p.Time, best.Time
	share := func(s float64) float64 { return 100 * s / t.StepS }
	if p == best {
		return fmt.Sprintf("fastest: compute %.0f%%, memory traffic %.0f%%, comm %.0f%%, bubble %.0f%% of the step",
			share(t.ComputeS), share(t.MemoryS), share(t.CommS-t.TurnS), share(t.BubbleS))
	}
	parts := []struct {
		what string
		s    float64
	}{
		{"compute", t.ComputeS - b.ComputeS}, {"memory traffic", t.MemoryS - b.MemoryS},
		{"comm", (t.CommS - t.TurnS) - (b.CommS - b.TurnS)}, {"bubble", t.BubbleS - b.BubbleS},
	}
	most := slices.MaxFunc(parts, func(x, y struct {
		what string
		s    float64
	}) int {
		return cmp.Compare(x.s, y.s)
	})
	if most.s <= 0 {
		return "as fast as the first"
	}
	return fmt.Sprintf("%+.1f%% step, most in %s (%+.2f ms)", 100*(t.StepS/b.StepS-1), most.what, 1e3*most.s)
}

// WriteAuto prints the top layouts of res (all when top <= 0) as a
// table: layout, predicted step time and tokens/s, memory a rank, comm
// share, bubble and why; then how to run the first, what the rates rest
// on and what the search left out.
func WriteAuto(w io.Writer, res *AutoResult, top int) error {
	if len(res.Ranked) == 0 {
		return nil
	}
	first := res.Ranked[0].Plan
	name := first.Model
	if first.Preset != "" {
		name += " (preset " + first.Preset + ")"
	}
	scale := first.Scale != nil
	where := fmt.Sprintf("device %s", first.Device.Name)
	if scale {
		where = fmt.Sprintf("cluster %s (plan at scale: Megatron-LM's training simulated, plan-only)", first.Scale.Cluster)
	}
	fmt.Fprintf(w, "plan --auto: %s, %d layers dim %d heads %d seq %d; global batch %d samples a step; %s on %s; %s, %s a rank\n",
		name, first.Layers, first.Dim, first.Heads, first.Seq, res.GlobalBatch, plural(res.NTasks, "task"), plural(res.Nodes, "node"), where, bytesIEC(first.Device.MemBytes))
	if scale {
		fmt.Fprintf(w, "%s: %d fit, %d do not fit, %d invalid\n", plural(len(res.Ranked)+len(res.Unfit)+len(res.Invalid), "layout"), len(res.Ranked), len(res.Unfit), len(res.Invalid))
	} else {
		fmt.Fprintf(w, "%s: %d fit (%d kept: of those differing only in micro-batches, the fewest within 1%% of their best), %d do not fit, %d invalid\n",
			plural(len(res.Ranked)+res.Alternatives+len(res.Unfit)+len(res.Invalid), "layout"), len(res.Ranked)+res.Alternatives, len(res.Ranked), len(res.Unfit), len(res.Invalid))
	}
	fmt.Fprintf(w, "ranked by predicted tokens/s (ties to 6 digits: smaller tp, then pp, sp off, zero off)\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	tflops := func(*Plan) string { return "" }
	head := "RANK\tLAYOUT\tSTEP S\tTOK/S\tMEM/RANK\tCOMM\tBUBBLE\tWHY"
	if scale {
		tflops = func(p *Plan) string { return fmt.Sprintf("%.1f\t", p.Scale.TFLOPs) }
		head = "RANK\tLAYOUT\tSTEP S\tTOK/S\tTFLOP/S\tMEM/RANK\tCOMM\tBUBBLE\tWHY"
	}
	fmt.Fprintln(tw, head)
	shown := res.Ranked
	if top > 0 && top < len(shown) {
		shown = shown[:top]
	}
	for _, r := range shown {
		t := r.Plan.Time
		bubble := "-"
		if r.Layout.PP > 1 {
			bubble = fmt.Sprintf("%.0f%%", 100*t.Bubble)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.4g\t%.0f\t%s%s\t%.0f%%\t%s\t%s\n", r.Rank, r.Layout, t.StepS, t.TokensPerS, tflops(r.Plan), bytesIEC(r.Plan.Memory.Total), 100*t.CommShare, bubble, r.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(shown) < len(res.Ranked) {
		fmt.Fprintf(w, "(%d more that fit: --top 0 lists all)\n", len(res.Ranked)-len(shown))
	}
	flags := ""
	if res.Flags != "" {
		flags = res.Flags + " "
	}
	nodes := flags
	if res.Nodes > 1 {
		nodes += fmt.Sprintf("--nodes %d ", res.Nodes)
	}
	if scale {
		fmt.Fprintf(w, "\nplan the first: hpcrun plan --cluster %s %s--ntasks %d %s\n", first.Scale.Cluster, flags, res.NTasks, res.Ranked[0].Layout.Flags())
		writeGiven(w, res)
		fmt.Fprintln(w, "note: the ranking across tp and pp is the model's, not measured: it prices every GEMM at one efficiency whatever its width, which favours a small tp; Narayanan et al. (Fig. 13) measured tp = a node's GPUs fastest")
	} else {
		fmt.Fprintf(w, "\nrun the first: hpcrun submit %s--ntasks %d %s\n", nodes, res.NTasks, res.Ranked[0].Layout.Flags())
	}
	fmt.Fprintf(w, "rates: %s\n", first.Device.Source)
	for _, x := range append(slices.Clone(first.Device.Warnings), first.Time.Warnings...) {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
	if len(res.Unfit) > 0 {
		u := res.Unfit[0]
		fmt.Fprintf(w, "do not fit: %s, the smallest %s (%s)\n", plural(len(res.Unfit), "layout"), u.Layout, u.Why)
	}
	for i, r := range res.Invalid {
		if i == 3 {
			fmt.Fprintf(w, "invalid: %d more\n", len(res.Invalid)-i)
			break
		}
		fmt.Fprintf(w, "invalid: %s: %s\n", r.Layout, r.Why)
	}
	return nil
}

// plural is n things: "1 node", "3 nodes".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
