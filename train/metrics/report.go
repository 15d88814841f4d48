package metrics

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/internal/units"
)

// WriteSummary writes the summary of one run as hpcrun metrics shows it.
func WriteSummary(w io.Writer, s Summary) error {
	var b strings.Builder
	c := s.Config
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-11s %s\n", label, fmt.Sprintf(format, args...))
	}
	job := ""
	if s.JobID != "" {
		job = "   job " + s.JobID
	}
	line("run", "%s%s", s.ExecID, job)
	st := s.Status
	if s.Error != "" {
		st += ": " + s.Error
	}
	line("status", "%s", st)
	line("progress", "step %s   wall %s", stepOf(s), dur(s.WallS))
	line("config", "%s", configText(c))
	if s.Step == 0 {
		line("steps", "none finished by every rank yet")
	} else {
		warm := ""
		if s.WarmupSteps > 0 {
			warm = fmt.Sprintf("   warm-up: first %d, mean %s, not counted", s.WarmupSteps, dur(s.WarmupStepS))
		}
		line("step time", "p50 %s   p90 %s%s", dur(s.StepP50S), dur(s.StepP90S), warm)
		line("throughput", "%s samples/s   %s tokens/s   per rank %s samples/s   %s tokens/s",
			num(s.SamplesPerS), num(s.TokensPerS), num(s.SamplesPerSPerRank), num(s.TokensPerSPerRank))
		line("comm", "%s of step time   p50 %s a step", pct(s.CommShare), dur(s.CommP50S))
		if len(s.Bubble) > 0 {
			var parts []string
			for _, b := range s.Bubble {
				parts = append(parts, fmt.Sprintf("stage %d %s", b.Stage, pct(b.Measured)))
			}
			line("bubble", "%s waiting on a neighbour   1F1B theory %s", strings.Join(parts, ", "), pct(s.Bubble[0].Theory))
		}
		switch {
		case s.MFU.Known():
			line("compute", "%sFLOP/s of model FLOPs   MFU %s of %sFLOP/s x %d ranks", si(s.ModelFlopsPerS), pct(s.MFU), si(s.PeakFlops), s.Config.NTasks)
		case s.ModelFlopsPerS.Known():
			line("compute", "%sFLOP/s of model FLOPs   MFU unknown (no device peak recorded)", si(s.ModelFlopsPerS))
		}
		if s.Recomputes() {
			line("hardware", "HFU %s: the forward that recompute %s runs again counted", pct(s.HFU), c.Recompute)
		}
		line("loss", "last %s (step %d)", num(s.LastLoss), s.Step)
	}
	if s.LastAccuracy.Known() || s.BestAccuracy.Known() {
		line("accuracy", "last %s   best %s   (eval loss %s)", pct(s.LastAccuracy), pct(s.BestAccuracy), num(s.LastEvalLoss))
	} else if s.LastEvalLoss.Known() {
		line("eval loss", "last %s", num(s.LastEvalLoss))
	}
	if len(s.Memory) > 0 {
		writeMemory(&b, s)
	}
	list(&b, "notes", s.Notes)
	if len(s.Problems) > 0 {
		list(&b, fmt.Sprintf("problems (%d, skipped)", len(s.Problems)), s.Problems)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeMemory(b *strings.Builder, s Summary) {
	if s.MemorySource == "nvml" {
		fmt.Fprintln(b, "memory      peak per rank: GPU from NVML (whole device), engine's own accounting beside it")
	} else {
		fmt.Fprintln(b, "memory      peak per rank, engine's own accounting (no NVML samples: not the device's figure)")
	}
	tw := tabwriter.NewWriter(b, 0, 0, 3, ' ', tabwriter.AlignRight)
	if s.MemorySource == "nvml" {
		fmt.Fprintln(tw, "rank\tGPU used\tof\tGPU util\tengine\t")
		for _, m := range s.Memory {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", m.Rank, bytesText(m.GPUPeakBytes), bytesText(m.GPUTotalBytes), pct(m.GPUUtilPct/100), bytesText(m.EnginePeakBytes))
		}
	} else {
		fmt.Fprintln(tw, "rank\tengine peak\t")
		for _, m := range s.Memory {
			fmt.Fprintf(tw, "%d\t%s\t\n", m.Rank, bytesText(m.EnginePeakBytes))
		}
	}
	tw.Flush()
}

func list(b *strings.Builder, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintln(b, title)
	for _, it := range items {
		fmt.Fprintf(b, "  - %s\n", it)
	}
}

func stepOf(s Summary) string {
	if s.TotalSteps > 0 {
		return fmt.Sprintf("%d/%d", s.Step, s.TotalSteps)
	}
	return fmt.Sprint(s.Step)
}

func configText(c RunConfig) string {
	if c.Model == "" && c.NTasks == 0 {
		return "unknown (no run line and no train.toml)"
	}
	model := c.Model
	if c.Preset != "" {
		model += " (" + c.Preset + ")"
	}
	return fmt.Sprintf("%s  layers %d dim %d heads %d seq %d bsz %d   ntasks %d = %s   %s   %s",
		model, c.Layers, c.Dim, c.Heads, c.Seq, c.BatchSize, c.NTasks, c.Layout(), orDash(c.Precision), orDash(c.Device))
}

// WriteCompare writes one table with a column per run.
func WriteCompare(w io.Writer, ss []Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(label string, f func(Summary) string) {
		fmt.Fprintf(tw, "%s\t", label)
		for _, s := range ss {
			fmt.Fprintf(tw, "%s\t", f(s))
		}
		fmt.Fprintln(tw)
	}
	row("", func(s Summary) string { return s.ExecID })
	row("status", func(s Summary) string { return s.Status })
	row("model", func(s Summary) string { return orDash(s.Config.Model) })
	row("layers x dim", func(s Summary) string { return fmt.Sprintf("%d x %d", s.Config.Layers, s.Config.Dim) })
	row("ntasks", func(s Summary) string { return fmt.Sprint(s.Config.NTasks) })
	row("pp", func(s Summary) string { return fmt.Sprint(max(s.Config.PP, 1)) })
	row("tp", func(s Summary) string { return fmt.Sprint(s.Config.TP) })
	row("dp", func(s Summary) string { return fmt.Sprint(s.Config.DP) })
	row("sp", func(s Summary) string { return map[bool]string{true: "yes", false: "no"}[s.Config.SP] })
	row("zero", func(s Summary) string { return fmt.Sprint(s.Config.Zero) })
	row("accumulation", func(s Summary) string { return s.Config.Accum() })
	row("precision", func(s Summary) string { return orDash(s.Config.Precision) })
	row("device", func(s Summary) string { return orDash(shortDevice(s.Config.Device)) })
	row("steps", func(s Summary) string { return stepOf(s) })
	row("step p50", func(s Summary) string { return dur(s.StepP50S) })
	row("step p90", func(s Summary) string { return dur(s.StepP90S) })
	row("samples/s", func(s Summary) string { return num(s.SamplesPerS) })
	row("samples/s/rank", func(s Summary) string { return num(s.SamplesPerSPerRank) })
	row("tokens/s", func(s Summary) string { return num(s.TokensPerS) })
	row("comm share", func(s Summary) string { return pct(s.CommShare) })
	row("peak mem/rank", func(s Summary) string { return bytesText(peakMem(s)) })
	row("memory from", func(s Summary) string {
		if peakMem(s) == 0 {
			return "-"
		}
		return s.MemorySource
	})
	row("MFU", func(s Summary) string { return pct(s.MFU) })
	if slices.ContainsFunc(ss, Summary.Recomputes) {
		row("HFU", func(s Summary) string { return pct(s.HFU) })
	}
	row("last loss", func(s Summary) string { return num(s.LastLoss) })
	row("best accuracy", func(s Summary) string { return pct(s.BestAccuracy) })
	row("problems", func(s Summary) string { return fmt.Sprint(len(s.Problems)) })
	return tw.Flush()
}

// peakMem is the largest per-rank peak, from NVML when recorded.
func peakMem(s Summary) int64 {
	var p int64
	for _, m := range s.Memory {
		if s.MemorySource == "nvml" {
			p = max(p, m.GPUPeakBytes)
		} else {
			p = max(p, m.EnginePeakBytes)
		}
	}
	return p
}

func shortDevice(d string) string {
	if i := strings.IndexByte(d, ' '); i > 0 {
		return d[:i]
	}
	return d
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// num prints a figure with four significant digits, "-" when unknown.
func num(f Float) string {
	if !f.Known() {
		if math.IsNaN(float64(f)) {
			return "-"
		}
		return fmt.Sprint(float64(f))
	}
	v := float64(f)
	switch a := math.Abs(v); {
	case a >= 1e4:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.4g", v)
}

func pct(f Float) string {
	if !f.Known() {
		return "-"
	}
	if v := 100 * float64(f); v != 0 && math.Abs(v) < 0.1 {
		return fmt.Sprintf("%.2g%%", v)
	}
	return fmt.Sprintf("%.1f%%", 100*float64(f))
}

func dur(f Float) string {
	if !f.Known() {
		return "-"
	}
	v := float64(f)
	switch {
	case v < 1:
		return fmt.Sprintf("%.1f ms", v*1e3)
	case v < 120:
		return fmt.Sprintf("%.2f s", v)
	case v < 7200:
		return fmt.Sprintf("%.1f min", v/60)
	}
	return fmt.Sprintf("%.1f h", v/3600)
}

func si(f Float) string {
	v := float64(f)
	for _, u := range []struct {
		p string
		v float64
	}{{"P", 1e15}, {"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
		if v >= u.v {
			return fmt.Sprintf("%.3g %s", v/u.v, u.p)
		}
	}
	return fmt.Sprintf("%.3g ", v)
}

// bytesText is units.Bytes with one decimal, "-" for nothing recorded.
func bytesText(n int64) string {
	if n <= 0 {
		return "-"
	}
	return units.Bytes(n, 1)
}

// Recomputes says whether s's HFU is known and not its MFU: the run
// recomputed activations, so the devices ran more FLOPs than the model's.
func (s Summary) Recomputes() bool {
	return s.HFU.Known() && s.HFU != s.MFU
}
