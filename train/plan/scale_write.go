package plan

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/hpcrun/hpcrun/train/config"
)

// WriteScale prints a plan at scale (AtScale): the model and the layout on
// the cluster, memory per GPU in Megatron's accounting and whether it
// fits, the step and the teraFLOP/s a GPU beside the paper's where the
// model is a row of its table, and what is modelled and what assumed.
func WriteScale(w io.Writer, p *Plan) error {
	sc := p.Scale
	if sc == nil {
		return fmt.Errorf("plan: not a plan at scale")
	}
	dev := p.Device
	fmt.Fprintf(w, "plan at scale (a simulation of Megatron-LM's training, plan-only): %s, %d layers dim %d heads %d seq %d, vocab %d, %.1fB params\n",
		p.Model, p.Layers, p.Dim, p.Heads, p.Seq, p.Vocab, float64(p.Params)/1e9)
	fmt.Fprintf(w, "cluster: %s, %s of %d %s\n", sc.Cluster, plural(p.Nodes, "node"), sc.GPUsPerNode, dev.Name)
	sched := "1F1B"
	if sc.Interleave > 1 {
		sched = fmt.Sprintf("interleaved 1F1B, %d virtual stages a rank (plan-only)", sc.Interleave)
	}
	pipe := ""
	if p.PP > 1 {
		pipe = fmt.Sprintf("pp %d x ", p.PP)
	}
	fmt.Fprintf(w, "layout:  %s = %stp %d x dp %d; global batch %d = micro-batch %d x %d micro-batches x dp %d; %s\n",
		plural(p.NTasks, "GPU"), pipe, p.TP, p.DP, sc.GlobalBatch, p.BatchSize, p.GradAccum, p.DP, sched)

	m := p.Memory
	row := func(what string, n int64, note string) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-22s %12s  %s", what, bytesIEC(n), note), " "))
	}
	fmt.Fprintln(w, "\nmemory per GPU (Megatron's mixed precision, 18 bytes a parameter; the stage that needs the most)")
	row("weights", m.Params, "bf16")
	row("gradients", m.Grads, "fp32 (main_grad)")
	row("fp32 masters", m.Masters, "")
	row("Adam moments", m.Optimizer, "m and v, fp32")
	row("activations", m.Blocks, fmt.Sprintf("full recomputation: each layer's input, %s a micro-batch, kept for the micro-batches in flight, and one layer's working set of %s", bytesIEC(m.SavedPerBlock), bytesIEC(m.ActivationsPerBlock)))
	if m.Logits > 0 {
		row("logits, loss", m.Logits, "bf16 logits, their fp32 copy and gradient")
	}
	row("NCCL buffers", m.CommBuffers, "")
	row("CUDA context", m.Context, "")
	verdict := fmt.Sprintf("fits %s, %s to spare", dev.Name, bytesIEC(p.Headroom))
	if !p.Fits {
		verdict = fmt.Sprintf("DOES NOT FIT %s: %s over", dev.Name, bytesIEC(-p.Headroom))
	}
	row("= total", m.Total, fmt.Sprintf("of %s: %s", bytesIEC(dev.MemBytes), verdict))

	t := p.Time
	fmt.Fprintln(w, "\nstep (predicted)")
	fmt.Fprintf(w, "  %-10s %9.3f s  %.1f TFLOP of GEMMs a GPU at %.0f TFLOP/s (%.0f%% of the %s peak, %.0f)\n", "compute", t.ComputeS, t.GemmFlops/1e12, t.Rate/1e12, 100*dev.Efficiency, p.Precision, t.PeakFlops/1e12)
	fmt.Fprintf(w, "  %-10s %9.3f s  elementwise kernels and Adam at %.0f GB/s\n", "memory", t.MemoryS, dev.MemBandwidth/1e9)
	fmt.Fprintf(w, "  %-10s %9.3f s  tp %.2f ms a layer a micro-batch; pp %.2f ms a micro-batch%s; dp all-reduce %.3f s\n", "comm", t.CommS, 1e3*sc.LayerTPS, 1e3*sc.P2PS, crossNode(sc), sc.DPS)
	if p.PP > 1 {
		fmt.Fprintf(w, "  %-10s %9.3f s  idle share %.3f: (p-1)/v = %.2f micro-batches' time\n", "bubble", t.BubbleS, t.Bubble, float64(p.PP-1)/float64(sc.Interleave))
	}
	fmt.Fprintf(w, "  %-10s %9.3f s  comm %.0f%% of it\n", "step", t.StepS, 100*t.CommShare)
	fmt.Fprintf(w, "  %-10s %9.1f    the paper's FLOPs, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) = %.3g an iteration, over the step and %d GPUs\n",
		"TFLOP/s", sc.TFLOPs, sc.IterFlops, p.NTasks)
	if r := sc.Paper; r != nil {
		fmt.Fprintf(w, "  %-10s %9.1f    Narayanan et al. 2021, Table 1 (%.1fB, %.0f%% of peak): predicted %+.1f%%\n", "paper", r.TFLOPs, r.ParamsB, r.PeakPct, sc.ErrorPct)
	}
	fmt.Fprintf(w, "  %-10s %8.1f%%    model FLOPs, as hpcrun metrics counts them (no recomputation)\n", "MFU", 100*t.MFU)
	fmt.Fprintf(w, "  %-10s %8.1f%%    the forward that full recomputation runs again counted\n", "HFU", 100*t.HFU)
	for _, s := range sc.Modelled {
		fmt.Fprintf(w, "modelled: %s\n", s)
	}
	for _, s := range sc.Assumed {
		fmt.Fprintf(w, "assumed: %s\n", s)
	}
	return nil
}

func crossNode(sc *Scale) string {
	if sc.CrossNodePP {
		return " (across nodes, scatter/gather)"
	}
	return ""
}

// writeGiven prints, under a plan at scale's search, how the first
// compares with the request's own layout and, where the model is a row of
// the paper's table, with the paper's figure.
func writeGiven(w io.Writer, res *AutoResult) {
	first := res.Ranked[0]
	tf := func(p *Plan) float64 { return p.Scale.TFLOPs }
	if g := res.Given; g != nil {
		state := "fits"
		if !g.Plan.Fits {
			state = "does not fit"
		}
		fmt.Fprintf(w, "the flags' layout %s: %.1f TFLOP/s a GPU predicted (%s); the first, %s: %.1f, %+.1f%%\n",
			g.Layout, tf(g.Plan), state, first.Layout, tf(first.Plan), 100*(tf(first.Plan)/tf(g.Plan)-1))
	}
	if r := first.Plan.Scale.Paper; r != nil {
		fmt.Fprintf(w, "paper (Narayanan et al. 2021, Table 1): tp %d pp %d on %d GPUs reached %.0f TFLOP/s a GPU\n", r.TP, r.PP, r.GPUs, r.TFLOPs)
	}
}

// ScaleOptions are hpcrun plan --cluster's: the config (a GPT and its
// layout) and vocabulary, the preset's name, the virtual stages of the
// interleaved schedule, and whether to search the layouts (--auto, the
// Top best printed) and print JSON; Flags are AutoResult.Flags.
type ScaleOptions struct {
	Config     config.Config
	Vocab      int
	Cluster    string
	Interleave int
	Auto       bool
	Top        int
	JSON       bool
	Flags      string
}

// ScaleCommand is hpcrun plan --cluster: the plan at scale of the
// options' layout (AtScale), or with Auto the search of every layout of
// its GPUs and global batch on the cluster (Auto with a Cluster), printed
// to w.
func ScaleCommand(w io.Writer, o ScaleOptions) error {
	c, err := LookupCluster(o.Cluster)
	if err != nil {
		return err
	}
	if o.Interleave < 0 {
		return fmt.Errorf("--interleave %d: must not be negative", o.Interleave)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if o.Auto {
		res, err := Auto(AutoRequest{Request: Request{Config: o.Config, Vocab: o.Vocab}, Cluster: &c, Interleave: o.Interleave})
		if err != nil {
			return err
		}
		res.Flags = o.Flags
		if o.JSON {
			return enc.Encode(res)
		}
		return WriteAuto(w, res, o.Top)
	}
	p, err := AtScale(ScaleRequest{Config: o.Config, Vocab: o.Vocab, Cluster: c, Interleave: o.Interleave})
	if err != nil {
		return err
	}
	if o.JSON {
		return enc.Encode(p)
	}
	return WriteScale(w, p)
}
