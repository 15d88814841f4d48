package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/internal/grid"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

// A sweep is rundir's sweep directory (sweep.json, the job array and its
// logs) and one normal run dir per point that runs, so metrics, logs,
// queue and cancel work on it by execid; a point's meta.json has the array
// task's job id <A>_<a> (slurm.ArrayTaskID).

// sweepGrid are the flags a sweep takes as comma-separated lists.
var sweepGrid = []string{"preset", "tp", "bsz"}

func sweepCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range submitCommand().Flags {
		name := f.Names()[0]
		if slices.Contains([]string{"wait", "resume", "check"}, name) || slices.Contains(sweepGrid, name) {
			continue
		}
		flags = append(flags, f)
	}
	flags = append(flags,
		&cli.StringFlag{Name: "preset", Usage: "presets to sweep, comma-separated (tiny,small,bert-base,...)", Category: "grid"},
		&cli.StringFlag{Name: "tp", Usage: "tensor-parallel degrees to sweep, comma-separated", Category: "grid"},
		&cli.StringFlag{Name: "bsz", Usage: "batch sizes to sweep, comma-separated", Category: "grid"},
		&cli.IntFlag{Name: "parallel", Usage: "run at most `K` points at once (the array's %K; 0 = as Slurm allows)", Category: "grid"},
		&cli.BoolFlag{Name: "auto", Usage: "instead of a grid, the --top fastest layouts of --ntasks that hpcrun plan --auto finds (the global batch of bsz x micro-batches x dp kept)", Category: "grid"},
		&cli.IntFlag{Name: "top", Value: 3, Usage: "with --auto, run the best `K` layouts", Category: "grid"},
	)
	return &cli.Command{
		Name:      "sweep",
		Usage:     "submit a grid of runs (--tp 1,2,4 --bsz 8,16 --preset a,b) as one Slurm job array",
		ArgsUsage: " ",
		Description: "Plans every point of the grid (the product of --preset, --tp and --bsz; the other\n" +
			"flags are submit's and hold for every point) and submits those that fit as one job\n" +
			"array, one task a point, each a normal run (hpcrun metrics <execid> works on it);\n" +
			"points that cannot fit, or are invalid, are listed and skipped. --ntasks defaults to\n" +
			"the largest tp. With the Local executor the points run one after another.\n" +
			"--auto --top K runs plan --auto's K fastest layouts instead of a grid; sweep show then\n" +
			"sets their predicted rank beside the rank of their measured tokens/s.\n" +
			"`hpcrun sweep show <sweepid>` prints the grid's predicted and measured figures.",
		Flags:  flags,
		Action: runSweep,
		Subcommands: []*cli.Command{
			{
				Name:      "show",
				Usage:     "one table of a sweep: point, fits, predicted and measured memory and tokens/s, MFU, loss, state",
				ArgsUsage: "<sweepid|prefix>",
				Action:    runSweepShow,
			},
			{
				Name:   "task",
				Usage:  "run one array task's point (what srun runs inside a sweep's job)",
				Hidden: true,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "sweep-dir", Usage: "the sweep's `DIR`", Required: true},
					&cli.StringFlag{Name: "run-dir", Hidden: true},
				},
				Action: runSweepTask,
			},
		},
	}
}

// sweepState is sweep.json.
type sweepState struct {
	ID        string              `json:"sweepid"`
	Executor  string              `json:"executor"`
	JobID     string              `json:"jobid,omitempty"` // the array's job id (Slurm)
	Submitted time.Time           `json:"submit_time"`
	Grid      map[string][]string `json:"grid"`
	Auto      bool                `json:"auto,omitempty"` // plan --auto's layouts, not a grid
	Points    []sweepPoint        `json:"points"`
}

// sweepPoint is one point of the grid.
type sweepPoint struct {
	Label string `json:"point"` // e.g. "preset=tiny tp=2 bsz=8"
	// Skipped says why the point does not run ("" when it does).
	Skipped string `json:"skipped,omitempty"`
	Fits    *bool  `json:"fits,omitempty"` // nil when there is no plan
	// Task is the array task id of the point (-1 when skipped); ExecID
	// and JobID its run and job.
	Task   int        `json:"task"`
	ExecID string     `json:"execid,omitempty"`
	JobID  string     `json:"jobid,omitempty"`
	Plan   *plan.Plan `json:"plan,omitempty"`
	// PredRank is the point's place in plan --auto's ranking (sweep --auto).
	PredRank int `json:"predicted_rank,omitempty"`
}

// parseGrid reads the grid flags: the values of each list in order.
func parseGrid(c *cli.Context) (map[string][]string, error) {
	grid := map[string][]string{}
	for _, name := range sweepGrid {
		if !c.IsSet(name) {
			continue
		}
		var vals []string
		for _, v := range strings.Split(c.String(name), ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return nil, cli.Exit(fmt.Sprintf("--%s %q: an empty value; give a comma-separated list such as 1,2,4", name, c.String(name)), 2)
			}
			if name != "preset" {
				if n, err := strconv.Atoi(v); err != nil || n < 1 {
					return nil, cli.Exit(fmt.Sprintf("--%s %q: %q is not a positive integer", name, c.String(name), v), 2)
				}
			}
			if !slices.Contains(vals, v) {
				vals = append(vals, v)
			}
		}
		grid[name] = vals
	}
	if len(grid) == 0 {
		return nil, cli.Exit("sweep: give at least one of --preset, --tp, --bsz as a comma-separated list", 2)
	}
	return grid, nil
}

// planned is a point that runs, with its submit plan.
type planned struct {
	index int
	p     *submitPlan
}

func runSweep(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("sweep takes no arguments, got %q (hpcrun sweep show <sweepid> reads one back)", c.Args().First()), 2)
	}
	if k := c.Int("parallel"); k < 0 {
		return cli.Exit(fmt.Sprintf("--parallel %d: give 0 (no limit) or more", k), 2)
	}
	if c.Bool("auto") {
		points, labels, err := autoPoints(c)
		if err != nil {
			return err
		}
		return submitSweep(c, &sweepState{Auto: true, Submitted: time.Now().UTC()}, points, labels)
	}
	axes, err := parseGrid(c)
	if err != nil {
		return err
	}
	if !c.IsSet("ntasks") {
		most := 1
		for _, v := range axes["tp"] {
			n, _ := strconv.Atoi(v)
			most = max(most, n)
		}
		if _, ok := axes["tp"]; ok {
			if err := c.Set("ntasks", strconv.Itoa(most)); err != nil {
				return err
			}
		}
	}
	return submitSweep(c, &sweepState{Grid: axes, Submitted: time.Now().UTC()}, grid.Product(sweepGrid, axes), nil)
}

// autoPoints are sweep --auto's points, plan --auto's --top fastest
// layouts, each as the flags that set it, and their labels.
func autoPoints(c *cli.Context) ([]grid.Point, []string, error) {
	for _, name := range sweepGrid {
		if strings.Contains(c.String(name), ",") {
			return nil, nil, cli.Exit(fmt.Sprintf("sweep --auto chooses the layouts: --%s takes one value, not %q", name, c.String(name)), 2)
		}
	}
	if k := c.Int("top"); k < 1 {
		return nil, nil, cli.Exit(fmt.Sprintf("--top %d: give 1 or more", k), 2)
	}
	p, err := planSubmit(c, true)
	if err != nil {
		return nil, nil, err
	}
	if p.plan == nil {
		return nil, nil, errors.New(p.planNote)
	}
	res, err := planAuto(p)
	if err != nil {
		return nil, nil, cli.Exit("sweep --auto: "+oneLineErr(err), 1)
	}
	top := res.Ranked[:min(c.Int("top"), len(res.Ranked))]
	points, labels := make([]grid.Point, len(top)), make([]string, len(top))
	for i, r := range top {
		l := r.Config
		recompute := cmp.Or(l.Recompute, "none")
		points[i] = grid.Point{{Name: "tp", Value: strconv.Itoa(l.TP)}, {Name: "pp", Value: strconv.Itoa(l.PP)}, {Name: "pp-split", Value: ""},
			{Name: "micro-batches", Value: strconv.Itoa(l.MicroBatches)}, {Name: "grad-accum", Value: strconv.Itoa(l.GradAccum)},
			{Name: "bsz", Value: strconv.Itoa(l.BatchSize)}, {Name: "sp", Value: strconv.FormatBool(l.SP)}, {Name: "zero", Value: strconv.Itoa(l.Zero)},
			{Name: "recompute", Value: recompute}}
		labels[i] = r.Layout.String()
	}
	return points, labels, nil
}

// submitSweep plans the points (labelled by labels, else by their
// settings; with st.Auto ranked, best first) and submits those that fit
// as one job array.
func submitSweep(c *cli.Context, st *sweepState, points []grid.Point, labels []string) error {
	var runs []planned
	for i, pt := range points {
		sp := sweepPoint{Label: pt.Label(), Task: -1}
		if labels != nil {
			sp.Label = labels[i]
		}
		if st.Auto {
			sp.PredRank = i + 1
		}
		for _, set := range pt {
			if err := c.Set(set.Name, set.Value); err != nil {
				return err
			}
		}
		p, err := planSubmit(c, true)
		switch {
		case err != nil:
			sp.Skipped = "invalid: " + oneLineErr(err)
		case p.plan == nil:
			sp.Skipped = "no plan: " + p.planNote
		default:
			fits := p.plan.Fits
			sp.Fits, sp.Plan = &fits, p.plan
			if !fits && !c.Bool("force") {
				sp.Skipped = fmt.Sprintf("cannot fit: %s a rank, %s over %s", bytesIEC(p.plan.Memory.Total), bytesIEC(-p.plan.Headroom), p.plan.Device.Name)
			}
		}
		if sp.Skipped == "" {
			if len(runs) > 0 && runs[0].p.exec.Name() != p.exec.Name() {
				return errors.New("sweep: the points choose different executors")
			}
			sp.Task = len(runs)
			runs = append(runs, planned{index: len(st.Points), p: p})
		}
		st.Points = append(st.Points, sp)
	}
	w := c.App.Writer
	if len(runs) == 0 {
		writeSweepPlan(w, st)
		return cli.Exit("sweep: no point of the grid can run", 1)
	}
	st.Executor = runs[0].p.exec.Name()
	if c.Bool("dry-run") {
		writeSweepPlan(w, st)
		spec := arraySpec(c, runs, filepath.Join(rundir.Sweeps(runs[0].p.runsDir), runs[0].p.execHint))
		script, err := slurm.Script(spec, runs[0].p.tmpl, version, runs[0].p.execHint)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(script)
		return err
	}
	sdir, err := rundir.NewSweep(runs[0].p.runsDir, time.Now())
	if err != nil {
		return err
	}
	st.ID = sdir.ExecID()
	metas := make([]*slurm.Meta, len(runs))
	for i, r := range runs {
		dir, err := rundir.New(r.p.runsDir, time.Now())
		if err != nil {
			return err
		}
		r.p.setRunDir(dir.Path())
		if metas[i], err = r.p.write(dir); err != nil {
			return err
		}
		st.Points[r.index].ExecID = dir.ExecID()
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if st.Executor == "local" {
		return runSweepLocal(ctx, w, sdir, st, runs, metas)
	}
	spec := arraySpec(c, runs, sdir.Path())
	script, err := slurm.Script(spec, runs[0].p.tmpl, version, st.ID)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(sdir.Script(), script, 0o755); err != nil {
		return err
	}
	// The tasks read sweep.json to find their run dir: it exists before them.
	if err := writeSweep(sdir, st); err != nil {
		return err
	}
	jobID, _, err := runs[0].p.exec.Submit(ctx, slurm.Submission{Spec: spec, Script: sdir.Script()})
	if err != nil {
		return fmt.Errorf("submit sweep %s: %w", st.ID, slurmErr(err))
	}
	st.JobID = jobID
	for i, r := range runs {
		task := slurm.ArrayTaskID(jobID, i)
		pt := &st.Points[r.index]
		pt.JobID = task
		metas[i].JobID = task
		if err := slurm.WriteMeta(rundir.Dir(r.p.spec.RunDir), metas[i]); err != nil {
			return err
		}
		_ = rundir.LinkLogs(sdir, rundir.Dir(r.p.spec.RunDir), task, task) // best effort: logs finds the sweep's too
	}
	if err := writeSweep(sdir, st); err != nil {
		return err
	}
	writeSweepPlan(w, st)
	fmt.Fprintf(w, "submitted sweep %s as slurm job array %s (%d tasks, %d points skipped)\nsweep dir: %s\n",
		st.ID, jobID, len(runs), len(st.Points)-len(runs), sdir)
	return nil
}

// arraySpec is the job array of the runs: their common job, one task each,
// every task running `hpcrun sweep task` in the sweep dir.
func arraySpec(c *cli.Context, runs []planned, dir string) slurm.JobSpec {
	spec := runs[0].p.spec
	spec.RunDir = dir
	spec.Args = []string{"sweep", "task", "--sweep-dir", dir}
	spec.Array = slurm.ArrayRange(len(runs), c.Int("parallel"))
	if !c.IsSet("name") {
		spec.Name = "sweep-" + runs[0].p.train.Model
	}
	return spec
}

// writeSweep writes sweep.json.
func writeSweep(d rundir.Dir, st *sweepState) error {
	return rundir.WriteJSON(d.Sweep(), st)
}

func readSweep(d rundir.Dir) (*sweepState, error) {
	b, err := os.ReadFile(d.Sweep())
	if err != nil {
		return nil, err
	}
	var st sweepState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Sweep(), err)
	}
	return &st, nil
}

// runSweepLocal runs the points one after another with the Local
// executor, each a normal Local job of its run dir, waiting for each.
func runSweepLocal(ctx context.Context, w io.Writer, sdir rundir.Dir, st *sweepState, runs []planned, metas []*slurm.Meta) error {
	writeSweepPlan(w, st)
	fmt.Fprintf(w, "sweep %s: %d points one after another on this machine (local executor)\n", st.ID, len(runs))
	for i, r := range runs {
		pt := &st.Points[r.index]
		dir := rundir.Dir(r.p.spec.RunDir)
		jobID, _, err := r.p.exec.Submit(ctx, slurm.Submission{Spec: r.p.spec, Script: dir.Script()})
		metas[i].JobID = jobID
		if err != nil {
			metas[i].SubmitError = err.Error()
		}
		pt.JobID = jobID
		if werr := errors.Join(slurm.WriteMeta(dir, metas[i]), writeSweep(sdir, st)); werr != nil {
			return werr
		}
		if err != nil {
			return fmt.Errorf("sweep %s: submit %s: %w", st.ID, pt.Label, err)
		}
		j, err := waitJob(ctx, slurm.Run{Dir: dir, Meta: metas[i]})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %s: run %s %s after %s\n", pt.Label, pt.ExecID, j.State, slurm.FormatElapsed(j.Elapsed))
	}
	fmt.Fprintf(w, "sweep %s done: hpcrun sweep show %s\n", st.ID, st.ID)
	return nil
}

// waitJob waits for a run's job to be over.
func waitJob(ctx context.Context, r slurm.Run) (slurm.JobInfo, error) {
	j, err := slurm.Wait(ctx, 500*time.Millisecond, func(ctx context.Context) (slurm.JobInfo, error) { return r.Status(ctx) }, nil)
	if errors.Is(err, slurm.ErrStoppedWaiting) {
		return j, cli.Exit(fmt.Sprintf("stopped waiting for run %s; its job goes on (hpcrun cancel %s)", r.Meta.ExecID, r.Meta.ExecID), 130)
	}
	if err != nil {
		return j, slurmErr(err)
	}
	return j, nil
}

// writeSweepPlan lists the grid's points with their plan and what happens
// to each.
func writeSweepPlan(w io.Writer, st *sweepState) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tFITS\tMEM PRED\tSTEP S\tTOK/S PRED\tMFU\tRUN")
	for _, p := range st.Points {
		fits, mem, step, tok, mfu := "-", "-", "-", "-", "-"
		if p.Plan != nil {
			fits = yesNo(p.Plan.Fits)
			mem = bytesIEC(p.Plan.Memory.EnginePeak) // what sweep show and metrics set beside the measured
			step = fmt.Sprintf("%.3f", p.Plan.Time.StepS)
			tok = fmt.Sprintf("%.0f", p.Plan.Time.TokensPerS)
			mfu = fmt.Sprintf("%.1f%%", 100*p.Plan.Time.MFU)
		}
		run := p.ExecID
		if p.Skipped != "" {
			run = "skipped: " + p.Skipped
		} else if run == "" {
			run = fmt.Sprintf("task %d", p.Task)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Label, fits, mem, step, tok, mfu, run)
	}
	tw.Flush()
	writeSweepNotes(w, st)
}

// writeSweepNotes says what the predictions rest on: the device and rate
// each plan assumed (a default CPU rate is far from a measured one).
func writeSweepNotes(w io.Writer, st *sweepState) {
	seen := map[string]bool{}
	for _, p := range st.Points {
		if p.Plan == nil || seen[p.Plan.Device.Source] {
			continue
		}
		seen[p.Plan.Device.Source] = true
		note := "predictions for " + p.Plan.Device.Name
		if src := p.Plan.Device.Source; src != "" {
			note += " at " + src
		}
		fmt.Fprintln(w, "note: "+note)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// oneLineErr is err's message on one line.
func oneLineErr(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// runSweepTask is an array task: it finds its point's run dir by
// SLURM_ARRAY_TASK_ID and runs the training task there.
func runSweepTask(c *cli.Context) error {
	sdir := rundir.Dir(c.String("sweep-dir"))
	st, err := readSweep(sdir)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	id, err := strconv.Atoi(os.Getenv("SLURM_ARRAY_TASK_ID"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("sweep task: SLURM_ARRAY_TASK_ID is %q: run inside the sweep's job array", os.Getenv("SLURM_ARRAY_TASK_ID")), 2)
	}
	for _, p := range st.Points {
		if p.Task != id || p.ExecID == "" {
			continue
		}
		dir := sdir.Point(p.ExecID)
		// The job's own id names its logs for scontrol's answers: link
		// them too (once, from the first task).
		if job := os.Getenv("SLURM_JOB_ID"); job != "" && os.Getenv("SLURM_PROCID") == "0" {
			_ = rundir.LinkLogs(sdir, dir, job, p.JobID)
		}
		if err := c.Set("run-dir", dir.Path()); err != nil {
			return err
		}
		return runTrainTask(c)
	}
	return cli.Exit(fmt.Sprintf("sweep task: %s has no point for array task %d", sdir.Sweep(), id), 2)
}

// sweepRow is one line of hpcrun sweep show.
type sweepRow struct {
	Point          string        `json:"point"`
	ExecID         string        `json:"execid,omitempty"`
	Fits           *bool         `json:"fits,omitempty"`
	PredMemBytes   int64         `json:"predicted_mem_bytes"` // the plan's engine peak a rank
	MeasMemBytes   int64         `json:"measured_mem_bytes"`  // the largest engine peak of a rank
	PredTokensPerS metrics.Float `json:"predicted_tokens_per_s"`
	MeasTokensPerS metrics.Float `json:"measured_tokens_per_s"`
	// PredRank and MeasRank are the point's place among the points that
	// run by predicted tokens/s (plan --auto's for sweep --auto) and by
	// measured tokens/s (0: unknown).
	PredRank  int           `json:"predicted_rank"`
	MeasRank  int           `json:"measured_rank"`
	MFU       metrics.Float `json:"mfu"` // measured, against the plan's device peak
	FinalLoss metrics.Float `json:"final_loss"`
	State     string        `json:"state"` // done, running, pending, OOM, time limit, failed (class), skipped (why)
}

func runSweepShow(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("usage: hpcrun sweep show <sweepid|prefix>", 2)
	}
	runs, err := runsDir(c)
	if err != nil {
		return err
	}
	r, err := rundir.Find(rundir.Sweeps(runs), c.Args().First())
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	st, err := readSweep(r.Dir)
	if err != nil {
		return err
	}
	rows := make([]sweepRow, len(st.Points))
	pred, meas := make([]metrics.Float, len(rows)), make([]metrics.Float, len(rows))
	for i, p := range st.Points {
		rows[i] = sweepRowOf(c, runs, p)
		pred[i], meas[i] = rows[i].PredTokensPerS, rows[i].MeasTokensPerS
		if p.Skipped != "" {
			pred[i] = metrics.Float(math.NaN())
		}
	}
	predRank, measRank := plan.Ranks(pred), plan.Ranks(meas)
	for i, p := range st.Points {
		rows[i].PredRank, rows[i].MeasRank = cmp.Or(p.PredRank, predRank[i]), measRank[i]
	}
	if wantJSON(c) {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	w := c.App.Writer
	fmt.Fprintf(w, "sweep %s: %s job %s, %d points\n", st.ID, st.Executor, orDash(st.JobID), len(st.Points))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tFITS\tMEM PRED\tMEM MEAS\tTOK/S PRED\tTOK/S MEAS\tERROR\tRANK PRED\tRANK MEAS\tMFU\tLOSS\tSTATE\tEXECID")
	num := func(v metrics.Float, format string) string {
		if !v.Known() {
			return "-"
		}
		return fmt.Sprintf(format, float64(v))
	}
	mem := func(n int64) string {
		if n <= 0 {
			return "-"
		}
		return bytesIEC(n)
	}
	rank := func(n int) string {
		if n == 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	for _, r := range rows {
		fits := "-"
		if r.Fits != nil {
			fits = yesNo(*r.Fits)
		}
		tokErr := num(plan.ErrorPct(r.PredTokensPerS, r.MeasTokensPerS), "%+.1f%%")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Point, fits, mem(r.PredMemBytes), mem(r.MeasMemBytes),
			num(r.PredTokensPerS, "%.0f"), num(r.MeasTokensPerS, "%.0f"), tokErr, rank(r.PredRank), rank(r.MeasRank),
			num(100*r.MFU, "%.1f%%"), num(r.FinalLoss, "%.4f"), r.State, orDash(r.ExecID))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeSweepNotes(w, st)
	return nil
}

// sweepRowOf reads one point's run back.
func sweepRowOf(c *cli.Context, runs string, p sweepPoint) sweepRow {
	unknown := metrics.Float(math.NaN())
	row := sweepRow{Point: p.Label, ExecID: p.ExecID, Fits: p.Fits, PredTokensPerS: unknown, MeasTokensPerS: unknown, MFU: unknown, FinalLoss: unknown}
	if p.Plan != nil {
		row.PredMemBytes, row.PredTokensPerS = p.Plan.Memory.EnginePeak, metrics.Float(p.Plan.Time.TokensPerS)
	}
	if p.Skipped != "" {
		row.State = "skipped (" + p.Skipped + ")"
		return row
	}
	dir := rundir.Dir(filepath.Join(runs, p.ExecID))
	s, _, err := metrics.ReadSummary(dir.Path(), metrics.NoCurves)
	if err != nil {
		row.State = "unreadable: " + oneLineErr(err)
		return row
	}
	for _, m := range s.Memory {
		row.MeasMemBytes = max(row.MeasMemBytes, m.EnginePeakBytes)
	}
	// The measured figures are metrics' own, MFU included (against the
	// peak the ranks recorded; unknown on a CPU, as metrics says).
	row.MeasTokensPerS, row.FinalLoss, row.MFU = s.TokensPerS, s.LastLoss, s.MFU
	row.State = sweepStateOf(c, dir, p, s)
	return row
}

// sweepStateOf is a point's state in a word or two: done, running,
// pending, or how it failed (OOM, time limit, failed (class)).
func sweepStateOf(c *cli.Context, dir rundir.Dir, p sweepPoint, s metrics.Summary) string {
	m, err := slurm.ReadMeta(dir)
	if err != nil {
		return "no meta.json"
	}
	j, err := (slurm.Run{Dir: dir, Meta: m}).Status(c.Context)
	if err != nil {
		return "unknown (" + oneLineErr(err) + ")"
	}
	j.ID = p.JobID // the task's logs are named by the array's id
	switch v := failure.Of(dir, j); v.Class {
	case failure.None:
	case failure.OutOfMemory:
		return "OOM"
	case failure.TimeLimit:
		return "time limit"
	default:
		return "failed (" + string(v.Class) + ")"
	}
	switch {
	case j.State == slurm.Completed || s.Status == metrics.StatusCompleted:
		return "done"
	case j.State.Done():
		return strings.ToLower(string(j.State))
	case s.Status == "running" || j.State == "RUNNING":
		return "running"
	}
	return "pending"
}
