package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/hpcrun/hpcrun/internal/rundir"
)

// Follower reads a run directory again and again as its job writes it,
// reading only what was appended to each rank file since the last Poll.
// A line without its newline yet is kept for the next Poll, not reported.
type Follower struct {
	dir   string
	files map[string]*followed
}

type followed struct {
	log     *RankLog
	off     int64
	partial []byte
}

// NewFollower follows the run in dir.
func NewFollower(dir string) *Follower {
	return &Follower{dir: dir, files: map[string]*followed{}}
}

// Poll reads what is new and returns the run as it stands. The RankLogs are
// the Follower's own and change at the next Poll.
func (f *Follower) Poll() (*Run, error) {
	if _, err := os.Stat(f.dir); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", f.dir, ErrNoRun)
		}
		return nil, err
	}
	run := readRunFiles(f.dir)
	paths, err := rundir.Dir(f.dir).MetricsFiles()
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		fl := f.files[p]
		if fl == nil {
			if rankOf(p) < 0 {
				continue
			}
			fl = &followed{log: &RankLog{Rank: rankOf(p), Path: p}}
			f.files[p] = fl
		}
		if err := fl.poll(); err != nil {
			run.Problems = append(run.Problems, Problem{Path: p, Msg: err.Error()})
		}
		run.Ranks = append(run.Ranks, fl.log)
		run.Problems = append(run.Problems, fl.log.Problems...)
	}
	sort.Slice(run.Ranks, func(i, j int) bool { return run.Ranks[i].Rank < run.Ranks[j].Rank })
	return run, nil
}

func (fl *followed) poll() error {
	file, err := os.Open(fl.log.Path)
	if err != nil {
		return err
	}
	defer file.Close()
	if st, err := file.Stat(); err == nil && st.Size() < fl.off {
		// Truncated or replaced: start over.
		*fl = followed{log: &RankLog{Rank: fl.log.Rank, Path: fl.log.Path}}
	}
	if _, err := file.Seek(fl.off, io.SeekStart); err != nil {
		return err
	}
	data, err := io.ReadAll(io.LimitReader(file, maxLine*4))
	if err != nil {
		return err
	}
	fl.off += int64(len(data))
	if len(fl.partial) > 0 {
		data = append(fl.partial, data...)
		fl.partial = nil
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(data) > maxLine {
				fl.log.Lines++
				fl.log.Problems = append(fl.log.Problems, Problem{Path: fl.log.Path, Line: fl.log.Lines, Msg: "line longer than 16 MiB, skipped"})
				return nil
			}
			fl.partial = append([]byte(nil), data...)
			fl.log.Torn = true
			return nil
		}
		fl.log.Lines++
		fl.log.addLine(data[:i], false)
		data = data[i+1:]
	}
	fl.log.Torn = false
	return nil
}
