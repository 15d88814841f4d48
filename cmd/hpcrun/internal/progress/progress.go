// Package progress draws hpcrun watch's and submit --wait's progress bar
// of a run, from its metrics files (metrics.Follower, metrics.Progress).
package progress

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/schollz/progressbar/v3"
)

// Bar is the progress bar of a run, drawn from its metrics files as a
// metrics.Follower reads them: hpcrun watch and hpcrun submit --wait both
// show it. The total is the steps the run says it will take (from its run
// lines, so epoch-based runs get a bar too); a spinner until it is known.
type Bar struct {
	w       io.Writer
	f       *metrics.Follower
	bar     *progressbar.ProgressBar
	total   int
	visible bool
	closed  bool
}

// New is the bar of the run in dir, drawn on w when visible.
func New(w io.Writer, dir string, visible bool) *Bar {
	return &Bar{w: w, f: metrics.NewFollower(dir), visible: visible}
}

// Update reads what the ranks appended and redraws; prefix (the job's state
// for submit --wait) goes before the run's description.
func (p *Bar) Update(prefix string) (*metrics.Run, metrics.Progress, error) {
	run, err := p.f.Poll()
	if err != nil {
		return nil, metrics.Progress{}, err
	}
	st := metrics.ProgressOf(run)
	if p.bar == nil || (st.Total > 0 && st.Total != p.total) {
		if p.bar != nil {
			p.bar.Exit()
		}
		p.total = st.Total
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
	p.bar.Describe(prefix + st.Describe(run.ExecID))
	p.bar.Set(st.Step)
	return run, st, nil
}

// StopAt ends the bar of a run that stopped before its last step with the
// bar at step, drawn here: the throttled bar may not have drawn its last
// update, and must not show a full bar.
func (p *Bar) StopAt(step int) {
	if p.bar == nil || p.total <= 0 || !p.visible {
		p.Close()
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

// Finish ends the bar of a run that did all its steps: full, described
// by desc.
func (p *Bar) Finish(desc string) {
	p.bar.Describe(desc)
	p.bar.Finish()
	p.closed = true
	fmt.Fprintln(p.w)
}

// End ends the bar of a run whose every rank ended, total its steps (0:
// not known), and writes a line saying how it ended; the end is told with
// metrics' own figures (metrics.Summarize), and the bar is full only for a
// run that did all its steps. It returns the summary.
func (p *Bar) End(run *metrics.Run, total int) metrics.Summary {
	s, _ := metrics.Summarize(run)
	desc := fmt.Sprintf("%s  loss %s  %s samples/s", s.ExecID, s.LastLoss.Text("%.4f"), s.SamplesPerS.Text("%.1f"))
	if s.Status == metrics.StatusCompleted && (total <= 0 || s.Step >= total) {
		p.Finish(desc)
	} else {
		p.Describe(desc)
		p.StopAt(s.Step)
	}
	at := fmt.Sprint(s.Step)
	if total > 0 {
		at += fmt.Sprintf(" of %d", total)
	}
	fmt.Fprintf(p.w, "%s %s at step %s: loss %s, %s samples/s, wall %s\n", s.ExecID, s.Status, at, s.LastLoss.Text("%.4f"), s.SamplesPerS.Text("%.1f"), s.WallS.Text("%.1f s"))
	return s
}

// Describe sets the bar's words.
func (p *Bar) Describe(desc string) { p.bar.Describe(desc) }

// Total is the steps the bar counts to; 0 while not known (a spinner).
func (p *Bar) Total() int { return p.total }

// Close ends the bar's line, once.
func (p *Bar) Close() {
	if p.closed || p.bar == nil {
		return
	}
	p.closed = true
	p.bar.Exit()
	if p.visible {
		fmt.Fprintln(p.w)
	}
}
