package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/progress"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/urfave/cli/v2"
)

func watchCommand() *cli.Command {
	return &cli.Command{
		Name:      "watch",
		Usage:     "follow a running job with a progress bar",
		ArgsUsage: "<execid|prefix|jobid>",
		Description: "Shows steps done out of the total, the loss and the rate, until every rank has\n" +
			"written its end line (exit 1 if a rank failed) or you press Ctrl-C (the job goes on).",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "how often to read the metrics"},
		},
		Action: runWatch,
	}
}

func runWatch(c *cli.Context) error {
	if c.NArg() != 1 {
		return cli.Exit("usage: hpcrun watch <execid|prefix|jobid> [--interval 1s]", 2)
	}
	if c.Duration("interval") <= 0 {
		return cli.Exit("--interval must be positive, like 1s or 500ms", 2)
	}
	runs, err := runsDir(c)
	if err != nil {
		return err
	}
	r, err := findRef(runs, c.Args().First())
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return watchRun(ctx, c, r.Dir.Path())
}

func watchRun(ctx context.Context, c *cli.Context, dir string) error {
	w := c.App.Writer
	p := progress.New(w, dir, true)
	tick := time.NewTicker(c.Duration("interval"))
	defer tick.Stop()
	for {
		run, st, err := p.Update("")
		if err != nil {
			return err
		}
		if st.Done {
			s := p.End(run, st.Total)
			if s.Status == metrics.StatusFailed {
				return cli.Exit(fmt.Sprintf("%s failed: %s", s.ExecID, s.Error), 1)
			}
			return nil
		}
		if st.JobOver != "" {
			p.Close()
			return cli.Exit(fmt.Sprintf("%s: the job is over (%s) but %d of %d ranks wrote no end line: they were killed; see hpcrun logs %s",
				run.ExecID, st.JobOver, st.World-st.Ended, st.World, run.ExecID), 1)
		}
		select {
		case <-ctx.Done():
			p.Close()
			fmt.Fprintf(w, "stopped watching %s at step %d; the job goes on\n", run.ExecID, st.Step)
			return nil
		case <-tick.C:
		}
	}
}
