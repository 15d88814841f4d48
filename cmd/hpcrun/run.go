package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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
	execID, dir, err := slurm.NewRun(runsDir, time.Now())
	if err != nil {
		return err
	}
	if err := train.WriteConfigFile(filepath.Join(dir, train.ConfigFile), cfg, "Training config of run "+execID+", written by hpcrun run."); err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	if err := slurm.WriteFileAtomic(filepath.Join(dir, "token"), []byte(token+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "run %s: %d ranks (tp %d x dp %d) on this machine\nrun dir: %s\n", execID, cfg.NTasks, cfg.TP, cfg.DP(), dir)

	start := time.Now()
	ranks := localRanks{n: cfg.NTasks, args: []string{"train", "--run-dir", dir}, runID: execID, grace: 15 * time.Second}
	failed, err := ranks.run()
	if err != nil {
		return err
	}
	if run, rerr := metrics.ReadRun(dir); rerr == nil {
		s, _ := metrics.Summarize(run)
		metrics.WriteSummary(os.Stdout, s)
	}
	if len(failed) > 0 {
		var parts []string
		for _, f := range failed {
			parts = append(parts, fmt.Sprintf("rank %d (%v)", f.rank, f.err))
		}
		return cli.Exit(fmt.Sprintf("run %s failed: %s; errors above, metrics in %s", execID, strings.Join(parts, ", "), filepath.Join(dir, "metrics")), 1)
	}
	fmt.Fprintf(os.Stderr, "run %s completed in %s\n", execID, time.Since(start).Round(time.Millisecond))
	return nil
}
