package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// stepBar is the --wait progress bar: optimizer steps done (from rank 0's
// metrics file, read incrementally) over the steps asked for, and the job
// state from the executor.
type stepBar struct {
	bar    *progressbar.ProgressBar
	path   string
	offset int64
	step   int
	closed bool
}

func newStepBar(r slurm.Run, tc train.Config) *stepBar {
	total := tc.Steps
	if total <= 0 {
		total = -1 // unknown until the run says: a spinner
	}
	return &stepBar{
		path: filepath.Join(r.Dir, "metrics", "rank-00000.jsonl"),
		bar: progressbar.NewOptions(total,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetVisibility(term.IsTerminal(int(os.Stderr.Fd()))),
			progressbar.OptionSetDescription("PENDING"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("steps"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetWidth(30),
		),
	}
}

// update reads the metrics lines written since the last call.
func (b *stepBar) update(j slurm.JobInfo) {
	if b.closed {
		return
	}
	b.readSteps()
	b.bar.Describe(fmt.Sprintf("%-9s", j.State))
	b.bar.Set(b.step)
}

func (b *stepBar) readSteps() {
	f, err := os.Open(b.path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(b.offset, io.SeekStart); err != nil {
		return
	}
	rd := bufio.NewReader(f)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return // a torn last line is read again next time
		}
		b.offset += int64(len(line))
		var l struct {
			Type string `json:"type"`
			Step int    `json:"step"`
		}
		if json.Unmarshal(line, &l) == nil && l.Type == "step" && l.Step > b.step {
			b.step = l.Step
		}
	}
}

func (b *stepBar) close() {
	if !b.closed {
		b.closed = true
		b.bar.Exit()
	}
}
