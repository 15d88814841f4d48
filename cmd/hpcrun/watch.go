package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strings"
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
	p := newRunProgress(w, dir, true)
	tick := time.NewTicker(c.Duration("interval"))
	defer tick.Stop()
	for {
		run, st, err := p.update("")
		if err != nil {
			return err
		}
		if st.done {
			// The end is told with metrics' own figures; the bar is full
			// only for a run that did all its steps.
			s, _ := metrics.Summarize(run)
			p.bar.Describe(fmt.Sprintf("%s  loss %s  %s samples/s", s.ExecID, fmtFloat(s.LastLoss, "%.4f"), fmtFloat(s.SamplesPerS, "%.1f")))
			if s.Status == metrics.StatusCompleted && (st.total <= 0 || s.Step >= st.total) {
				p.bar.Finish()
				fmt.Fprintln(w)
			} else {
				p.stopAt(s.Step)
			}
			at := fmt.Sprint(s.Step)
			if st.total > 0 {
				at += fmt.Sprintf(" of %d", st.total)
			}
			fmt.Fprintf(w, "%s %s at step %s: loss %s, %s samples/s, wall %s\n", s.ExecID, s.Status, at, fmtFloat(s.LastLoss, "%.4f"), fmtFloat(s.SamplesPerS, "%.1f"), fmtFloat(s.WallS, "%.1f s"))
			if s.Status == metrics.StatusFailed {
				return cli.Exit(fmt.Sprintf("%s failed: %s", s.ExecID, s.Error), 1)
			}
			return nil
		}
		if st.jobOver != "" {
			p.close()
			return cli.Exit(fmt.Sprintf("%s: the job is over (%s) but %d of %d ranks wrote no end line: they were killed; see hpcrun logs %s",
				run.ExecID, st.jobOver, st.world-st.ended, st.world, run.ExecID), 1)
		}
		select {
		case <-ctx.Done():
			p.close()
			fmt.Fprintf(w, "stopped watching %s at step %d; the job goes on\n", run.ExecID, st.step)
			return nil
		case <-tick.C:
		}
	}
}

// runProgress is the progress bar of a run, drawn from its metrics files as
// a metrics.Follower reads them: hpcrun watch and hpcrun submit --wait both
// show it. The total is the steps the run says it will take (from its run
// lines, so epoch-based runs get a bar too); a spinner until it is known.
type runProgress struct {
	w       io.Writer
	f       *metrics.Follower
	bar     *progressbar.ProgressBar
	total   int
	visible bool
	closed  bool
}

func newRunProgress(w io.Writer, dir string, visible bool) *runProgress {
	return &runProgress{w: w, f: metrics.NewFollower(dir), visible: visible}
}

// update reads what the ranks appended and redraws; prefix (the job's state
// for submit --wait) goes before the run's description.
func (p *runProgress) update(prefix string) (*metrics.Run, watchState, error) {
	run, err := p.f.Poll()
	if err != nil {
		return nil, watchState{}, err
	}
	st := watchStateOf(run)
	if p.bar == nil || (st.total > 0 && st.total != p.total) {
		if p.bar != nil {
			p.bar.Exit()
		}
		p.total = st.total
		max := p.total
		if max <= 0 {
			max = -1 // a spinner: the total is not known yet
		}
		p.bar = progressbar.NewOptions(max, progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetVisibility(p.visible),
			progressbar.OptionSetDescription(run.ExecID), progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true), progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionSetRenderBlankState(true))
	}
	p.bar.Describe(prefix + st.describe(run.ExecID))
	p.bar.Set(st.step)
	return run, st, nil
}

// stopAt ends the bar of a run that stopped before its last step with the
// bar at step, drawn here: the throttled bar may not have drawn its last
// update, and must not show a full bar.
func (p *runProgress) stopAt(step int) {
	if p.bar == nil || p.total <= 0 || !p.visible {
		p.close()
		return
	}
	desc := p.bar.State().Description
	p.bar.Clear()
	p.bar.Exit()
	p.closed = true
	const width = 30
	done := min(width, width*step/p.total)
	fmt.Fprintf(p.w, "\r%s %3d%% |%s%s| (%d/%d)\n", desc, 100*step/p.total, strings.Repeat("█", done), strings.Repeat(" ", width-done), step, p.total)
}

// close ends the bar's line, once.
func (p *runProgress) close() {
	if p.closed || p.bar == nil {
		return
	}
	p.closed = true
	p.bar.Exit()
	if p.visible {
		fmt.Fprintln(p.w)
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
		// Each data-parallel replica once: tp_rank 0 of the first stage.
		tpRank, ppRank := r.Rank%max(cfg.TP, 1), 0
		if r.Info != nil {
			tpRank, ppRank = r.Info.TPRank, r.Info.PPRank
		}
		if tpRank == 0 && ppRank == 0 {
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
