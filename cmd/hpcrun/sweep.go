package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/grid"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/sweep"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

// A sweep is rundir's sweep directory (sweep.json, the job array and its
// logs) and one normal run dir per point that runs, so metrics, logs,
// queue and cancel work on it by execid; a point's meta.json has the array
// task's job id <A>_<a> (slurm.ArrayTaskID). Package sweep keeps its record
// and tables.

func sweepCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range submitCommand().Flags {
		name := f.Names()[0]
		if slices.Contains([]string{"wait", "resume", "check"}, name) || slices.Contains(sweep.Axes, name) {
			continue
		}
		flags = append(flags, f)
	}
	flags = append(flags,
		&cli.StringFlag{Name: "preset", Usage: "presets to sweep, comma-separated (tiny,small,bert-base,...)", Category: "grid"},
		&cli.StringFlag{Name: "tp", Usage: "tensor-parallel degrees to sweep, comma-separated", Category: "grid"},
		&cli.StringFlag{Name: "bsz", Usage: "batch sizes to sweep, comma-separated", Category: "grid"},
		&cli.IntFlag{Name: "parallel", Aliases: []string{"max-parallel"}, Usage: "run at most `K` points at once (the array's %K; 0 = as Slurm allows)", Category: "grid"},
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

// parseGrid reads the grid flags: the values of each list in order.
func parseGrid(c *cli.Context) (map[string][]string, error) {
	grid := map[string][]string{}
	for _, name := range sweep.Axes {
		if !c.IsSet(name) {
			continue
		}
		vals, err := sweep.ParseAxis(name, c.String(name))
		if err != nil {
			return nil, cli.Exit(err.Error(), 2)
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
		return submitSweep(c, &sweep.State{Auto: true, Submitted: time.Now().UTC()}, points, labels)
	}
	axes, err := parseGrid(c)
	if err != nil {
		return err
	}
	if most, ok := sweep.MostTP(axes); ok && !c.IsSet("ntasks") {
		if err := c.Set("ntasks", strconv.Itoa(most)); err != nil {
			return err
		}
	}
	return submitSweep(c, &sweep.State{Grid: axes, Submitted: time.Now().UTC()}, grid.Product(sweep.Axes, axes), nil)
}

// autoPoints are sweep --auto's points, plan --auto's --top fastest
// layouts, each as the flags that set it, and their labels.
func autoPoints(c *cli.Context) ([]grid.Point, []string, error) {
	for _, name := range sweep.Axes {
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
		return nil, nil, cli.Exit("sweep --auto: "+sweep.OneLine(err), 1)
	}
	top := res.Ranked[:min(c.Int("top"), len(res.Ranked))]
	points, labels := make([]grid.Point, len(top)), make([]string, len(top))
	for i, r := range top {
		points[i], labels[i] = sweep.LayoutPoint(r.Config), r.Layout.String()
	}
	return points, labels, nil
}

// submitSweep plans the points (labelled by labels, else by their
// settings; with st.Auto ranked, best first) and submits those that fit
// as one job array.
func submitSweep(c *cli.Context, st *sweep.State, points []grid.Point, labels []string) error {
	var runs []planned
	for i, pt := range points {
		sp := sweep.Point{Label: pt.Label(), Task: -1}
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
			sp.Skipped = "invalid: " + sweep.OneLine(err)
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
		st.WritePlan(w)
		return cli.Exit("sweep: no point of the grid can run", 1)
	}
	st.Executor = runs[0].p.exec.Name()
	if c.Bool("dry-run") {
		st.WritePlan(w)
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
	members := make([]sweep.Member, len(runs))
	for i, r := range runs {
		dir, err := rundir.New(r.p.runsDir, time.Now())
		if err != nil {
			return err
		}
		r.p.setRunDir(dir.Path())
		meta, err := r.p.write(dir)
		if err != nil {
			return err
		}
		st.Points[r.index].ExecID = dir.ExecID()
		members[i] = sweep.Member{Index: r.index, Run: slurm.Run{Dir: dir, Meta: meta}, Spec: r.p.spec}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if st.Executor == "local" {
		return sweep.RunLocal(ctx, w, runs[0].p.exec, sdir, st, members, waitJob)
	}
	spec := arraySpec(c, runs, sdir.Path())
	script, err := slurm.Script(spec, runs[0].p.tmpl, version, st.ID)
	if err != nil {
		return err
	}
	jobID, err := sweep.SubmitArray(ctx, runs[0].p.exec, sdir, st, spec, script, members)
	if err != nil {
		return slurmErr(err)
	}
	st.WritePlan(w)
	fmt.Fprintf(w, "submitted sweep %s as slurm job array %s (%s, %s skipped)\nsweep dir: %s\n",
		st.ID, jobID, units.Count(len(runs), "task"), units.Count(len(st.Points)-len(runs), "point"), sdir)
	return nil
}

// arraySpec is the job array of the runs: their common job, one task each.
func arraySpec(c *cli.Context, runs []planned, dir string) slurm.JobSpec {
	return sweep.ArraySpec(runs[0].p.spec, len(runs), c.Int("parallel"), dir, c.IsSet("name"), runs[0].p.train.Model)
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

// runSweepTask is an array task: it finds its point's run dir by
// SLURM_ARRAY_TASK_ID and runs the training task there.
func runSweepTask(c *cli.Context) error {
	sdir := rundir.Dir(c.String("sweep-dir"))
	st, err := sweep.Read(sdir)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	id, err := strconv.Atoi(os.Getenv("SLURM_ARRAY_TASK_ID"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("sweep task: SLURM_ARRAY_TASK_ID is %q: run inside the sweep's job array", os.Getenv("SLURM_ARRAY_TASK_ID")), 2)
	}
	p, ok := st.Task(id)
	if !ok {
		return cli.Exit(fmt.Sprintf("sweep task: %s has no point for array task %d", sdir.Sweep(), id), 2)
	}
	dir := sdir.Point(p.ExecID)
	// The job's own id names its logs for scontrol's answers: link them
	// too (once, from the first task).
	if job := os.Getenv("SLURM_JOB_ID"); job != "" && os.Getenv("SLURM_PROCID") == "0" {
		_ = rundir.LinkLogs(sdir, dir, job, p.JobID)
	}
	if err := c.Set("run-dir", dir.Path()); err != nil {
		return err
	}
	return runTrainTask(c)
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
	st, err := sweep.Read(r.Dir)
	if err != nil {
		return err
	}
	state := func(dir rundir.Dir, p sweep.Point, s metrics.Summary) string {
		return failure.RunState(c.Context, dir, p.JobID, s)
	}
	rows := st.Rows(runs, state)
	if wantJSON(c) {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	return st.WriteRows(c.App.Writer, rows)
}
