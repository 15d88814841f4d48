package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print a run's stdout or stderr",
		ArgsUsage: "<execid|prefix|jobid>",
		Description: "Prints the log of the run's current job; a job id of an earlier job of a resumed run\n" +
			"prints that job's log, and --all every job's in turn.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "err", Aliases: []string{"e"}, Usage: "print slurm-<jobid>.err instead of .out"},
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing as the job writes, until it is over"},
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "print the log of every job of a resumed run, oldest first, each after a header line"},
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
	job := m.JobID
	if ref := c.Args().First(); slices.Contains(m.PastJobs, ref) {
		job = ref // an earlier job of the run, named by the user
	}
	if c.Bool("all") {
		if c.Bool("follow") {
			return cli.Exit("--all prints the logs there are; --follow follows the current job's: give one", 2)
		}
		return printAllLogs(r, c.Bool("err"))
	}
	path := r.Dir.Log(job, c.Bool("err"))
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if job != m.JobID || !c.Bool("follow") {
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

// printAllLogs prints the log of each job of r, oldest first, each after
// a header line naming the job and its place among the run's jobs.
func printAllLogs(r slurm.Run, errStream bool) error {
	jobs := append(slices.Clone(r.Meta.PastJobs), r.Meta.JobID)
	for i, job := range jobs {
		fmt.Printf("==> job %s (%d of %d) <==\n", job, i+1, len(jobs))
		f, err := os.Open(r.Dir.Log(job, errStream))
		if errors.Is(err, os.ErrNotExist) {
			fmt.Printf("(no %s)\n", filepath.Base(r.Dir.Log(job, errStream)))
			continue
		}
		if err != nil {
			return err
		}
		_, err = io.Copy(os.Stdout, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
