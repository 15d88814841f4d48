package dashboard

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// summaries caches each run's metrics summary (no curves) under the sizes
// and modification times of its files: a finished run is read once, a
// running one again when a rank has written. It holds one small Summary
// per run, whatever the number of steps.
type summaries struct {
	mu   sync.Mutex
	byID map[string]cached
}

type cached struct {
	key string
	sum metrics.Summary
	err error
}

// fileKey is what changes when any file the summary reads changes.
func fileKey(d rundir.Dir) string {
	var b strings.Builder
	for _, p := range []string{d.Meta(), d.Config()} {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d.%d;", st.Size(), st.ModTime().UnixNano())
		}
	}
	files, _ := d.MetricsFiles()
	for _, p := range files {
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s:%d.%d;", filepath.Base(p), st.Size(), st.ModTime().UnixNano())
		}
	}
	return b.String()
}

// get returns the summaries of the runs, reading the stale ones on every
// core.
func (c *summaries) get(dirs []rundir.Dir) []cached {
	out := make([]cached, len(dirs))
	keys := make([]string, len(dirs))
	var stale []int
	c.mu.Lock()
	for i, d := range dirs {
		keys[i] = fileKey(d)
		if e, ok := c.byID[d.ExecID()]; ok && e.key == keys[i] {
			out[i] = e
		} else {
			stale = append(stale, i)
		}
	}
	c.mu.Unlock()
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(stale)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				s, _, err := metrics.ReadSummary(dirs[i].Path(), metrics.NoCurves)
				out[i] = cached{key: keys[i], sum: s, err: err}
			}
		}()
	}
	for _, i := range stale {
		work <- i
	}
	close(work)
	wg.Wait()
	c.mu.Lock()
	for _, i := range stale {
		c.byID[dirs[i].ExecID()] = out[i]
	}
	c.mu.Unlock()
	return out
}

// runCharts are the series of one run's page, from a run read whole.
type runCharts struct {
	Loss, Accuracy, LR, GradNorm, Tokens, StepTime, MFU, Memory Chart
	HasAccuracy, HasMFU                                         bool
}

// stepAgg is one step across the ranks that reported it.
type stepAgg struct {
	step          int
	ranks         int
	maxS, sumComm float64
	tokens        int64
}

// joinSteps lines the ranks' steps up by step number (each rank's steps
// are ascending, a resume's replacements already applied) and keeps the
// steps every rank finished, as metrics' summary does.
func joinSteps(run *metrics.Run, tp int) []stepAgg {
	idx := make([]int, len(run.Ranks))
	var out []stepAgg
	for {
		step, any := 0, false
		for i, r := range run.Ranks {
			if idx[i] < len(r.Steps) && (!any || r.Steps[idx[i]].Step < step) {
				step, any = r.Steps[idx[i]].Step, true
			}
		}
		if !any {
			return out
		}
		a := stepAgg{step: step}
		for i, r := range run.Ranks {
			if idx[i] >= len(r.Steps) || r.Steps[idx[i]].Step != step {
				continue
			}
			s := r.Steps[idx[i]]
			idx[i]++
			a.ranks++
			a.maxS = math.Max(a.maxS, s.StepS)
			a.sumComm += s.CommS
			tpRank := r.Rank % max(tp, 1)
			if r.Info != nil {
				tpRank = r.Info.TPRank
			}
			if tpRank == 0 {
				a.tokens += s.Tokens
			}
		}
		if a.ranks == len(run.Ranks) {
			out = append(out, a)
		}
	}
}

// chartsOf builds the charts of one run.
func chartsOf(run *metrics.Run, s metrics.Summary, c metrics.Curves) runCharts {
	var rc runCharts
	// Loss: the job's training loss and the evaluations.
	rc.Loss = Chart{ID: "loss", Title: "loss", XLabel: "step", YLabel: "loss", Series: []Series{
		thinned("train", floats(c.Steps), floats(c.Loss)),
		thinned("eval", floats(c.EvalSteps), floats(c.EvalLoss)),
	}}
	acc := floats(c.Accuracy)
	for _, a := range acc {
		rc.HasAccuracy = rc.HasAccuracy || finite(a)
	}
	rc.Accuracy = Chart{ID: "accuracy", Title: "eval accuracy", XLabel: "step", YLabel: "accuracy",
		Series: []Series{thinned("accuracy", floats(c.EvalSteps), acc)}}

	// lr and grad norm are the same on every rank: rank 0's.
	var lrX, lr, gn []float64
	if len(run.Ranks) > 0 {
		for _, st := range run.Ranks[0].Steps {
			lrX, lr, gn = append(lrX, float64(st.Step)), append(lr, st.LR), append(gn, st.GradNorm)
		}
	}
	rc.LR = Chart{ID: "lr", Title: "learning rate", XLabel: "step", YLabel: "lr", Series: []Series{thinned("lr", lrX, lr)}}
	rc.GradNorm = Chart{ID: "grad_norm", Title: "gradient norm (before clipping)", XLabel: "step", YLabel: "norm",
		Series: []Series{thinned("grad norm", lrX, gn)}}

	var info *metrics.RunInfo
	for _, r := range run.Ranks {
		if r.Info != nil {
			info = r.Info
			break
		}
	}
	world := max(s.Config.NTasks, len(run.Ranks))
	steps := joinSteps(run, s.Config.TP)
	x := make([]float64, len(steps))
	tok, stepS, commS, mfu := make([]float64, len(steps)), make([]float64, len(steps)), make([]float64, len(steps)), make([]float64, len(steps))
	for i, a := range steps {
		x[i] = float64(a.step)
		tok[i] = float64(a.tokens) / a.maxS
		stepS[i] = a.maxS
		commS[i] = a.sumComm / float64(a.ranks)
		mfu[i] = math.NaN()
		if info != nil && info.FlopsPerToken > 0 && info.PeakFlops > 0 {
			mfu[i] = info.FlopsPerToken * tok[i] / (info.PeakFlops * float64(world))
			rc.HasMFU = true
		}
	}
	rc.Tokens = Chart{ID: "tokens_per_s", Title: "throughput", XLabel: "step", YLabel: "tokens/s",
		Series: []Series{thinned("tokens/s", x, tok)}, Note: "mean " + num(s.TokensPerS) + " tokens/s"}
	rc.StepTime = Chart{ID: "step_time", Title: "step time", XLabel: "step", YLabel: "seconds",
		Series: []Series{thinned("step (slowest rank)", x, stepS), thinned("comm (mean over ranks)", x, commS)},
		Note:   "comm " + pct(s.CommShare) + " of step time"}
	rc.MFU = Chart{ID: "mfu", Title: "model FLOPs utilisation", XLabel: "step", YLabel: "MFU",
		Series: []Series{thinned("MFU", x, mfu)}, Note: "mean " + pct(s.MFU)}

	var mem []Series
	for _, r := range run.Ranks {
		var mx, my []float64
		for _, st := range r.Steps {
			mx, my = append(mx, float64(st.Step)), append(my, float64(st.MemBytes)/(1<<20))
		}
		mem = append(mem, thinned(fmt.Sprintf("rank %d", r.Rank), mx, my))
	}
	rc.Memory = Chart{ID: "memory", Title: "memory per rank (engine)", XLabel: "step", YLabel: "MiB", Series: mem}
	return rc
}

func thinned(name string, x, y []float64) Series {
	x, y = thin(x, y)
	return Series{Name: name, X: x, Y: y}
}

func floats(f []metrics.Float) []float64 {
	out := make([]float64, len(f))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

// tailLines is the last n lines of a file, read from at most its last
// 64 KiB.
func tailLines(path string, n int) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", false
	}
	off := max(st.Size()-64<<10, 0)
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return "", false
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // cut mid-line
	}
	return strings.Join(lines[max(len(lines)-n, 0):], "\n"), true
}

// readSmall is a text file of at most 64 KiB ("" when missing).
func readSmall(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	return string(b)
}
