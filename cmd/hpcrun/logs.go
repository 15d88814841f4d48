package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

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
			return noLog(ctx, r, path)
		}
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(os.Stdout, f)
		return err
	}
	return followLog(ctx, r, path)
}

// noLog explains why a run has no log file yet, or not any more.
func noLog(ctx context.Context, r slurm.Run, path string) error {
	j, err := r.Status(ctx)
	if err == nil && !j.State.Done() {
		return fmt.Errorf("run %s (job %s) is %s: no output yet (use --follow to wait for it)", r.Meta.ExecID, j.ID, j.State)
	}
	if r.Meta.Spec.RunDir != "" && r.Meta.Spec.RunDir != r.Dir.Path() {
		return fmt.Errorf("no %s: run %s was made in %s on %s; its logs are there", filepath.Base(path), r.Meta.ExecID, r.Meta.Spec.RunDir, r.Meta.Host)
	}
	return fmt.Errorf("no %s in %s", filepath.Base(path), r.Dir)
}

// followLog prints the file as it grows until the job is over.
func followLog(ctx context.Context, r slurm.Run, path string) error {
	var off int64
	lastCheck := time.Time{}
	for {
		done := false
		if time.Since(lastCheck) > time.Second {
			j, err := r.Status(ctx)
			if err != nil {
				return slurmErr(err)
			}
			done, lastCheck = j.State.Done(), time.Now()
		}
		if f, err := os.Open(path); err == nil {
			f.Seek(off, io.SeekStart)
			n, _ := io.Copy(os.Stdout, f)
			off += n
			f.Close()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
