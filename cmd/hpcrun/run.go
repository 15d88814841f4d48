package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "run all ranks of a training locally, without Slurm",
		ArgsUsage: " ",
		Description: "Starts --nproc copies of `hpcrun train` on this machine (torchrun-style variables,\n" +
			"master on 127.0.0.1), in a new run directory under --runs-dir, and prints the\n" +
			"metrics summary when they finish. Example: hpcrun run --nproc 4 --tp 2\n" +
			"A run stopped with Ctrl-C saves a checkpoint; hpcrun run --resume EXECID goes on from it.",
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "nproc", Usage: "processes (ranks) to start; the same as --ntasks"},
			&cli.BoolFlag{Name: "force", Usage: "start even when hpcrun plan predicts the run does not fit this machine's memory"},
			&cli.StringFlag{Name: "resume", Usage: "start run `EXECID` of hpcrun run again, in its run dir with its train.toml: it resumes from its latest checkpoint"},
		}, trainFlags()...),
		Action: runLocal,
	}
}

func runLocal(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("run takes no arguments, got %q: training options are flags (hpcrun run --help)", c.Args().First()), 2)
	}
	if c.IsSet("resume") {
		return resumeLocal(c)
	}
	rc, err := resolveConfig(c)
	if err != nil {
		return err
	}
	cfg := rc.Train
	if err := applyTrainFlags(c, &cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if err := applyInitFrom(c, &cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if c.IsSet("nproc") {
		cfg.NTasks = c.Int("nproc")
	}
	// Every check, the data included, happens before any rank starts.
	if err := train.Check(cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	// The plan is kept in meta.json (metrics sets it beside the run, and
	// its peak is every MFU's); --force starts a run the plan refuses, or
	// that it cannot plan.
	pl, sug, err := planHere(cfg)
	if !c.Bool("force") {
		if err == nil {
			err = refuseUnfitHere(pl, sug)
		}
		if err != nil {
			return err
		}
	} else if err != nil {
		pl = nil
	}
	runsDir, err := filepath.Abs(rc.RunsDir)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of hpcrun: %w", err)
	}
	dir, err := rundir.New(runsDir, time.Now())
	if err != nil {
		return err
	}
	execID := dir.ExecID()
	args := []string{"train", "--run-dir", dir.Path()}
	meta := &slurm.Meta{
		ExecID: execID, Executor: "run", Host: slurm.Host(),
		Spec: slurm.JobSpec{Name: fmt.Sprintf("%s-n%d-tp%d", cfg.Model, cfg.NTasks, cfg.TP), RunDir: dir.Path(),
			NTasks: cfg.NTasks, Program: self, Args: args},
		SubmitTime: time.Now().UTC(), Version: version, Binary: self,
	}
	meta.JobID = strconv.Itoa(os.Getpid())
	err = recordPlan(meta, pl)
	if err == nil {
		err = writeRunFiles(dir, cfg, meta)
	}
	if err != nil {
		os.RemoveAll(dir.Path())
		return err
	}
	return launchLocal(c, dir, cfg, meta)
}

// resumeLocal starts a run of hpcrun run again in its run dir, with its
// train.toml: the ranks resume from its latest checkpoint.
func resumeLocal(c *cli.Context) error {
	for _, f := range trainFlags() {
		if name := f.Names()[0]; c.IsSet(name) {
			return cli.Exit(fmt.Sprintf("--resume takes no training flags (--%s): the run's train.toml is reused as it is", name), 2)
		}
	}
	runs, err := runsDir(c)
	if err != nil {
		return err
	}
	r, err := openRun(runs, c.String("resume"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if r.Meta.Executor != "run" {
		return cli.Exit(fmt.Sprintf("run %s was submitted (executor %s): resume it with hpcrun submit --resume %s", r.Meta.ExecID, r.Meta.Executor, r.Meta.ExecID), 2)
	}
	unlock, err := r.Dir.Lock() // held until the new launcher's pid is recorded
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	defer unlock()
	if r, err = slurm.OpenRun(runs, r.Meta.ExecID); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if j, err := r.Status(c.Context); err == nil && !j.State.Done() {
		return cli.Exit(fmt.Sprintf("run %s is still %s (hpcrun run, pid %s): stop it before resuming", r.Meta.ExecID, j.State, r.Meta.JobID), 2)
	}
	if err := refuseCompleted(r); err != nil {
		return err
	}
	cfg, err := trainconfig.ReadConfigFile(r.Dir.Config())
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("path of hpcrun: %w", err)
	}
	meta := r.Meta
	meta.NewJob(strconv.Itoa(os.Getpid()))
	meta.Host, meta.Binary, meta.Version = slurm.Host(), self, version
	meta.Spec.Program = self
	if err := slurm.WriteMeta(r.Dir, meta); err != nil {
		return err
	}
	unlock()
	return launchLocal(c, r.Dir, cfg, meta)
}

// launchLocal starts the ranks of run dir on this machine and waits for
// them; meta.json gets the final state: completed, failed, or cancelled
// when a signal stopped every rank (with a checkpoint to resume from).
func launchLocal(c *cli.Context, dir rundir.Dir, cfg trainconfig.Config, meta *slurm.Meta) error {
	execID := dir.ExecID()
	lay := metrics.RunConfig{TP: cfg.TP, DP: cfg.DP(), PP: cfg.PP, SP: cfg.SP, Zero: cfg.Zero, Recompute: cfg.Recompute}.Layout()
	fmt.Fprintf(os.Stderr, "run %s: %s (%s) on this machine\nrun dir: %s\n", execID, units.Count(cfg.NTasks, "rank"), lay, dir)

	start := time.Now()
	tasks := slurm.Tasks{N: cfg.NTasks, Program: meta.Spec.Program, Args: meta.Spec.Args, Grace: 15 * time.Second}
	asJSON := wantJSON(c)
	if asJSON {
		tasks.Stdout = os.Stderr // stdout holds the JSON alone
	}
	failed, err := slurm.Torchrun(c.Context, tasks, execID)
	final, stoppedBy := slurm.TasksEnd(meta, failed, err, time.Since(start))
	meta.Final = final
	if werr := slurm.WriteMeta(dir, meta); werr != nil {
		fmt.Fprintf(os.Stderr, "hpcrun: warning: %v\n", werr)
	}
	if err != nil {
		return err
	}
	if s, _, rerr := metrics.ReadSummary(dir.Path(), metrics.NoCurves); rerr == nil {
		if asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.Encode(struct {
				RunDir string        `json:"run_dir"`
				Final  slurm.JobInfo `json:"final"`
				metrics.Summary
			}{dir.Path(), *final, s})
		} else {
			metrics.WriteSummary(os.Stdout, s)
		}
	}
	if final.State == slurm.Cancelled {
		from := "no checkpoint: it would start over"
		if step, _ := ckpt.Latest(dir.Ckpt()); step != "" {
			from = "its checkpoint " + filepath.Base(step)
		}
		return cli.Exit(fmt.Sprintf("run %s stopped by %s (%s); resume with: hpcrun run --resume %s", execID, stoppedBy, from, execID), final.ExitCode)
	}
	if len(failed) > 0 {
		var parts []string
		for _, f := range failed {
			parts = append(parts, fmt.Sprintf("rank %d (%v)", f.Rank, f.Err))
		}
		return cli.Exit(fmt.Sprintf("run %s failed: %s; errors above, metrics in %s", execID, strings.Join(parts, ", "), dir.Metrics()), 1)
	}
	fmt.Fprintf(os.Stderr, "run %s completed in %s\n", execID, time.Since(start).Round(time.Millisecond))
	return nil
}

// writeRunFiles writes what the tasks of hpcrun run read, and its meta, so
// that queue, logs, metrics and ckpt find the run like a submitted one.
func writeRunFiles(dir rundir.Dir, cfg trainconfig.Config, meta *slurm.Meta) error {
	if err := dir.WriteToken(); err != nil {
		return err
	}
	if err := trainconfig.WriteConfigFile(dir.Config(), cfg, "Training config of run "+dir.ExecID()+", written by hpcrun run."); err != nil {
		return err
	}
	return slurm.WriteMeta(dir, meta)
}
