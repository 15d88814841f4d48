package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print a run's stdout or stderr",
		ArgsUsage: "<execid|prefix|jobid>",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "err", Aliases: []string{"e"}, Usage: "print slurm-<jobid>.err instead of .out"},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing as the job writes, until it is over"},
		},
		Action: runLogs,
	}
}

func runLogs(c *cli.Context) error {
	r, err := findRun(c, "logs <execid|prefix|jobid> [--err] [--follow]")
	if err != nil {
		return err
	}
	m := r.Meta
	if m.Executor == "run" {
		return fmt.Errorf("run %s was started by hpcrun run, whose ranks wrote to its terminal: there is no log file (hpcrun metrics %s has what they recorded)", m.ExecID, m.ExecID)
	}
	if m.JobID == "" {
		return fmt.Errorf("run %s was never submitted, so it has no log: %s", m.ExecID, slurm.FirstLine(m.SubmitError))
	}
	path := r.Dir.Log(m.JobID, c.Bool("err"))
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !c.Bool("follow") {
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			return r.NoLog(ctx, path)
		}
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(os.Stdout, f)
		return err
	}
	return slurmErr(r.FollowLog(ctx, path, os.Stdout))
}
