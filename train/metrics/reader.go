package metrics

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/BurntSushi/toml"
	"github.com/hpcrun/hpcrun/internal/rundir"
)

// Problem is a line the reader could not use; reading goes on past it.
type Problem struct {
	Path string // the rank file
	Line int    // 1-based line number
	Msg  string
}

// String is "path:line: message", the way compilers report.
func (p Problem) String() string {
	if p.Line == 0 {
		return p.Path + ": " + p.Msg
	}
	return fmt.Sprintf("%s:%d: %s", p.Path, p.Line, p.Msg)
}

// RankLog is what one rank file holds.
type RankLog struct {
	Rank  int    // from the file name rank-NNNNN.jsonl
	Path  string // the file
	Info  *RunInfo
	Steps []Step // in step order; a step written again (after a resume) replaces the old one
	Evals []Eval
	GPU   []GPUSample
	End   *End
	// PriorWallS is the wall time of the segments before the last (a run
	// resumed, or requeued, appends a new one to the same file), from their
	// end lines; Segments counts the segments read.
	PriorWallS float64
	Segments   int
	Lines      int  // lines read, the torn one included
	Torn       bool // the last line was incomplete and skipped: the rank is writing it now, or died
	// Unknown counts lines of a type this version does not know (skipped).
	Unknown  int
	Problems []Problem

	// onStep, when set, takes each step in file order instead of Steps
	// (ReadSummary's streaming reader).
	onStep func(Step)
}

// ReadRank reads one rank file.
func ReadRank(path string) (*RankLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l := &RankLog{Rank: rankOf(path), Path: path}
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		// Step lines are about 200 bytes: growing the slice by doubling
		// would copy it some twenty times over a long run.
		l.Steps = make([]Step, 0, st.Size()/180+16)
	}
	if err := l.read(f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// ParseRank reads rank file content from r; path names it in problems.
func ParseRank(r io.Reader, path string) (*RankLog, error) {
	l := &RankLog{Rank: rankOf(path), Path: path}
	if err := l.read(r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// maxLine bounds the lines the readers decode: a longer one (no line the
// writer makes; real lines are well under 64 KiB) is skipped as a problem,
// read in pieces and dropped, so that it costs no more memory than this.
const maxLine = 16 << 20

func (l *RankLog) read(r io.Reader) error {
	br := bufio.NewReaderSize(r, 256<<10)
	var long []byte   // a line longer than the buffer, being assembled
	skip := int64(-1) // bytes so far of a line past maxLine being dropped; -1: none
	for {
		chunk, err := br.ReadSlice('\n')
		if skip >= 0 {
			skip += int64(len(bytes.TrimSuffix(chunk, []byte{'\n'})))
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && err != io.EOF {
				return err
			}
			l.Lines++
			l.skipLong(skip)
			skip = -1
			if err == io.EOF {
				return nil
			}
			continue
		}
		if err == bufio.ErrBufferFull {
			if len(long)+len(chunk) > maxLine {
				skip, long = int64(len(long)+len(chunk)), nil
				continue
			}
			if cap(long)-len(long) < len(chunk) {
				long = slices.Grow(long, len(long)+len(chunk)) // doubling: append grows a large slice by a quarter
			}
			long = append(long, chunk...)
			continue
		}
		line := chunk
		if long != nil {
			line = append(long, chunk...)
			long = nil
		}
		if n := len(bytes.TrimSuffix(line, []byte{'\n'})); n > maxLine {
			l.Lines++
			l.skipLong(int64(n))
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
		if err == io.EOF {
			if len(bytes.TrimSpace(line)) > 0 {
				l.Lines++
				l.addLine(line, true)
			}
			return nil
		}
		if err != nil {
			return err
		}
		l.Lines++
		l.addLine(line[:len(line)-1], false)
	}
}

// skipLong records that line l.Lines, of n bytes (its newline not
// counted), is longer than maxLine and skipped.
func (l *RankLog) skipLong(n int64) {
	l.Problems = append(l.Problems, Problem{Path: l.Path, Line: l.Lines,
		Msg: fmt.Sprintf("%d bytes, longer than %d MiB: skipped", n, maxLine>>20)})
}

// addLine decodes one line; last says it had no newline after it.
func (l *RankLog) addLine(line []byte, last bool) {
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	if s, ok := parseStepFast(line); ok {
		l.addStep(s)
		return
	}
	l.addSlow(line, last)
}

// addSlow decodes a line the step fast path did not take, with
// encoding/json; last says it had no newline after it.
func (l *RankLog) addSlow(line []byte, last bool) {
	d, err := parseLineJSON(line)
	if err != nil {
		if last {
			// The writer ends every line with its newline in the same
			// write: a last line without one is being written or was cut.
			l.Torn = true
			return
		}
		if rest := wholeLineIn(line); rest != nil {
			// A fragment that an older writer left on a full disk, with
			// the next whole line stuck to it: keep the line.
			l.Problems = append(l.Problems, Problem{Path: l.Path, Line: l.Lines,
				Msg: fmt.Sprintf("%d bytes of a torn line skipped (%v)", len(line)-len(rest), err)})
			l.addLine(rest, last)
			return
		}
		l.Problems = append(l.Problems, Problem{Path: l.Path, Line: l.Lines, Msg: err.Error()})
		return
	}
	switch d.Type {
	case TypeStep:
		l.addStep(*d.Step)
	case TypeRun:
		if l.End != nil && l.End.WallS > 0 {
			l.PriorWallS += l.End.WallS
		}
		l.Info = d.Run
		l.End = nil // a resumed run is running again
		l.Segments++
	case TypeEval:
		l.Evals = append(l.Evals, *d.Eval)
	case TypeGPU:
		l.GPU = append(l.GPU, *d.GPU)
	case TypeEnd:
		l.End = d.End
	default:
		l.Unknown++
	}
}

// wholeLineIn finds, in a line that does not decode, the start of a line
// that does (every line the writer makes begins with {"type":), or nil.
func wholeLineIn(line []byte) []byte {
	start := []byte(`{"type":`)
	for i := 1; i < len(line); {
		j := bytes.Index(line[i:], start)
		if j < 0 {
			return nil
		}
		rest := line[i+j:]
		if _, ok := parseStepFast(rest); ok {
			return rest
		}
		if _, err := parseLineJSON(rest); err == nil {
			return rest
		}
		i += j + 1
	}
	return nil
}

// addStep appends a step. After a requeue the job resumes from a checkpoint
// and writes steps again: the later ones replace the earlier.
func (l *RankLog) addStep(s Step) {
	if l.onStep != nil {
		l.onStep(s)
		return
	}
	n := len(l.Steps)
	for n > 0 && l.Steps[n-1].Step >= s.Step {
		n--
	}
	l.Steps = append(l.Steps[:n], s)
}

func rankOf(path string) int {
	base := filepath.Base(path)
	if !strings.HasPrefix(base, "rank-") || !strings.HasSuffix(base, ".jsonl") {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(base, "rank-"), ".jsonl"))
	if err != nil {
		return -1
	}
	return n
}

// Meta is what meta.json says about a run; every field may be empty.
type Meta struct {
	ExecID     string `json:"execid"`
	JobID      string `json:"jobid"`
	Executor   string `json:"executor"`
	SubmitTime string `json:"submit_time"` // RFC 3339
	// Raw holds the whole file, for fields this package does not know.
	Raw map[string]any `json:"-"`
}

// PlanPeak is the peak FLOP/s of one device at the run's precision that
// the run's plan (hpcrun plan's, which submit and run keep in meta.json as
// "plan") priced its MFU at, and whether that plan was made for a GPU;
// peak is 0 without a plan or a peak.
func (m Meta) PlanPeak() (peak float64, cuda bool) {
	p, _ := m.Raw["plan"].(map[string]any)
	t, _ := p["time"].(map[string]any)
	d, _ := p["device"].(map[string]any)
	peak, _ = t["peak_flops"].(float64)
	cuda, _ = d["cuda"].(bool)
	return peak, cuda
}

// Run is everything recorded about one run.
type Run struct {
	ExecID string
	Dir    string
	Meta   Meta
	// TrainConfig is train.toml as a JSON object, nil when absent: the
	// config of a run whose ranks have not written their run line yet.
	TrainConfig json.RawMessage
	Ranks       []*RankLog // by rank
	// Problems are the lines that could not be read, in all rank files,
	// and files that could not be read at all (Line 0).
	Problems []Problem
}

// ErrNoRun is returned (wrapped) when a runs folder has no such execid.
var ErrNoRun = errors.New("no such run")

// ReadRun reads a run directory: meta.json when there, and every
// metrics/rank-*.jsonl, in parallel. A run without metrics yet (pending in
// the queue) reads as a Run with no ranks.
func ReadRun(dir string) (*Run, error) {
	run, paths, err := openRun(dir)
	if err != nil {
		return nil, err
	}
	logs := make([]*RankLog, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			logs[i], errs[i] = ReadRank(p)
		}()
	}
	wg.Wait()
	for i, l := range logs {
		if errs[i] != nil {
			run.Problems = append(run.Problems, Problem{Path: paths[i], Msg: errs[i].Error()})
			continue
		}
		if l.Rank < 0 {
			run.Problems = append(run.Problems, Problem{Path: paths[i], Msg: "file name is not rank-NNNNN.jsonl, ignored"})
			continue
		}
		run.Ranks = append(run.Ranks, l)
		run.Problems = append(run.Problems, l.Problems...)
	}
	sort.Slice(run.Ranks, func(i, j int) bool { return run.Ranks[i].Rank < run.Ranks[j].Rank })
	return run, nil
}

// readRunFiles starts a Run from the files beside the metrics: meta.json and
// train.toml, both optional.
func readRunFiles(dir string) *Run {
	run := &Run{ExecID: filepath.Base(dir), Dir: dir}
	if b, err := os.ReadFile(rundir.Dir(dir).Meta()); err == nil {
		if err := json.Unmarshal(b, &run.Meta); err != nil {
			run.Problems = append(run.Problems, Problem{Path: rundir.Dir(dir).Meta(), Msg: "not valid JSON, ignored: " + jsonError(err).Error()})
		}
		_ = json.Unmarshal(b, &run.Meta.Raw)
		if run.Meta.ExecID != "" {
			run.ExecID = run.Meta.ExecID
		}
	}
	if b, err := os.ReadFile(rundir.Dir(dir).Config()); err == nil {
		var m map[string]any
		if _, err := toml.Decode(string(b), &m); err != nil {
			run.Problems = append(run.Problems, Problem{Path: rundir.Dir(dir).Config(), Msg: "not valid TOML, ignored: " + err.Error()})
		} else if j, err := json.Marshal(m); err == nil {
			run.TrainConfig = j
		}
	}
	return run
}
