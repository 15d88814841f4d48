package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// RankFile is the metrics file of one rank inside a run directory, as
// rundir lays it out.
func RankFile(runDir string, rank int) string { return rundir.Dir(runDir).RankMetrics(rank) }

// Writer appends metrics lines for one rank. Each line goes out in one write
// call, unbuffered, so a reader sees whole lines; a write that fails part way
// (a full disk) is cut back to where the line began, so that a line in the
// file is whole or absent. The methods are
// safe for concurrent use (the GPU sampler writes from its own goroutine).
// After the first write error every call returns that error.
type Writer struct {
	mu   sync.Mutex
	w    io.Writer
	c    io.Closer // nil when the caller owns w
	f    *os.File  // the file of a Writer from Create: a failed write is cut back
	path string
	buf  []byte
	err  error
	now  func() time.Time
}

// Create opens runDir/metrics/rank-NNNNN.jsonl for appending, creating the
// folders; a job that is requeued and resumes appends to the same file. A
// line that an earlier process left without its newline (it was killed while
// writing it) is removed first, so that the new lines do not stick to it.
func Create(runDir string, rank int) (*Writer, error) {
	if rank < 0 {
		return nil, fmt.Errorf("metrics: rank %d: must not be negative", rank)
	}
	path := RankFile(runDir, rank)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	// The files lie in the run dir: a link put in place of the folder or
	// of a rank file would have a resume cut and append to another file.
	if fi, err := os.Lstat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("metrics: %s is not a folder of the run dir (a symbolic link?): a run writes only inside its run dir; move it away", filepath.Dir(path))
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o644)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("metrics: %s is a symbolic link: a run writes only files inside its run dir; remove the link", path)
	}
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("metrics: %s is not a regular file: remove it", path)
	}
	if err := cutTornTail(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("metrics: %s: %w", path, err)
	}
	w := NewWriter(f)
	w.c, w.f, w.path = f, f, path
	return w, nil
}

// cutTornTail truncates f after its last newline.
func cutTornTail(f *os.File) error {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return err
	}
	buf := make([]byte, 64<<10)
	for end := st.Size(); end > 0; {
		start := max(0, end-int64(len(buf)))
		b := buf[:end-start]
		if _, err := f.ReadAt(b, start); err != nil {
			return err
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			if start+int64(i)+1 == st.Size() {
				return nil
			}
			return f.Truncate(start + int64(i) + 1)
		}
		end = start
	}
	return f.Truncate(0)
}

// NewWriter writes metrics lines to w; Close does not close w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, now: time.Now}
}

// Path is the file written by a Writer from Create, "" otherwise.
func (w *Writer) Path() string { return w.path }

// Run writes the run line. It sets info.V to Version and info.Start to now
// when zero. info.Config, when set, must be a JSON object (json.Marshal of
// the config.Config).
func (w *Writer) Run(info RunInfo) error {
	info.V = Version
	if info.Start == 0 {
		info.Start = w.ts()
	}
	if len(info.Config) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(info.Config, &obj); err != nil || obj == nil {
			return w.fail(errors.New("metrics: run line: config is not a JSON object"))
		}
	}
	info.FlopsPerToken = finite(info.FlopsPerToken)
	info.HardwareFlopsPerToken = finite(info.HardwareFlopsPerToken)
	info.PeakFlops = finite(info.PeakFlops)
	body, err := json.Marshal(info)
	if err != nil {
		return w.fail(fmt.Errorf("metrics: run line: %w", err))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], `{"type":"run",`...)
	b = append(b, body[1:]...)
	return w.writeLocked(b)
}

// Step writes a step line; s.TS is set to now when zero.
func (w *Writer) Step(s Step) error {
	if s.TS == 0 {
		s.TS = w.ts()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], `{"type":"step","step":`...)
	b = strconv.AppendInt(b, int64(s.Step), 10)
	b = appendInt(b, "epoch", int64(s.Epoch))
	b = appendFloat(b, "loss", s.Loss)
	b = appendFloat(b, "lr", s.LR)
	b = appendFloat(b, "grad_norm", s.GradNorm)
	b = appendInt(b, "tokens", s.Tokens)
	b = appendInt(b, "samples", s.Samples)
	b = appendFloat(b, "step_s", s.StepS)
	b = appendFloat(b, "comm_s", s.CommS)
	b = appendInt(b, "mem_bytes", s.MemBytes)
	b = appendInt(b, "mem_peak_bytes", s.MemPeakBytes)
	if s.HostSyncs > 0 {
		b = appendInt(b, "host_syncs", s.HostSyncs)
	}
	if s.BubbleTheory > 0 {
		b = appendFloat(b, "bubble", s.Bubble)
		b = appendFloat(b, "bubble_theory", s.BubbleTheory)
	}
	b = appendFloat(b, "ts", s.TS)
	b = append(b, '}')
	return w.writeLocked(b)
}

// Eval writes an eval line; e.TS is set to now when zero. Set e.Accuracy to
// math.NaN() for models without one.
func (w *Writer) Eval(e Eval) error {
	if e.TS == 0 {
		e.TS = w.ts()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], `{"type":"eval","step":`...)
	b = strconv.AppendInt(b, int64(e.Step), 10)
	b = appendFloat(b, "loss", e.Loss)
	b = appendFloat(b, "accuracy", e.Accuracy)
	b = appendFloat(b, "ts", e.TS)
	b = append(b, '}')
	return w.writeLocked(b)
}

// GPU writes a gpu line; g.TS is set to now when zero.
func (w *Writer) GPU(g GPUSample) error {
	if g.TS == 0 {
		g.TS = w.ts()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], `{"type":"gpu","index":`...)
	b = strconv.AppendInt(b, int64(g.Index), 10)
	b = appendInt(b, "mem_used_bytes", g.MemUsedBytes)
	b = appendInt(b, "mem_total_bytes", g.MemTotalBytes)
	b = appendFloat(b, "util_pct", g.UtilPct)
	b = appendFloat(b, "ts", g.TS)
	b = append(b, '}')
	return w.writeLocked(b)
}

// End writes the end line. An empty status means StatusCompleted when err is
// nil and StatusFailed otherwise; err's text goes into the line.
func (w *Writer) End(status string, err error, wall time.Duration) error {
	e := End{Status: status, WallS: wall.Seconds(), TS: w.ts()}
	if err != nil {
		e.Error = err.Error()
	}
	if e.Status == "" {
		e.Status = StatusCompleted
		if err != nil {
			e.Status = StatusFailed
		}
	}
	body, merr := json.Marshal(e)
	if merr != nil {
		return w.fail(fmt.Errorf("metrics: end line: %w", merr))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := append(w.buf[:0], `{"type":"end",`...)
	b = append(b, body[1:]...)
	return w.writeLocked(b)
}

// Close closes the file of a Writer from Create and returns the first write
// error, if any.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.err
	if w.c != nil {
		if cerr := w.c.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("metrics: %w", cerr)
		}
		w.c = nil
	}
	if w.err == nil {
		w.err = errors.New("metrics: writer closed")
	}
	return err
}

func (w *Writer) writeLocked(b []byte) error {
	b = append(b, '\n')
	w.buf = b
	if w.err != nil {
		return w.err
	}
	off := int64(-1)
	if w.f != nil {
		if o, err := w.f.Seek(0, io.SeekEnd); err == nil {
			off = o
		}
	}
	if n, err := w.w.Write(b); err != nil {
		w.err = fmt.Errorf("metrics: %w", err)
		if n > 0 && off >= 0 {
			if terr := w.f.Truncate(off); terr != nil {
				w.err = fmt.Errorf("metrics: %w (and the part written could not be cut back: %v)", err, terr)
			}
		}
	}
	return w.err
}

func (w *Writer) fail(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	return err
}

func (w *Writer) ts() float64 {
	return float64(w.now().UnixMicro()) / 1e6
}

func appendInt(b []byte, key string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

// appendFloat writes NaN and infinities as null: JSON has no such numbers.
func appendFloat(b []byte, key string, v float64) []byte {
	b = append(b, ',', '"')
	b = append(b, key...)
	b = append(b, '"', ':')
	return appendNumber(b, v)
}

// appendNumber writes v as JSON, null for NaN and infinities.
func appendNumber(b []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return append(b, "null"...)
	}
	// Like encoding/json: plain decimals, exponents only for the very small
	// and very large (lr 3e-05, not 0.00003).
	f := byte('f')
	if a := math.Abs(v); a != 0 && (a < 1e-4 || a >= 1e21) {
		f = 'e'
	}
	return strconv.AppendFloat(b, v, f, -1, 64)
}

func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// AppendEnd appends an end line saying err to rank's file in runDir, for a
// task that failed (interrupted: was stopped) before it could open the
// file to train: most often a rank whose peer failed first and aborted the
// world while it was joining it. A file it cannot write is left alone:
// the error reaches the task's stderr anyway.
func AppendEnd(runDir string, rank int, interrupted bool, err error, wall time.Duration) {
	w, werr := Create(runDir, rank)
	if werr != nil {
		return
	}
	status := ""
	if interrupted {
		status = StatusInterrupted
	}
	w.End(status, err, wall)
	w.Close()
}

// RelayedStop is the reason in the end line of a rank that stopped
// because another rank got the stop signal (slurm.StopReason); a run's
// summary names the reason of a rank that got the signal instead.
const RelayedStop = "stopped with the other ranks (another rank got the signal)"
