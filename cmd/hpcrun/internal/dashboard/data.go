package dashboard

import (
	"fmt"
	"io"
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

// runCharts are the charts of one run's page.
type runCharts struct {
	Loss, Accuracy, LR, GradNorm, Tokens, StepTime, MFU, Memory Chart
	HasAccuracy, HasMFU                                         bool
}

// chartsOf builds a run's charts: the step series from the sampler, the
// evaluations from the curves of its summary.
func chartsOf(s metrics.Summary, c metrics.Curves, smp *sampler) runCharts {
	train, rc := smp.series(s)
	rc.Loss = Chart{ID: "loss", Title: "loss", XLabel: "step", YLabel: "loss", Series: []Series{
		train, thinned("eval", floats(c.EvalSteps), floats(c.EvalLoss)),
	}}
	acc := floats(c.Accuracy)
	for _, a := range acc {
		rc.HasAccuracy = rc.HasAccuracy || finite(a)
	}
	rc.Accuracy = Chart{ID: "accuracy", Title: "eval accuracy", XLabel: "step", YLabel: "accuracy",
		Series: []Series{thinned("accuracy", floats(c.EvalSteps), acc)}}
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
