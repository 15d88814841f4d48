package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/schollz/progressbar/v3"
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
	dir, err := resolveRunDir(metricsRunsDir(c), c.Args().First())
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return watchRun(ctx, c, dir)
}

func watchRun(ctx context.Context, c *cli.Context, dir string) error {
	w := c.App.Writer
	f := metrics.NewFollower(dir)
	var bar *progressbar.ProgressBar
	total := 0
	tick := time.NewTicker(c.Duration("interval"))
	defer tick.Stop()
	for {
		run, err := f.Poll()
		if err != nil {
			return err
		}
		st := watchStateOf(run)
		if bar == nil || (st.total > 0 && st.total != total) {
			if bar != nil {
				bar.Exit()
			}
			total = st.total
			max := total
			if max <= 0 {
				max = -1 // a spinner: the total is not known yet
			}
			bar = progressbar.NewOptions(max, progressbar.OptionSetWriter(w),
				progressbar.OptionSetDescription(run.ExecID), progressbar.OptionShowCount(),
				progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionSetRenderBlankState(true))
		}
		bar.Describe(st.describe(run.ExecID))
		bar.Set(st.step)
		if st.done {
			bar.Finish()
			fmt.Fprintln(w)
			s, _ := metrics.Summarize(run)
			fmt.Fprintf(w, "%s %s at step %d: loss %s, wall %s\n", s.ExecID, s.Status, s.Step, fmtFloat(s.LastLoss, "%.4f"), fmtFloat(s.WallS, "%.1f s"))
			if s.Status == metrics.StatusFailed {
				return cli.Exit(fmt.Sprintf("%s failed: %s", s.ExecID, s.Error), 1)
			}
			return nil
		}
		if st.jobOver != "" {
			bar.Exit()
			fmt.Fprintln(w)
			return cli.Exit(fmt.Sprintf("%s: the job is over (%s) but %d of %d ranks wrote no end line: they were killed; see hpcrun logs %s",
				run.ExecID, st.jobOver, st.world-st.ended, st.world, run.ExecID), 1)
		}
		select {
		case <-ctx.Done():
			bar.Exit()
			fmt.Fprintf(w, "\nstopped watching %s at step %d; the job goes on\n", run.ExecID, st.step)
			return nil
		case <-tick.C:
		}
	}
}

// watchState is what the bar shows, computed from the ranks' last lines only.
type watchState struct {
	step, total  int
	world, ended int
	loss, rate   float64 // rate in samples/s of the job, from the last step
	done         bool
	jobOver      string // the scheduler's final state when meta.json has one
}

func watchStateOf(run *metrics.Run) watchState {
	st := watchState{loss: math.NaN(), rate: math.NaN()}
	var cfg struct {
		Steps  int `json:"steps"`
		NTasks int `json:"ntasks"`
		TP     int `json:"tp"`
	}
	if len(run.TrainConfig) > 0 {
		_ = json.Unmarshal(run.TrainConfig, &cfg)
	}
	st.total, st.world = cfg.Steps, cfg.NTasks
	step := -1
	var lossSum, samples float64
	var lossN int
	var slowest float64
	for _, r := range run.Ranks {
		if r.Info != nil {
			if st.total <= 0 {
				st.total = r.Info.TotalSteps
			}
			if r.Info.World > 0 {
				st.world = r.Info.World
			}
		}
		if r.End != nil {
			st.ended++
		}
		if len(r.Steps) == 0 {
			step = 0
			continue
		}
		last := r.Steps[len(r.Steps)-1]
		if step < 0 || last.Step < step {
			step = last.Step
		}
		slowest = max(slowest, last.StepS)
		tpRank := r.Rank % max(cfg.TP, 1)
		if r.Info != nil {
			tpRank = r.Info.TPRank
		}
		if tpRank == 0 {
			lossSum += last.Loss
			lossN++
			samples += float64(last.Samples)
		}
	}
	st.step = max(step, 0)
	if lossN > 0 {
		st.loss = lossSum / float64(lossN)
	}
	if slowest > 0 {
		st.rate = samples / slowest
	}
	if st.world <= 0 {
		st.world = len(run.Ranks)
	}
	st.done = st.world > 0 && st.ended >= st.world
	if final, ok := run.Meta.Raw["final"].(map[string]any); ok && !st.done {
		if state, _ := final["state"].(string); state != "" {
			st.jobOver = state
		} else {
			st.jobOver = "ended"
		}
	}
	return st
}

func (st watchState) describe(execid string) string {
	if st.step == 0 && math.IsNaN(st.loss) {
		return execid + "  waiting for the first step"
	}
	return fmt.Sprintf("%s  loss %s  %s samples/s", execid, fmtFloat(metrics.Float(st.loss), "%.4f"), fmtFloat(metrics.Float(st.rate), "%.1f"))
}

func fmtFloat(f metrics.Float, format string) string {
	if !f.Known() {
		return "-"
	}
	return fmt.Sprintf(format, float64(f))
}
