package failure

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/metrics"
)

// How much of a file Gather reads: the end lines are in a rank file's last
// few KiB; a Go runtime's fatal error is at the head of its stderr, before
// the stacks, and slurmstepd's and srun's verdicts at the tail.
const (
	rankTail = 8 << 10
	logHead  = 16 << 10
	logTail  = 32 << 10
)

// Settle reconciles s, the ranks' account of the run in d, with its job
// (metrics.Summary.Settle) and names its failure: the job's state comes
// from the final state cached in meta.json, else from its executor unless
// every rank completed. check says the job ran a parallel check.
func Settle(ctx context.Context, d rundir.Dir, s *metrics.Summary) Verdict {
	m, err := slurm.ReadMeta(d)
	if err != nil {
		return Of(d, slurm.JobInfo{})
	}
	var j slurm.JobInfo
	switch {
	case m.Final != nil:
		j = *m.Final
	case s.Status != metrics.StatusCompleted:
		j, _ = (slurm.Run{Dir: d, Meta: m}).Status(ctx)
	}
	js := metrics.JobState{State: string(j.State), Over: over(j, m), Reason: j.Reason,
		Check: len(m.Spec.Args) > 0 && m.Spec.Args[0] == "check", ExecID: m.ExecID, Restarts: j.Restarts}
	if cfg, err := trainconfig.ReadConfigFile(d.Config()); err == nil {
		js.MaxRestarts = cfg.Requeues()
	}
	s.Settle(js)
	return Of(d, j)
}

// over reports whether j, the job of the run of meta m, is known to be
// over: a job nothing remembers is, unless it is a run of hpcrun run on
// another machine, which this one cannot see.
func over(j slurm.JobInfo, m *slurm.Meta) bool {
	if j.State == slurm.Unknown {
		return m.Executor != "run" || m.Host == slurm.Host()
	}
	return j.State.Done()
}

// Of runs the evidence of the run in d, whose job the scheduler last
// described as job, through Classify. It reads a bounded part of each file,
// so it costs the same for a run of ten steps or a million.
func Of(d rundir.Dir, job slurm.JobInfo) Verdict {
	st := job.State
	if st == slurm.Completed || (st != "" && st != slurm.Unknown && !st.Done()) {
		return Verdict{} // nothing to read: not failed, or not over
	}
	return Classify(Gather(d, job))
}

// Gather reads the evidence of the run in d: the end lines of its rank
// files and the head and tail of its job's stderr (stdout when there is no
// stderr file).
func Gather(d rundir.Dir, job slurm.JobInfo) Evidence {
	e := Evidence{Job: job}
	files, _ := d.MetricsFiles()
	var failed, stopped string
	completed := 0
	for _, p := range files {
		end := lastEnd(p)
		if end == nil {
			if job.State.Done() && rankNumber(p) >= 0 {
				e.NoEnd = append(e.NoEnd, rankNumber(p))
			}
			continue
		}
		rank := fmt.Sprintf("rank %d: ", rankNumber(p))
		switch end.Status {
		case metrics.StatusFailed:
			if failed == "" {
				failed = rank + end.Error
			}
		case metrics.StatusInterrupted:
			if stopped == "" {
				stopped = rank + end.Error
			}
		case metrics.StatusCompleted:
			completed++
		}
	}
	switch {
	case failed != "":
		e.RunStatus, e.RunError = metrics.StatusFailed, failed
	case stopped != "":
		e.RunStatus, e.RunError = metrics.StatusInterrupted, stopped
	case completed > 0 && completed == len(files):
		e.RunStatus = metrics.StatusCompleted
	}
	if job.ID != "" {
		log := d.Log(job.ID, true)
		if _, err := os.Stat(log); err != nil {
			log = d.Log(job.ID, false)
		}
		e.Log = headTail(log, logHead, logTail)
	}
	return e
}

// lastEnd is the end line among the last lines of a rank file, nil when
// the rank has not written one.
func lastEnd(path string) *metrics.End {
	b := tail(path, rankTail)
	for len(b) > 0 {
		b = bytes.TrimRight(b, "\n")
		i := bytes.LastIndexByte(b, '\n')
		line := b[i+1:]
		b = b[:max(i, 0)]
		if l, err := metrics.ParseLine(line); err == nil && l.End != nil {
			return l.End
		}
		if i < 0 {
			break
		}
	}
	return nil
}

// rankNumber reads the rank from a file named rank-NNNNN.jsonl.
func rankNumber(path string) int {
	var n int
	if _, err := fmt.Sscanf(filepath.Base(path), "rank-%d.jsonl", &n); err != nil {
		return -1
	}
	return n
}

// tail is the last n bytes of a file (all of a shorter one).
func tail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(b, off)
	return b[:k]
}

// headTail is the first head and last tail bytes of a file, whole when it
// is shorter than both together.
func headTail(path string, head, tailN int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	if st.Size() <= head+tailN {
		b, _ := io.ReadAll(f)
		return string(b)
	}
	h := make([]byte, head)
	k, _ := f.ReadAt(h, 0)
	return string(h[:k]) + "\n" + string(tail(path, tailN))
}

// RunState is the state of the run in d, summed up as s, in a word or two
// (sweep show's STATE): done, running, pending, or how it failed (OOM,
// time limit, failed (class)). logsJob, when set, is the job id its logs
// are named by (an array task's <A>_<a>).
func RunState(ctx context.Context, d rundir.Dir, logsJob string, s metrics.Summary) string {
	m, err := slurm.ReadMeta(d)
	if err != nil {
		return "no meta.json"
	}
	j, err := (slurm.Run{Dir: d, Meta: m}).Status(ctx)
	if err != nil {
		return "unknown (" + strings.Join(strings.Fields(err.Error()), " ") + ")"
	}
	if logsJob != "" {
		j.ID = logsJob
	}
	switch v := Of(d, j); v.Class {
	case None:
	case OutOfMemory:
		return "OOM"
	case TimeLimit:
		return "time limit"
	default:
		return "failed (" + string(v.Class) + ")"
	}
	switch {
	case j.State == slurm.Completed || s.Status == metrics.StatusCompleted:
		return "done"
	case j.State.Done():
		return strings.ToLower(string(j.State))
	case s.Status == "running" || j.State == "RUNNING":
		return "running"
	}
	return "pending"
}
