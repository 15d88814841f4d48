package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/metrics/chart"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

func metricsCommand() *cli.Command {
	return &cli.Command{
		Name:      "metrics",
		Usage:     "loss, accuracy, throughput, step time and memory of runs",
		ArgsUsage: "<execid|prefix|jobid>...",
		Description: "With one run, prints its summary: config, status, step time p50/p90 (warm-up\n" +
			"steps apart), throughput, share of time in communication, peak memory per rank,\n" +
			"model FLOP/s and MFU when the device peak is known, loss and accuracy. With\n" +
			"several runs, --compare or --last N, prints one table with a column per run.\n" +
			"Works on running jobs too: a torn last line is skipped, corrupt lines are listed.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the summary (and curves) as JSON"},
			&cli.BoolFlag{Name: "compare", Usage: "one table with a column per run"},
			&cli.IntFlag{Name: "last", Usage: "compare the `N` newest runs"},
			&cli.BoolFlag{Name: "plot", Usage: "draw loss, accuracy and throughput against steps in the terminal"},
			&cli.IntFlag{Name: "width", Value: 80, Usage: "terminal plot width in `COLUMNS`"},
			&cli.StringFlag{Name: "png", Usage: "write the curves as a PNG image to `FILE`"},
		},
		Action: runMetrics,
	}
}

func runMetrics(c *cli.Context) error {
	runsDir, err := runsDir(c)
	if err != nil {
		return err
	}
	refs := c.Args().Slice()
	if n := c.Int("last"); n != 0 {
		if n < 0 {
			return cli.Exit("--last N: N must be at least 1", 2)
		}
		if len(refs) > 0 {
			return cli.Exit("give either execids or --last N, not both", 2)
		}
		runs, err := rundir.List(runsDir)
		if err != nil {
			return err
		}
		if len(runs) == 0 {
			return fmt.Errorf("no runs under %s (pass --runs-dir, or submit one with hpcrun submit)", runsDir)
		}
		for _, r := range runs[max(0, len(runs)-n):] {
			refs = append(refs, r.ExecID)
		}
	}
	if len(refs) == 0 {
		return cli.Exit("usage: hpcrun metrics <execid>... [--json] [--compare] [--plot] [--png FILE], or hpcrun metrics --last N", 2)
	}
	compare := c.Bool("compare") || len(refs) > 1
	if compare && (c.Bool("plot") || c.String("png") != "") {
		return cli.Exit("--plot and --png draw one run: give a single execid", 2)
	}
	var sums []metrics.Summary
	var curves []metrics.Curves
	var fails []failure.Verdict
	var plans []*plan.Check
	for _, ref := range refs {
		r, err := findRef(runsDir, ref)
		if err != nil {
			return err
		}
		s, cv, err := metrics.ReadSummary(r.Dir.Path(), curvePoints(c))
		if err != nil {
			return err
		}
		m, err := slurm.ReadMeta(r.Dir)
		if err != nil {
			m = &slurm.Meta{} // no plan, no job to ask
		}
		fails = append(fails, failure.Settle(c.Context, r.Dir, &s))
		sums, curves = append(sums, s), append(curves, cv)
		plans = append(plans, plan.CheckRun(m.Plan, s))
	}
	w := c.App.Writer
	if wantJSON(c) {
		return writeMetricsJSON(w, sums, curves, fails, plans, compare)
	}
	if compare {
		return metrics.WriteCompare(w, sums)
	}
	if err := metrics.WriteSummary(w, sums[0]); err != nil {
		return err
	}
	if fails[0].Class != failure.None {
		fmt.Fprintf(w, "%-11s %s\n", "failure", fails[0])
	}
	plans[0].WriteText(w)
	if c.Bool("plot") {
		fmt.Fprintln(w)
		if err := chart.Terminal(w, curves[0], c.Int("width"), 10); err != nil {
			return fmt.Errorf("plot %s: %w", sums[0].ExecID, err)
		}
	}
	if path := c.String("png"); path != "" {
		c := sums[0].Config
		title := fmt.Sprintf("%s: %s, %d tasks, %s", sums[0].ExecID, c.Model, c.NTasks, c.Layout())
		if err := chart.PNG(path, curves[0], title); err != nil {
			return fmt.Errorf("png %s: %w", sums[0].ExecID, err)
		}
		fmt.Fprintf(w, "wrote %s\n", filepath.Clean(path))
	}
	return nil
}

// curvePoints is how much of the step curves the output needs: all for
// --json, enough to draw for --plot and --png, else none.
func curvePoints(c *cli.Context) int {
	switch {
	case wantJSON(c):
		return metrics.AllPoints
	case c.Bool("plot") || c.String("png") != "":
		return metrics.PlotPoints
	}
	return metrics.NoCurves
}

// wantJSON is --json given to the command or to hpcrun before it: the
// command's own flag hides the global one from c.Bool.
func wantJSON(c *cli.Context) bool {
	for _, l := range c.Lineage() {
		if l.Bool("json") {
			return true
		}
	}
	return false
}

// metricsJSON is one run in --json output.
type metricsJSON struct {
	metrics.Summary
	Failure *failure.Verdict `json:"failure,omitempty"`
	// Plan is the plan kept in meta.json beside what the run measured.
	Plan   *plan.Check    `json:"plan,omitempty"`
	Curves metrics.Curves `json:"curves"`
}

func writeMetricsJSON(w io.Writer, sums []metrics.Summary, curves []metrics.Curves, fails []failure.Verdict, plans []*plan.Check, many bool) error {
	out := make([]metricsJSON, len(sums))
	for i := range sums {
		out[i] = metricsJSON{Summary: sums[i], Curves: curves[i], Plan: plans[i]}
		if fails[i].Class != failure.None {
			out[i].Failure = &fails[i]
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if many {
		return enc.Encode(out)
	}
	return enc.Encode(out[0])
}
