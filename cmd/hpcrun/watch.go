package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/progress"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
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
	return watchRun(ctx, c, r.Dir)
}

// jobAskEvery is how often watch asks the executor for the job's state:
// a job whose ranks were killed ends without their end lines, and a job
// requeued by the time-limit signal goes on after them.
const jobAskEvery = 2 * time.Second

func watchRun(ctx context.Context, c *cli.Context, dir rundir.Dir) error {
	w := c.App.Writer
	p := progress.New(w, dir.Path(), true)
	tick := time.NewTicker(c.Duration("interval"))
	defer tick.Stop()
	var job slurm.JobInfo
	var asked time.Time
	for {
		if time.Since(asked) >= jobAskEvery {
			// Status caches the job's end in meta.json, which the
			// metrics reader's Progress reads as JobOver.
			if m, err := slurm.ReadMeta(dir); err == nil {
				if j, err := (slurm.Run{Dir: dir, Meta: m}).Status(ctx); err == nil {
					job = j
				}
			}
			asked = time.Now()
		}
		run, st, err := p.Update("")
		if err != nil {
			return err
		}
		if st.Done || st.JobOver != "" {
			s, _ := metrics.Summarize(run)
			state, over := string(job.State), job.State.Done()
			if st.JobOver != "" {
				state, over = st.JobOver, true
			}
			s.Settle(metrics.JobState{State: state, Over: over, ExecID: run.ExecID})
			switch {
			case s.Status == metrics.StatusRequeued:
				p.Describe(fmt.Sprintf("%s  requeued (%s)", run.ExecID, s.Error))
			case st.Done:
				s := p.End(run, st.Total)
				if s.Status == metrics.StatusFailed {
					return cli.Exit(fmt.Sprintf("%s failed: %s", s.ExecID, s.Error), 1)
				}
				// Ranks stopped by slurmd after srun was killed record a
				// stop on request: the job's log says what happened.
				if v := failure.Of(dir, jobEnd(ctx, dir, job)); v.Class == failure.Killed {
					return cli.Exit(fmt.Sprintf("%s was killed at step %d: %s", s.ExecID, s.Step, v.Why), 1)
				}
				return nil
			default:
				p.StopAt(st.Step)
				return cli.Exit(fmt.Sprintf("%s %s at step %d: %s; see hpcrun logs --err %s", run.ExecID, s.Status, st.Step, s.Error, run.ExecID), 1)
			}
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

// jobEnd is the state of the job of the run in dir once its ranks have
// ended: the scheduler may take a few seconds to record the job's end.
// last is the watch's last answer; without one (the scheduler never
// answered: unreachable, or a run from another cluster) there is nothing
// to wait for, and each failed question costs seconds.
func jobEnd(ctx context.Context, dir rundir.Dir, last slurm.JobInfo) slurm.JobInfo {
	if last.State == "" {
		return last
	}
	for deadline := time.Now().Add(10 * time.Second); !last.State.Done() && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		m, err := slurm.ReadMeta(dir)
		if err != nil {
			break
		}
		j, err := (slurm.Run{Dir: dir, Meta: m}).Status(ctx)
		if err != nil {
			break
		}
		last = j
	}
	return last
}
