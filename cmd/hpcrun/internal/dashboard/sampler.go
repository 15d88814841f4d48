package dashboard

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// sampler keeps the per-step series of a run's charts at sampled steps
// only (1, 1+stride, 1+2*stride, ...), the stride doubling whenever more
// than maxPoints steps are kept: its memory is a few values per rank per
// point, whatever the number of steps. It reads each rank file from where
// it stopped, so a live page pays only for what was appended; a line
// without its newline yet waits for the next read.
type sampler struct {
	dir    rundir.Dir
	files  map[string]*rankStream
	stride int
	points map[int]map[int]rankVal // sampled step -> rank -> its values
	info   *metrics.RunInfo        // the first run line seen
}

// rankStream is how far the sampler has read one rank file.
type rankStream struct {
	rank   int
	off    int64
	info   *metrics.RunInfo
	last   int     // last step read
	lastV  rankVal // its values
	failed error
}

// rankVal is one rank's step, as the charts need it.
type rankVal struct {
	loss, lr, gradNorm, stepS, commS float64
	tokens, mem                      int64
}

func newSampler(d rundir.Dir) *sampler {
	return &sampler{dir: d, files: map[string]*rankStream{}, stride: 1, points: map[int]map[int]rankVal{}}
}

// read reads what the rank files gained since the last read.
func (s *sampler) read() error {
	paths, err := s.dir.MetricsFiles()
	if err != nil {
		return err
	}
	for _, p := range paths {
		rs := s.files[p]
		if rs == nil {
			rs = &rankStream{rank: rankNumber(p)}
			if rs.rank < 0 {
				continue
			}
			s.files[p] = rs
		}
		rs.failed = s.readFile(p, rs)
	}
	return nil
}

// readFile reads one rank file from rs.off to its last whole line.
func (s *sampler) readFile(path string, rs *rankStream) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() < rs.off {
		// Truncated or replaced: forget this rank and read it again.
		s.forget(rs.rank, 0)
		*rs = rankStream{rank: rs.rank}
	}
	if _, err := f.Seek(rs.off, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReaderSize(f, 256<<10)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer is no step line: skip it.
			n := int64(len(line))
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				n += int64(len(line))
			}
			if err != nil {
				return nil // not whole yet
			}
			rs.off += n
			continue
		}
		if err != nil {
			return nil // EOF: a torn last line waits for the next read
		}
		rs.off += int64(len(line))
		l, perr := metrics.ParseLine(bytes.TrimSpace(line))
		switch {
		case perr != nil:
		case l.Step != nil:
			s.add(rs, l.Step)
		case l.Run != nil:
			rs.info = l.Run
			if s.info == nil {
				s.info = l.Run
			}
		}
	}
}

// add takes one step of one rank.
func (s *sampler) add(rs *rankStream, st *metrics.Step) {
	if st.Step <= rs.last {
		// A resume writes steps again: the later ones replace the earlier,
		// and the steps after them are gone (as metrics' readers do).
		s.forget(rs.rank, st.Step)
	}
	v := rankVal{loss: st.Loss, lr: st.LR, gradNorm: st.GradNorm, stepS: st.StepS, commS: st.CommS, tokens: st.Tokens, mem: st.MemBytes}
	rs.last, rs.lastV = st.Step, v
	if (st.Step-1)%s.stride != 0 {
		return
	}
	pt := s.points[st.Step]
	if pt == nil {
		pt = map[int]rankVal{}
		s.points[st.Step] = pt
	}
	pt[rs.rank] = v
	if len(s.points) > maxPoints {
		s.stride *= 2
		for step := range s.points {
			if (step-1)%s.stride != 0 {
				delete(s.points, step)
			}
		}
	}
}

// forget drops a rank's values at steps from on.
func (s *sampler) forget(rank, from int) {
	for step, pt := range s.points {
		if step >= from {
			delete(pt, rank)
			if len(pt) == 0 {
				delete(s.points, step)
			}
		}
	}
}

// sampledStep is one step every rank has finished, across the ranks.
type sampledStep struct {
	step  int
	ranks []int // in rank order
	vals  []rankVal
}

// steps are the sampled steps every rank has finished, in step order, with
// the newest such step when every rank has reached it.
func (s *sampler) steps() []sampledStep {
	var ranks []int
	for _, rs := range s.files {
		ranks = append(ranks, rs.rank)
	}
	slices.Sort(ranks)
	var out []sampledStep
	collect := func(step int, get func(rank int) (rankVal, bool)) {
		ss := sampledStep{step: step, ranks: ranks, vals: make([]rankVal, len(ranks))}
		for i, r := range ranks {
			v, ok := get(r)
			if !ok {
				return
			}
			ss.vals[i] = v
		}
		out = append(out, ss)
	}
	keys := make([]int, 0, len(s.points))
	for step := range s.points {
		keys = append(keys, step)
	}
	slices.Sort(keys)
	for _, step := range keys {
		pt := s.points[step]
		collect(step, func(r int) (rankVal, bool) { v, ok := pt[r]; return v, ok })
	}
	// The newest step, when every rank's last step is it.
	last, same := 0, len(s.files) > 0
	for _, rs := range s.files {
		if last == 0 {
			last = rs.last
		}
		same = same && rs.last == last && last > 0
	}
	if same && (len(out) == 0 || out[len(out)-1].step < last) {
		byRank := map[int]rankVal{}
		for _, rs := range s.files {
			byRank[rs.rank] = rs.lastV
		}
		collect(last, func(r int) (rankVal, bool) { v, ok := byRank[r]; return v, ok })
	}
	return out
}

// countsReplica reports whether a rank counts its data-parallel replica
// (metrics.CountsReplica), from its run line when one was read.
func (s *sampler) countsReplica(rank int, c metrics.RunConfig) bool {
	for _, rs := range s.files {
		if rs.rank == rank && rs.info != nil {
			return metrics.CountsReplica(rank, rs.info, c)
		}
	}
	return metrics.CountsReplica(rank, nil, c)
}

// series turns the sampled steps into the run's step charts.
func (s *sampler) series(sum metrics.Summary) (loss Series, rc runCharts) {
	steps := s.steps()
	n := len(steps)
	x, ls, lr, gn := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	tok, stepS, commS, mfu := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	var ranks []int
	if n > 0 {
		ranks = steps[0].ranks
	}
	mem := make([][]float64, len(ranks))
	world := max(sum.Config.NTasks, len(ranks))
	for i, st := range steps {
		x[i] = float64(st.step)
		// The summary's join of one step (metrics.StepAcross).
		js := metrics.StepAcross{Step: st.step}
		for j, r := range st.ranks {
			v := st.vals[j]
			js.Add(metrics.Step{Step: st.step, Loss: v.loss, StepS: v.stepS, CommS: v.commS, Tokens: v.tokens}, s.countsReplica(r, sum.Config))
			mem[j] = append(mem[j], float64(v.mem)/(1<<20))
		}
		ls[i] = js.Loss()
		lr[i], gn[i] = st.vals[0].lr, st.vals[0].gradNorm
		tok[i] = float64(js.Tokens) / js.MaxStepS
		stepS[i], commS[i] = js.MaxStepS, js.CommS()
		mfu[i] = math.NaN()
		// Over the summary's peak (the plan's), as the summary's MFU.
		if in := s.info; in != nil && in.FlopsPerToken > 0 && sum.PeakFlops > 0 {
			mfu[i] = metrics.MFU(in.FlopsPerToken, tok[i], float64(sum.PeakFlops), world)
			rc.HasMFU = true
		}
	}
	rc.LR = Chart{ID: "lr", Title: "learning rate", XLabel: "step", YLabel: "lr", Series: []Series{Series{Name: "lr", X: x, Y: lr}}}
	rc.GradNorm = Chart{ID: "grad_norm", Title: "gradient norm (before clipping)", XLabel: "step", YLabel: "norm",
		Series: []Series{Series{Name: "grad norm", X: x, Y: gn}}}
	rc.Tokens = Chart{ID: "tokens_per_s", Title: "throughput", XLabel: "step", YLabel: "tokens/s",
		Series: []Series{Series{Name: "tokens/s", X: x, Y: tok}}, Note: "mean " + num(sum.TokensPerS) + " tokens/s"}
	rc.StepTime = Chart{ID: "step_time", Title: "step time", XLabel: "step", YLabel: "seconds",
		Series: []Series{{Name: "step (slowest rank)", X: x, Y: stepS}, {Name: "comm (mean over ranks)", X: x, Y: commS}},
		Note:   "comm " + pct(sum.CommShare) + " of step time"}
	note := "mean " + pct(sum.MFU)
	if sum.Recomputes() {
		note += "; HFU " + pct(sum.HFU) + " (recompute " + sum.Config.Recompute + "'s forward counted)"
	}
	rc.MFU = Chart{ID: "mfu", Title: "model FLOPs utilisation", XLabel: "step", YLabel: "MFU",
		Series: []Series{Series{Name: "MFU", X: x, Y: mfu}}, Note: note}
	var memSeries []Series
	for j, r := range ranks {
		memSeries = append(memSeries, Series{Name: fmt.Sprintf("rank %d", r), X: x, Y: mem[j]})
	}
	rc.Memory = Chart{ID: "memory", Title: "memory per rank (engine)", XLabel: "step", YLabel: "MiB", Series: memSeries}
	return Series{Name: "train", X: x, Y: ls}, rc
}

// rankNumber is the rank of a file named rank-NNNNN.jsonl, -1 for another
// name.
func rankNumber(path string) int {
	var n int
	if _, err := fmt.Sscanf(filepath.Base(path), "rank-%d.jsonl", &n); err != nil || n < 0 {
		return -1
	}
	return n
}
