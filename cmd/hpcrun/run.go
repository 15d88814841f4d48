package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
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
			"metrics summary when they finish. Example: hpcrun run --nproc 4 --tp 2",
		Flags: append([]cli.Flag{
			&cli.IntFlag{Name: "nproc", Usage: "processes (ranks) to start; the same as --ntasks"},
		}, trainFlags()...),
		Action: runLocal,
	}
}

func runLocal(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("run takes no arguments, got %q: training options are flags (hpcrun run --help)", c.Args().First()), 2)
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
		ExecID: execID, JobID: strconv.Itoa(os.Getpid()), Executor: "run", Host: shortHostname(),
		Spec: slurm.JobSpec{Name: fmt.Sprintf("%s-n%d-tp%d", cfg.Model, cfg.NTasks, cfg.TP), RunDir: dir.Path(),
			NTasks: cfg.NTasks, Program: self, Args: args},
		SubmitTime: time.Now().UTC(), Version: version, Binary: self,
	}
	if err := writeRunFiles(dir, cfg, meta); err != nil {
		os.RemoveAll(dir.Path())
		return err
	}
	lay := metrics.RunConfig{TP: cfg.TP, DP: cfg.DP(), PP: cfg.PP, SP: cfg.SP, Zero: cfg.Zero}.Layout()
	fmt.Fprintf(os.Stderr, "run %s: %d ranks (%s) on this machine\nrun dir: %s\n", execID, cfg.NTasks, lay, dir)

	start := time.Now()
	port, err := slurm.FreePort()
	if err != nil {
		return err
	}
	tasks := slurm.Tasks{N: cfg.NTasks, Program: self, Args: args, Vars: slurm.TorchrunVars(cfg.NTasks, port, execID, "run"), Grace: 15 * time.Second}
	failed, err := tasks.Run(c.Context)
	final := &slurm.JobInfo{ID: meta.JobID, Name: meta.Spec.Name, State: slurm.Completed, Elapsed: time.Since(start).Round(time.Second), Nodes: 1, NodeList: meta.Host, Source: "run"}
	if err != nil || len(failed) > 0 {
		final.State, final.Reason, final.ExitCode = slurm.Failed, "NonZeroExitCode", 1
		if len(failed) > 0 {
			final.ExitCode = failed[0].ExitCode()
		}
	}
	meta.Final = final
	if werr := slurm.WriteMeta(dir, meta); werr != nil {
		fmt.Fprintf(os.Stderr, "hpcrun: warning: %v\n", werr)
	}
	if err != nil {
		return err
	}
	if s, _, rerr := metrics.ReadSummary(dir.Path(), metrics.NoCurves); rerr == nil {
		metrics.WriteSummary(os.Stdout, s)
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
func writeRunFiles(dir rundir.Dir, cfg train.Config, meta *slurm.Meta) error {
	if err := dir.WriteToken(); err != nil {
		return err
	}
	if err := train.WriteConfigFile(dir.Config(), cfg, "Training config of run "+dir.ExecID()+", written by hpcrun run."); err != nil {
		return err
	}
	return slurm.WriteMeta(dir, meta)
}
