package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// ReadSummary reads the run in dir and summarizes it as Summarize does a
// run read by ReadRun, in one pass over its rank files that keeps none of
// their steps: blocks of lines are parsed on every core, and the ranks'
// steps are joined by step number as they stream by. It keeps one float64
// per step (for the step-time percentiles) and points of the step curves:
// none (NoCurves), all (AllPoints, as Summarize), or when points > 0 at most
// 2*points+1 of them, evenly spaced over the steps, the last included.
//
// A step written again after a resume replaces the old one, as in ReadRun;
// a run with a resume is read twice (the first pass, meeting the resume,
// reads on only to find where every rank resumed; the second joins).
func ReadSummary(dir string, points int) (Summary, Curves, error) {
	run, paths, err := openRun(dir)
	if err != nil {
		return Summary{}, Curves{}, err
	}
	var files []*rankFile
	fileErr := map[string]error{}
	for _, p := range paths {
		if rankOf(p) >= 0 {
			files = append(files, &rankFile{path: p})
		}
	}
	// By rank, as ReadRun orders the ranks: the join sums in this order.
	sort.SliceStable(files, func(i, j int) bool { return rankOf(files[i].path) < rankOf(files[j].path) })
	guessTPZero(run, files)
	// A pass is repeated when a rank file cannot be read (it leaves the
	// run), when a rank resumed, and when the guess of tp_rank 0 was wrong;
	// the last two only a few times.
	for again := 0; again < 4; {
		seen, agg, logs, err := joinFiles(files, points)
		var rerr *rankError
		switch {
		case errors.As(err, &rerr):
			// As ReadRun: a file that cannot be read is a problem, and not
			// a rank of the run.
			fileErr[rerr.f.path] = rerr.err
			files = slices.DeleteFunc(files, func(f *rankFile) bool { return f == rerr.f })
			continue
		case errors.Is(err, errResumed):
			// joinFiles found where every rank resumed: join again.
			again++
			continue
		case err != nil:
			return Summary{}, Curves{}, err
		}
		run.Ranks = logs
		if tp0 := tpZero(run); !slices.Equal(tp0, tpOf(files)) {
			// The run lines say otherwise than the guess: join again.
			for i, f := range files {
				f.tp0 = tp0[i]
			}
			again++
			continue
		}
		addFileProblems(run, paths, fileErr)
		s, c := summarize(run, seen, agg)
		return s, c, nil
	}
	// Files that keep changing under the reader (resumed again between
	// passes): read them whole.
	full, err := ReadRun(dir)
	if err != nil {
		return Summary{}, Curves{}, err
	}
	s, c := Summarize(full)
	return s, c, nil
}

// openRun checks dir, reads the files beside the metrics and lists the rank
// files: the start of ReadRun and ReadSummary.
func openRun(dir string) (*Run, []string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%s: %w", dir, ErrNoRun)
		}
		return nil, nil, err
	}
	if !st.IsDir() {
		return nil, nil, fmt.Errorf("%s is not a run directory", dir)
	}
	run := readRunFiles(dir)
	paths, err := rundir.Dir(dir).MetricsFiles()
	if err != nil {
		return nil, nil, err
	}
	return run, paths, nil
}

// addFileProblems adds the problems of the rank files to run's, in the
// order ReadRun lists them: by file, then by line.
func addFileProblems(run *Run, paths []string, fileErr map[string]error) {
	byPath := map[string]*RankLog{}
	for _, l := range run.Ranks {
		byPath[l.Path] = l
	}
	for _, p := range paths {
		switch l := byPath[p]; {
		case fileErr[p] != nil:
			run.Problems = append(run.Problems, Problem{Path: p, Msg: fileErr[p].Error()})
		case rankOf(p) < 0:
			run.Problems = append(run.Problems, Problem{Path: p, Msg: "file name is not rank-NNNNN.jsonl, ignored"})
		case l != nil:
			run.Problems = append(run.Problems, l.Problems...)
		}
	}
}

// rankFile is one rank file across the passes of ReadSummary.
type rankFile struct {
	path string
	tp0  bool // counts its replica's samples, tokens and loss
	// cuts, once a pass has met a resume: a step of the file's k-th
	// increasing run of steps is kept when it is below cuts[k], the lowest
	// first step of the later runs; nil before (a resume then stops the
	// join).
	cuts []int
}

// rankError is a rank file that could not be read.
type rankError struct {
	f   *rankFile
	err error
}

func (e *rankError) Error() string { return e.err.Error() }

// errResumed stops a join that meets a resumed rank it has no cuts for.
var errResumed = errors.New("a rank resumed")

func tpOf(files []*rankFile) []bool {
	out := make([]bool, len(files))
	for i, f := range files {
		out[i] = f.tp0
	}
	return out
}

// guessTPZero guesses which ranks are tp_rank 0 before reading them, from
// each file's first line when it is a run line, else from the rank and
// train.toml's tp. The join checks the guess against the run lines it
// read.
func guessTPZero(run *Run, files []*rankFile) {
	tp := max(runConfig(run, nil).TP, 1)
	for _, f := range files {
		f.tp0 = rankOf(f.path)%tp == 0
		if info := firstRunLine(f.path); info != nil {
			f.tp0 = info.TPRank == 0 && info.PPRank == 0
		}
	}
}

// firstRunLine is the file's first line as a run line, nil if it is not one.
func firstRunLine(path string) *RunInfo {
	fh, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer fh.Close()
	line, err := bufio.NewReaderSize(io.LimitReader(fh, 1<<20), 64<<10).ReadSlice('\n')
	if err != nil {
		return nil
	}
	l, err := ParseLine(bytes.TrimSpace(line))
	if err != nil {
		return nil
	}
	return l.Run
}

// Sizes of the blocks a pass reads: a block is parsed by one worker; each
// rank has up to blocksInFlight of them between its reader and the join,
// blockBudget bytes over all ranks.
var (
	blockMax    = 1 << 20
	blockMin    = 64 << 10
	blockBudget = 32 << 20
)

const blocksInFlight = 4

// A pass reads every rank file once, in blocks of whole lines: a reader
// goroutine per file, a worker per core parsing the step lines of a block,
// and the caller's goroutine taking each file's blocks in order.
type pass struct {
	stop  chan struct{}
	work  chan *block
	size  int // block size
	wg    sync.WaitGroup
	ended sync.Once
}

// lineKind is how a worker left a line.
type lineKind uint8

const (
	lineBlank lineKind = iota // only spaces
	lineStep                  // a step line the fast path decoded
	lineOther                 // anything else: the taker decodes it
	lineLong                  // longer than maxLine: skipped
)

// lineRec is one line of a block: start and end bound it in block.buf
// (without its newline).
type lineRec struct {
	kind       lineKind
	start, end int
	step       Step
}

// block is consecutive whole lines of a file, or the reader's error.
type block struct {
	buf  []byte
	full int  // buf[:full] are newline-terminated lines
	last bool // buf[full:] is the file's last line, without a newline
	// long, when above 0, is the size of a line longer than maxLine before
	// buf's, which the reader dropped in pieces.
	long int64
	err  error
	recs []lineRec
	done chan struct{} // closed once recs are filled
}

func newPass(files int) *pass {
	size := min(blockMax, max(blockMin, blockBudget/max(files*blocksInFlight, 1)))
	p := &pass{stop: make(chan struct{}), work: make(chan *block, 2*runtime.GOMAXPROCS(0)), size: size}
	for range runtime.GOMAXPROCS(0) {
		go func() {
			for b := range p.work {
				b.parse()
				close(b.done)
			}
		}()
	}
	return p
}

// end stops the readers and then the workers.
func (p *pass) end() {
	p.ended.Do(func() {
		close(p.stop)
		go func() {
			p.wg.Wait()
			close(p.work)
		}()
	})
}

// parse classifies the block's whole lines, decoding step lines.
func (b *block) parse() {
	buf := b.buf[:b.full]
	// Step lines are about 200 bytes: size the records once, not by doubling.
	if want := len(buf)/150 + 8; cap(b.recs) < want {
		b.recs = make([]lineRec, 0, want)
	}
	b.recs = b.recs[:0]
	for pos := 0; pos < len(buf); {
		n := bytes.IndexByte(buf[pos:], '\n')
		r := lineRec{start: pos, end: pos + n}
		line := buf[r.start:r.end]
		if n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		switch {
		case n > maxLine:
			r.kind = lineLong
		case len(line) > 0 && line[0] == '{':
			r.kind = lineOther
			if s, ok := parseStep(line, false); ok {
				r.kind, r.step = lineStep, s
			}
		case len(bytes.TrimSpace(line)) == 0:
			r.kind = lineBlank
		default:
			r.kind = lineOther
		}
		b.recs = append(b.recs, r)
		pos += n + 1
	}
}

// fileReader is one rank file in a pass: its reader goroutine sends blocks
// in file order; the taker's side decodes what is not a step and yields
// the steps.
type fileReader struct {
	f      *rankFile
	p      *pass
	size   int64 // bytes read: the file's size when opened
	order  chan *block
	free   chan *block
	log    *RankLog
	cur    *block
	i      int
	tail   bool // cur's last line is taken
	failed error
	// steps
	pending  []Step // steps the slow path decoded, not yet yielded
	prev     int    // step number of the previous step line
	any      bool   // a step line was seen
	seg      int    // index of the current increasing run of steps
	collect  bool   // only record the runs, yield nothing
	segFirst []int  // first step of each run
}

func (p *pass) open(f *rankFile) (*fileReader, error) {
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, &rankError{f, err}
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, &rankError{f, err}
	}
	r := &fileReader{f: f, p: p, order: make(chan *block, blocksInFlight), free: make(chan *block, blocksInFlight),
		log: &RankLog{Rank: rankOf(f.path), Path: f.path}, size: st.Size()}
	r.log.onStep = func(s Step) { r.pending = append(r.pending, s) }
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer fh.Close()
		defer close(r.order)
		r.read(fh, r.size)
	}()
	return r, nil
}

// read sends the first size bytes of fh as blocks of whole lines; the
// file's last bytes, without a newline, end the last block. A block reads
// on until it holds a newline: a line longer than a block grows one block,
// not a copy a piece. A line that grows past maxLine before its newline is
// read on in pieces and dropped: the next block sent says how long it was.
func (r *fileReader) read(fh *os.File, size int64) {
	var carry []byte
	made := 0
	skip := int64(-1) // bytes so far of a line past maxLine being dropped; -1: none
	for off := int64(0); ; {
		var b *block
		select {
		case b = <-r.free:
		default:
			if made < blocksInFlight {
				made++
				// A small file needs no block of the pass's full size.
				b = &block{buf: make([]byte, 0, int(min(int64(r.p.size), size))+4096)}
			} else {
				select {
				case b = <-r.free:
				case <-r.p.stop:
					return
				}
			}
		}
		b.buf = append(b.buf[:0], carry...)
		b.err, b.long, b.last = nil, 0, false
		for {
			start := len(b.buf)
			n := int(min(int64(r.p.size), size-off))
			if cap(b.buf)-start < n {
				b.buf = slices.Grow(b.buf, max(n, start)) // doubling, for a long line
			}
			b.buf = b.buf[:start+n]
			if n > 0 {
				if _, err := fh.ReadAt(b.buf[start:], off); err != nil {
					b.err = err
					break
				}
			}
			off += int64(n)
			if skip >= 0 {
				// buf holds only the long line's next piece.
				j := bytes.IndexByte(b.buf, '\n')
				if j < 0 {
					skip += int64(len(b.buf))
					b.buf = b.buf[:0]
					if off < size {
						select {
						case <-r.p.stop:
							return
						default:
						}
						continue
					}
					b.long, skip = skip, -1 // the file ends in the long line
					break
				}
				b.long, skip = skip+int64(j), -1
				b.buf = b.buf[:copy(b.buf, b.buf[j+1:])]
				start = 0
			}
			if off >= size || bytes.IndexByte(b.buf[start:], '\n') >= 0 {
				break
			}
			if len(b.buf) > maxLine {
				// No newline in buf: its start is a line too long to keep.
				skip = int64(len(b.buf))
				b.buf = b.buf[:0]
				if b.long > 0 {
					break // send the block that says the previous line was skipped
				}
			}
		}
		if b.err == nil {
			i := bytes.LastIndexByte(b.buf, '\n')
			b.full = i + 1
			if off >= size {
				b.last = i+1 < len(b.buf)
				carry = carry[:0]
			} else {
				carry = append(carry[:0], b.buf[i+1:]...)
			}
		}
		b.done = make(chan struct{})
		if b.err != nil {
			close(b.done)
		} else {
			select {
			case r.p.work <- b:
			case <-r.p.stop:
				return
			}
		}
		select {
		case r.order <- b:
		case <-r.p.stop:
			return
		}
		if b.err != nil || off >= size {
			return
		}
	}
}

// next yields the file's next step that no resume replaced.
func (r *fileReader) next() (Step, bool) {
	for {
		for len(r.pending) > 0 {
			s := r.pending[0]
			r.pending = r.pending[1:]
			if len(r.pending) == 0 {
				r.pending = r.pending[:0:0]
			}
			if r.keep(s) {
				return s, true
			}
			if r.failed != nil {
				return Step{}, false
			}
		}
		if r.failed != nil {
			return Step{}, false
		}
		if r.cur == nil {
			b, ok := <-r.order
			if !ok {
				return Step{}, false
			}
			<-b.done
			if b.err != nil {
				r.fail(b.err)
				return Step{}, false
			}
			r.cur, r.i, r.tail = b, 0, false
			if b.long > 0 {
				r.log.Lines++
				r.log.skipLong(b.long)
			}
		}
		b := r.cur
		for r.i < len(b.recs) && len(r.pending) == 0 && r.failed == nil {
			rec := &b.recs[r.i]
			r.i++
			r.log.Lines++
			switch rec.kind {
			case lineStep:
				if r.keep(rec.step) {
					return rec.step, true
				}
			case lineLong:
				r.log.skipLong(int64(rec.end - rec.start))
			case lineOther:
				line := b.buf[rec.start:rec.end]
				if n := len(line); n > 0 && line[n-1] == '\r' {
					line = line[:n-1]
				}
				if len(bytes.TrimSpace(line)) > 0 {
					r.log.addSlow(line, false)
				}
			}
		}
		if r.i < len(b.recs) || len(r.pending) > 0 || r.failed != nil {
			continue
		}
		if b.last && !r.tail {
			r.tail = true
			if line := b.buf[b.full:]; len(line) > maxLine {
				r.log.Lines++
				r.log.skipLong(int64(len(line)))
				continue
			} else if len(bytes.TrimSpace(line)) > 0 {
				r.log.Lines++
				r.log.addLine(line, true)
				continue
			}
		}
		r.cur = nil
		select {
		case r.free <- b:
		default:
		}
	}
}

func (r *fileReader) err() error { return r.failed }

// fail stops the file at err, which is what ReadRank returns for it.
func (r *fileReader) fail(err error) {
	r.failed = &rankError{r.f, fmt.Errorf("%s: %w", r.f.path, err)}
}

// keep applies the resume rule to the step lines in file order: a step
// whose number is not above the previous one starts a new increasing run,
// and replaces the steps from its number on.
func (r *fileReader) keep(s Step) bool {
	if !r.any || s.Step <= r.prev {
		if r.any {
			r.seg++
		}
		r.segFirst = append(r.segFirst, s.Step)
	}
	r.any, r.prev = true, s.Step
	if r.collect {
		return false
	}
	if r.seg >= max(len(r.f.cuts), 1) {
		r.failed = errResumed
		return false
	}
	return r.f.cuts == nil || s.Step < r.f.cuts[r.seg]
}

// joinFiles runs one pass over the files and joins their steps.
func joinFiles(files []*rankFile, points int) ([]rankSeen, jobAgg, []*RankLog, error) {
	p := newPass(len(files))
	defer p.end()
	its := make([]stepIter, len(files))
	readers := make([]*fileReader, len(files))
	tp0 := make([]bool, len(files))
	for i, f := range files {
		r, err := p.open(f)
		if err != nil {
			return nil, jobAgg{}, nil, err
		}
		its[i], readers[i], tp0[i] = r, r, f.tp0
	}
	// Step lines are about 200 bytes: room for the step times of the
	// largest file at 128 bytes a line, which costs memory only where
	// written.
	var most int64
	for _, r := range readers {
		most = max(most, r.size)
	}
	seen, agg, err := join(its, tp0, points, int(most/128))
	if errors.Is(err, errResumed) {
		if ferr := findResumes(readers); ferr != nil {
			err = ferr
		}
	}
	if err != nil {
		return nil, agg, nil, err
	}
	logs := make([]*RankLog, len(files))
	for i, r := range readers {
		r.log.onStep = nil
		logs[i] = r.log
	}
	return seen, agg, logs, nil
}

// findResumes reads the rest of every file of a join stopped by a resume,
// recording the runs of steps, and sets the files' cuts.
func findResumes(readers []*fileReader) error {
	errs := make([]error, len(readers))
	var wg sync.WaitGroup
	for i, r := range readers {
		if r.failed == errResumed {
			r.failed = nil
		}
		r.collect = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, ok := r.next(); !ok {
					break
				}
			}
			errs[i] = r.err()
			cuts := make([]int, max(len(r.segFirst), 1))
			low := math.MaxInt
			for k := len(cuts) - 1; k >= 0; k-- {
				cuts[k] = low
				if k < len(r.segFirst) {
					low = min(low, r.segFirst[k])
				}
			}
			r.f.cuts = cuts
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
